"""What the engine process reports of itself, and the same figures in the front end's Prometheus series.

The engine process sends its counts with its step messages (at most every few milliseconds while stepping, and
whenever it goes idle): the KV pool's blocks, the online fragmentation, the requests running and waiting, and its
running totals (preemptions, finished, aborted, tokens out, prompt tokens prefilled, prefix-cache queries and hits)
with the block allocation latencies timed since the last report. The front end keeps the newest as an
:class:`EngineStats` and feeds ``KvMetrics``' series from it, so ``/metrics`` answers at once from the front end,
with the series ``sweep --metrics-port`` serves, however long the engine's current step takes.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec

from kvbench.engine.step_totals import PHASES, StepTotals
from kvbench.measure.exporter import KvMetrics


class EngineStats(msgspec.Struct, frozen=True):
    """The engine's state at its last report; the totals count from the engine's start (a JSON object in the
    engine's messages)."""

    used: int = 0  # KV blocks held by live requests
    free: int = 0
    capacity: int = 0
    block_size: int = 0  # tokens per block
    fragmentation: float = 0.0
    running: int = 0
    waiting: int = 0
    preemptions: int = 0
    finished: int = 0
    aborted: int = 0
    tokens: int = 0
    prompt_tokens: int = 0  # prompts prefilled: a request's, at its first token
    peak_running: int = 0
    prefix_queries: int = 0  # prompt tokens looked up in the prefix cache (at each admission)
    prefix_hits: int = 0  # of which it held the KV
    cached_blocks: int = 0  # blocks the prefix cache can hand out now
    alloc: list[float] = []  # seconds of each block allocation call timed since the last report
    steps: StepTotals = StepTotals()  # the engine loop's steps by phase, each timed from the loop's view

    @property
    def usage(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0


def start_series(metrics: KvMetrics, engine: str, first: EngineStats) -> None:
    """Every series of the engine present from the start (counters at their first totals)."""
    labels = (engine, metrics.device)
    metrics.alloc_latency.labels(*labels)
    for counter in (
        metrics.preemptions,
        metrics.generated,
        metrics.prompt,
        metrics.finished,
        metrics.prefix_queries,
        metrics.prefix_hits,
    ):
        counter.labels(*labels)
    for phase in PHASES:
        for counter in (metrics.steps, metrics.step_seconds, metrics.step_tokens):
            counter.labels(*labels, phase)
    mirror(metrics, engine, EngineStats(), first, ())


def mirror(
    metrics: KvMetrics, engine: str, before: EngineStats, now: EngineStats, alloc_seconds: Iterable[float]
) -> None:
    """Set the gauges to ``now``, advance the counters by ``now - before`` and observe the allocation latencies."""
    labels = (engine, metrics.device)
    metrics.blocks_used.labels(*labels).set(now.used)
    metrics.blocks_free.labels(*labels).set(now.free)
    metrics.blocks_capacity.labels(*labels).set(now.capacity)
    metrics.block_size.labels(*labels).set(now.block_size)
    metrics.fragmentation.labels(*labels).set(now.fragmentation)
    metrics.running.labels(*labels).set(now.running)
    metrics.waiting.labels(*labels).set(now.waiting)
    metrics.cached_blocks.labels(*labels).set(now.cached_blocks)
    for counter, total, last in (
        (metrics.preemptions, now.preemptions, before.preemptions),
        (metrics.generated, now.tokens, before.tokens),
        (metrics.prompt, now.prompt_tokens, before.prompt_tokens),
        (metrics.finished, now.finished, before.finished),
        (metrics.prefix_queries, now.prefix_queries, before.prefix_queries),
        (metrics.prefix_hits, now.prefix_hits, before.prefix_hits),
    ):
        if total > last:
            counter.labels(*labels).inc(total - last)
    step_counters = (metrics.steps, metrics.step_seconds, metrics.step_tokens)
    for phase in PHASES:
        for counter, counted, had in zip(step_counters, now.steps.phase(phase), before.steps.phase(phase), strict=True):
            if counted > had:
                counter.labels(*labels, phase).inc(counted - had)
    histogram = metrics.alloc_latency.labels(*labels)
    for seconds in alloc_seconds:
        histogram.observe(seconds)
