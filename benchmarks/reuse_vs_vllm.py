"""Does ``kvbench reuse``'s simulated prefix hit rate agree with vLLM's own prefix cache on the same trace?

A hash-id trace (Mooncake's conversation excerpt shipped with kvbench by default), scaled down so a CPU runs it
(prompt lengths and the trace's block divided by ``--shrink``, outputs capped at ``--max-output`` tokens, the
first ``--requests`` requests, arrival times times ``--time-scale``), is replayed over HTTP at its arrival
times against a vLLM CPU server started here on 127.0.0.1, once per KV size (``--kv-cache-memory-bytes``,
``--kv-blocks`` blocks each, prefix caching on, a fresh server per size so every size starts empty). The
server's hit rate is its own counters' (``vllm:prefix_cache_hits_total / queries_total``, and the per-request
``usage.prompt_tokens_details.cached_tokens`` beside it); kvbench's is the same trace, the same token ids and
the server's block count (``vllm:cache_config_info``, less the null block) through
:func:`kvbench.engine.reuse_sim.simulate`, with a step time fitted to the server's latencies. Goal: within 3
percentage points at every size.

With ``--groups G`` the trace is synthetic instead: ``--requests`` requests in G groups sharing a prefix of
``--prefix-len`` tokens, each with ``--suffix-len`` of its own, Poisson arrivals at ``--rate`` per second; KV sizes
around the G prefixes' blocks then decide how many groups stay cached, which is where eviction order shows.

The model is a small random Llama made here (no download, no tokenizer: prompts are token ids).

    python benchmarks/reuse_vs_vllm.py --vllm-python /path/to/vllm-venv/bin/python [--kv-blocks 300,800,2000]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

from kvbench.endpoint.trace_replay import replay_trace
from kvbench.engine.reuse_sim import ChainedTrace, simulate
from kvbench.engine.timing import UniformTiming
from kvbench.results.servers import read_states
from kvbench.workload.prefix_trace import PrefixTrace, read_prefix_trace, resolve_trace, shared_prefix_trace

VOCAB = 4096
BLOCK = 32  # vLLM's CPU attention takes block sizes that are multiples of 32
LAYERS, KV_HEADS, HEAD_DIM = 2, 1, 64
BLOCK_BYTES = 2 * LAYERS * KV_HEADS * HEAD_DIM * 4 * BLOCK  # float32 K and V of one block, every layer


def tiny_llama(folder: Path) -> Path:
    """A two-layer random Llama (float32), saved as a checkpoint vLLM loads."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=LAYERS,
        num_attention_heads=2,
        num_key_value_heads=KV_HEADS,
        max_position_embeddings=16384,
        torch_dtype="float32",
    )
    LlamaForCausalLM(config).save_pretrained(folder, safe_serialization=True)
    return folder


def shrunk(trace: PrefixTrace, shrink: int, requests: int, max_len: int, time_scale: float) -> PrefixTrace:
    """Lengths and the block divided by ``shrink`` (each prompt keeps its number of hash ids), the requests that
    fit ``max_len`` with their output, the first ``requests`` of them."""
    if trace.block_size % shrink:
        raise SystemExit(f"--shrink {shrink} does not divide the trace's block of {trace.block_size}")
    kept = []
    for request in trace.requests:
        length = -(-request.input_len // shrink)
        if length + 1 > max_len:
            continue
        kept.append(replace(request, input_len=length))
        if len(kept) == requests:
            break
    return replace(trace, requests=tuple(kept), block_size=trace.block_size // shrink).subset().scaled(time_scale)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as answer:  # noqa: S310 (127.0.0.1 only)
        return answer.read().decode()


class Server:
    """``python -m vllm.entrypoints.openai.api_server`` on 127.0.0.1 in its own session."""

    def __init__(self, python: str, model: Path, kv_bytes: int, max_len: int, log: Path) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--dtype", "float32", "--enforce-eager", "--skip-tokenizer-init"]
        command += ["--max-model-len", str(max_len), "--block-size", str(BLOCK), "--enable-prefix-caching"]
        command += ["--kv-cache-memory-bytes", str(kv_bytes), "--enable-prompt-tokens-details"]
        command += ["--served-model-name", "tiny", "--max-num-seqs", "64"]
        env = {key: value for key, value in os.environ.items() if key != "VLLM_CPU_KVCACHE_SPACE"}
        with open(log, "wb") as out:
            self.process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True, cwd=log.parent
            )
        self.log = log

    def wait(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                errors = [line for line in self.log.read_text().splitlines() if "Error" in line]
                raise SystemExit(f"vLLM exited with {self.process.returncode}: {errors[-1] if errors else self.log}")
            try:
                _get(f"{self.base}/health")
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise SystemExit(f"vLLM did not start in {timeout_s:.0f} s; its log: {self.log}") from None
                time.sleep(1)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


def measure(python: str, model: Path, trace: PrefixTrace, kv_blocks: int, max_len: int, cap: int, work: Path) -> dict:
    server = Server(python, model, kv_blocks * BLOCK_BYTES, max_len, work / f"vllm-{kv_blocks}.log")
    try:
        server.wait()
        replayed = replay_trace(server.base, trace, VOCAB, "tiny", max_tokens=cap)
        state = read_states(_get(f"{server.base}/metrics"))[0]
    finally:
        server.stop()
    failed = [r for r in replayed if r.latency_s is None]
    if failed:
        raise SystemExit(f"{len(failed)} requests failed, e.g. {failed[0].error}")
    blocks = int(state.total_blocks or 0)
    latencies = [r.latency_s for r in replayed if r.latency_s is not None]
    step = statistics.median(latencies) / (cap + 1)
    outcome = simulate(ChainedTrace.of(trace), BLOCK, blocks, UniformTiming(step), 64)
    reported = [r.cached_tokens for r in replayed]
    per_request = (
        100.0 * sum(c for c in reported if c is not None) / sum(r.input_len for r in trace.requests)
        if all(c is not None for c in reported)
        else None
    )
    vllm_pct = 100.0 * (state.prefix_hits or 0) / state.prefix_queries if state.prefix_queries else None
    kvbench_pct = 100.0 * outcome.hit_rate
    return {
        "kv_blocks_asked": kv_blocks,
        "vllm_blocks": blocks,
        "vllm_hit_rate_pct": vllm_pct,
        "vllm_per_request_pct": per_request,
        "kvbench_hit_rate_pct": kvbench_pct,
        "difference_points": None if vllm_pct is None else kvbench_pct - vllm_pct,
        "prompt_tokens": sum(r.input_len for r in trace.requests),
        "vllm_prompt_tokens": state.prefix_queries,
        "median_latency_s": statistics.median(latencies),
        "kvbench_evicted_blocks": outcome.evicted_blocks,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", required=True, help="a Python that imports vllm (vllm-cpu)")
    parser.add_argument("--trace", default="mooncake-conversation-1k")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--shrink", type=int, default=8, help="divide prompt lengths and the trace block by this")
    parser.add_argument("--max-output", type=int, default=4)
    parser.add_argument("--max-len", type=int, default=4096)
    parser.add_argument("--time-scale", type=float, default=0.3)
    parser.add_argument("--kv-blocks", default="300,800,2000", help=f"KV sizes, in blocks of {BLOCK} tokens")
    parser.add_argument("--groups", type=int, default=0, help="a synthetic shared-prefix trace of this many groups")
    parser.add_argument("--prefix-len", type=int, default=1024)
    parser.add_argument("--suffix-len", type=int, default=128)
    parser.add_argument("--rate", type=float, default=5.0)
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    if args.groups:
        trace = shared_prefix_trace(
            args.groups, args.requests, args.prefix_len, args.suffix_len, args.max_output, args.rate, 0, BLOCK
        )
    else:
        full = read_prefix_trace(resolve_trace(args.trace))
        trace = shrunk(full, args.shrink, args.requests, args.max_len, args.time_scale)
    with tempfile.TemporaryDirectory(prefix="kvbench-reuse-vllm-") as folder:
        work = Path(folder)
        model = tiny_llama(work / "model")
        rows = []
        for blocks in (int(v) for v in args.kv_blocks.split(",")):
            row = measure(args.vllm_python, model, trace, blocks, args.max_len, args.max_output, work)
            rows.append(row)
            if not args.json:
                print(json.dumps(row), file=sys.stderr)
    if args.json:
        print(json.dumps({"requests": len(trace.requests), "trace_block": trace.block_size, "rows": rows}))
        return
    print(
        f"{len(trace.requests)} requests over {trace.duration_s:.0f} s, trace block {trace.block_size} tokens, "
        f"KV block {BLOCK}; `{' '.join(sys.argv)}`"
    )
    print("| KV blocks (vLLM) | vLLM hit rate (counters) | vLLM (per request) | kvbench | difference |")
    print("|---|---|---|---|---|")
    for row in rows:
        per_request = row["vllm_per_request_pct"]
        print(
            f"| {row['vllm_blocks']:,} | {row['vllm_hit_rate_pct']:.2f}% | "
            f"{'-' if per_request is None else f'{per_request:.2f}%'} | {row['kvbench_hit_rate_pct']:.2f}% | "
            f"{row['difference_points']:+.2f} points |"
        )


if __name__ == "__main__":
    main()
