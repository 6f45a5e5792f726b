"""An :class:`EndpointPoint` as a sweep point (``results.point.Point``): the schema every table, summary and
``compare`` reads.

The client's figures take vLLM bench's names, which the schema already uses (``median_*`` is also written as
``p50_*``). What a server over HTTP does not expose stays unknown (None), never 0: KV bytes (its usage is a
share of its own cache, ``kv_usage_peak``/``kv_usage_mean`` in [0, 1]), waste shares and fragmentation. The
server's figures, the cache reset, the failures by kind and the client-vs-server agreement go in the point's
extra fields (:class:`~kvbench.results.endpoint_figures.EndpointFigures`). A point whose requests failed has status
``error``, its figures kept (they describe the requests that completed), and its reason names the failures by kind.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import replace
from typing import Any

from kvbench.endpoint.run_point import EndpointPoint
from kvbench.results.endpoint_figures import (
    CacheReset,
    EndpointFigures,
    EndpointTarget,
    KvEventsSummary,
    LoadShape,
    ServerFigures,
    ServerMetrics,
    failure_text,
)
from kvbench.results.point import Point, aggregate_repeats
from kvbench.results.schema import LATENCY_FIELDS


def sweep_point(
    endpoint: EndpointPoint, engine: str, concurrency: int, scenario: str, slo: dict[str, float] | None = None
) -> Point:
    """The sweep point of ``endpoint`` for target ``engine`` at ``concurrency`` (0 for an open-loop rate)."""
    m, server = endpoint.metrics, endpoint.server or ServerMetrics()
    point = Point(
        engine=engine,
        concurrency=concurrency,
        scenario=scenario,
        status="ok" if endpoint.status == "ok" else "error",
        completed=m.completed,
        rejected=0,
        preemptions=_count(server.preemptions),  # None: not exposed
        output_throughput=m.output_throughput or 0.0,
        total_token_throughput=m.total_token_throughput or 0.0,
        request_throughput=m.request_throughput or 0.0,
        duration=m.duration,
        total_input_tokens=m.total_input_tokens,
        total_output_tokens=m.total_output_tokens,
        latencies={name: m.latency(name) for name in LATENCY_FIELDS},
        peak_running=_count(server.running_peak),
        mean_running=server.running_mean,
        kv_pool_bytes=None,
        kv_peak_allocated_bytes=None,
        kv_mean_allocated_bytes=None,
        kv_mean_used_bytes=None,
        kv_peak_used_bytes=None,
        effective_usage_pct=None,
        fragmentation_mean=None,
        elapsed_s=m.duration,
    )
    if endpoint.status != "ok":
        point.error = failure_text(m.failed, m.completed, m.failed_by_kind, m.failure_examples)
    load = LoadShape.from_json(endpoint.load)
    reset = CacheReset.from_json(endpoint.cache_reset)
    figures = EndpointFigures(
        endpoint=replace(
            EndpointTarget.from_json(endpoint.target),
            model=endpoint.model,
            load=load,
            peak_in_flight=endpoint.peak_in_flight,
            stopped_at_deadline=endpoint.stopped_at_deadline,
            warmup=endpoint.warmup,
        ),
        request_rate=load.rate if load.pattern == "open" else None,
        server=server.figures(),
        failed=m.failed,
        stopped=m.stopped,
        failed_by_kind=m.failed_by_kind,
        failure_examples=m.failure_examples,
        request_goodput=m.request_goodput,
        slo=dict(slo) if slo else None,
        cache_reset=reset,
        cache_state=reset.state,
        prefix_reuse=endpoint.reuse,
        kv_events=KvEventsSummary.from_json(endpoint.kv_events) if endpoint.kv_events is not None else None,
        agreement=endpoint.agreement,
        server_notes=server.notes,
        scrapes=endpoint.server.scrape_counts() if endpoint.server else None,
        max_send_lag_ms=endpoint.max_send_lag_ms,
    )
    figures.store_in(point)
    return point


def combine_repeats(points: list[Point]) -> Point:
    """One point from K repeats of an endpoint point: the client's figures as ``aggregate_repeats`` combines
    them (means with std and 95% CI), the server's peaks as the maximum and its other figures as the mean over the
    repeats that exposed them, and every failed request of every repeat counted (by kind); the files of each
    repeat are listed in ``repeat_files``, and the last one's are the point's own."""
    merged = aggregate_repeats(points)
    if len(points) == 1:
        return merged
    runs = [EndpointFigures.of(p) for p in points]
    goodputs = [float(run.request_goodput) for run in runs if isinstance(run.request_goodput, (int, float))]
    kinds: Counter[str] = Counter()
    for run in runs:
        kinds.update(run.failed_by_kind)
    examples = [f"run {i}: {text}" for i, run in enumerate(runs, 1) for text in run.failure_examples]
    combined = replace(
        runs[-1],
        server=ServerFigures.combined([run.server for run in runs]),
        request_goodput=statistics.fmean(goodputs) if goodputs else None,
        failed=sum(run.failed for run in runs),
        stopped=sum(run.stopped for run in runs),
        failed_by_kind=dict(kinds),
        failure_examples=examples[:6],
        server_notes=list(dict.fromkeys(note for run in runs for note in run.server_notes)),
        repeat_files=[run.timeline_file for run in runs],
    )
    combined.store_in(merged)
    return merged


def _count(value: Any) -> int | None:
    return None if value is None else int(round(float(value)))
