"""A trace replayed on a server, beside what kvbench's simulation of the same trace predicts for that server.

The same hash-id trace, the same synthesised token ids, and the server's own KV block count and block size (from
its ``/metrics``) go through :func:`kvbench.engine.reuse_sim.simulate`, with every step taking the time the
server's requests took per token; the measured hit rate and the predicted one side by side. A server far below
the prediction is worth a look (its scheduler, its configuration, or a cache shared with others).
"""

from __future__ import annotations

import statistics
from typing import Any

from kvbench.endpoint.run_point import EndpointPoint
from kvbench.engine.reuse_sim import ChainedTrace, simulate
from kvbench.engine.timing import UniformTiming
from kvbench.workload.prefix_trace import PrefixTrace

MAX_RUNNING = 256  # vLLM's default --max-num-seqs: the server's own is not exposed
MORE_MEMORY = (2, 4, 8)  # the server's block count times these: what more KV memory would keep


def trace_replay_figures(trace: PrefixTrace, measured: EndpointPoint) -> dict[str, Any]:
    """The trace (its source, requests, span) and the hit rate kvbench predicts for the server (None, with the
    reason, where the server does not expose its block count and block size)."""
    out: dict[str, Any] = {
        "source": trace.source,
        "requests": len(trace.requests),
        "duration_s": trace.duration_s,
        "trace_block_size": trace.block_size,
        "predicted_hit_rate": None,
        "predicted_with_more_blocks": [],  # [blocks, hit rate] at 2x, 4x, 8x the server's KV blocks
        "prediction": None,
    }
    states = [state for scrape in measured.scrapes if scrape.error is None for state in scrape.states]
    blocks = next((s.total_blocks for s in reversed(states) if s.total_blocks), None)
    block_size = next((s.block_size for s in reversed(states) if s.block_size), None)
    done = [r for r in measured.records if r.ok and r.latency is not None and r.output_tokens]
    if not blocks or not block_size or not done:
        out["prediction"] = "the server exposes no KV block count and block size, or no request completed"
        return out
    step_s = statistics.median(r.latency / (r.output_tokens + 1) for r in done if r.latency and r.output_tokens)
    chained, timing = ChainedTrace.of(trace), UniformTiming(step_s)
    out["predicted_hit_rate"] = simulate(chained, int(block_size), int(blocks), timing, MAX_RUNNING).hit_rate
    out["predicted_with_more_blocks"] = [
        [int(blocks) * k, simulate(chained, int(block_size), int(blocks) * k, timing, MAX_RUNNING).hit_rate]
        for k in MORE_MEMORY
    ]
    out["prediction"] = (
        f"kvbench's simulation of the trace on {int(blocks):,} blocks of {int(block_size)} tokens, every step "
        f"{step_s * 1000:.1f} ms (the server's median time per token)"
    )
    return out
