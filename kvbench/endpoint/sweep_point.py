"""An :class:`EndpointPoint` as a sweep point (``report/point.Point``): the schema every table, summary and
``compare`` reads.

The client's figures take vLLM bench's names, which the schema already uses (``median_*`` is also written as
``p50_*``). What a server over HTTP does not expose stays unknown (None), never 0: KV bytes (its usage is a
share of its own cache, ``kv_usage_peak``/``kv_usage_mean`` in [0, 1]), waste shares and fragmentation. The
server's figures, the cache reset, the failures by kind and the client-vs-server agreement go in the point's
extra fields (see :data:`EXTRA_FIELDS`). A point whose requests failed has status ``error``, its figures kept
(they describe the requests that completed), and its reason names the failures by kind.
"""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

from kvbench.endpoint.run_point import EndpointPoint
from kvbench.results.point import Point, aggregate_repeats
from kvbench.results.schema import LATENCY_FIELDS

ENDPOINT_FIELD = "endpoint"  # {url, api, model, load}: marks a point measured over HTTP
SERVER_FIELDS = (
    "kv_usage_peak",
    "kv_usage_mean",
    "running_mean",
    "waiting_peak",
    "waiting_mean",
    "prefix_cache_hit_rate",
    "prefix_cache_hits",
    "prefix_cache_queries",
    "server_mean_ttft_ms",
    "server_prompt_tokens",
    "server_generation_tokens",
)
EXTRA_FIELDS = (
    ENDPOINT_FIELD,
    "request_rate",
    *SERVER_FIELDS,
    "failed",
    "stopped",
    "failed_by_kind",
    "failure_examples",
    "request_goodput",
    "slo",
    "cache_reset",
    "cache_state",
    "prefix_reuse",
    "kv_events",
    "kv_events_file",
    "requests_file",
    "trace",
    "agreement",
    "server_notes",
    "scrapes",
    "max_send_lag_ms",
)


def cache_state(reset: dict[str, Any]) -> str:
    """The prefix cache as the point's load found it: ``reset`` (emptied, the server confirmed), ``warm`` (not
    asked: earlier points and the warm-up left their blocks) or ``unknown`` (asked, not confirmed)."""
    if reset.get("reset") is True:
        return "reset"
    return "unknown" if reset.get("asked") else "warm"


def is_endpoint_point(point: dict[str, Any]) -> bool:
    """Whether a results-schema point was measured against a server over HTTP."""
    return isinstance(point.get(ENDPOINT_FIELD), dict)


def failure_text(metrics: dict[str, Any]) -> str:
    """``3 of 20 requests failed: http 2, timeout 1 (first: HTTP 500 ...)``."""
    failed = metrics.get("failed") or 0
    total = failed + (metrics.get("completed") or 0)
    kinds = ", ".join(f"{kind} {count}" for kind, count in sorted((metrics.get("failed_by_kind") or {}).items()))
    examples = metrics.get("failure_examples") or []
    first = examples[0] if isinstance(examples, list) and examples else None
    return f"{failed} of {total} requests failed: {kinds}" + (f" (e.g. {first})" if first else "")


def sweep_point(
    endpoint: EndpointPoint, engine: str, concurrency: int, scenario: str, slo: dict[str, float] | None = None
) -> Point:
    """The sweep point of ``endpoint`` for target ``engine`` at ``concurrency`` (0 for an open-loop rate)."""
    m, server = endpoint.metrics, endpoint.server or {}
    latencies: dict[str, float | None] = {}
    for name in LATENCY_FIELDS:
        source = name.replace("p50_", "median_", 1) if name.startswith("p50_") else name
        latencies[name] = m.get(source)
    running_peak = server.get("running_peak")
    point = Point(
        engine=engine,
        concurrency=concurrency,
        scenario=scenario,
        status="ok" if endpoint.status == "ok" else "error",
        completed=m["completed"],
        rejected=0,
        preemptions=_count(server.get("preemptions")),  # None: not exposed
        output_throughput=m["output_throughput"] or 0.0,
        total_token_throughput=m["total_token_throughput"] or 0.0,
        request_throughput=m["request_throughput"] or 0.0,
        duration=m["duration"],
        total_input_tokens=m["total_input_tokens"],
        total_output_tokens=m["total_output_tokens"],
        latencies=latencies,
        peak_running=_count(running_peak),
        mean_running=server.get("running_mean"),
        kv_pool_bytes=None,
        kv_peak_allocated_bytes=None,
        kv_mean_allocated_bytes=None,
        kv_mean_used_bytes=None,
        kv_peak_used_bytes=None,
        effective_usage_pct=None,
        fragmentation_mean=None,
        elapsed_s=m["duration"],
    )
    if endpoint.status != "ok":
        point.error = failure_text(m)
    pattern = endpoint.load
    point.extra[ENDPOINT_FIELD] = {
        "url": endpoint.target.get("url"),
        "api": endpoint.target.get("api"),
        "model": endpoint.model,
        "metrics_url": endpoint.target.get("metrics_url"),
        "load": pattern,
        "peak_in_flight": endpoint.peak_in_flight,
        "stopped_at_deadline": endpoint.stopped_at_deadline,
        "warmup": endpoint.warmup,
    }
    if pattern.get("pattern") == "open":
        point.extra["request_rate"] = pattern.get("rate")
    for name in SERVER_FIELDS:
        point.extra[name] = server.get(name)
    point.extra.update(
        failed=m["failed"],
        stopped=m.get("stopped") or 0,
        failed_by_kind=m.get("failed_by_kind") or {},
        failure_examples=m.get("failure_examples") or [],
        request_goodput=m.get("request_goodput"),
        slo=dict(slo) if slo else None,
        cache_reset=endpoint.cache_reset,
        cache_state=cache_state(endpoint.cache_reset),
        prefix_reuse=endpoint.reuse,
        kv_events=endpoint.kv_events,
        agreement=endpoint.agreement,
        server_notes=server.get("notes") or [],
        scrapes={
            k: server.get(k) for k in ("scrapes", "scrapes_failed", "scrapes_during_load", "scrape_errors", "families")
        }
        if server
        else None,
        max_send_lag_ms=endpoint.max_send_lag_ms,
    )
    return point


_PEAK_SERVER_FIELDS = ("kv_usage_peak", "waiting_peak")


def combine_repeats(points: list[Point]) -> Point:
    """One point from K repeats of an endpoint point: the client's figures as ``aggregate_repeats`` combines
    them (means with std and 95% CI), the server's peaks as the maximum and its other figures as the mean over the
    repeats that exposed them, and every failed request of every repeat counted (by kind); the files of each
    repeat are listed in ``repeat_files``, and the last one's are the point's own."""
    merged = aggregate_repeats(points)
    if len(points) == 1:
        return merged
    extras = [p.extra for p in points]
    for name in (*SERVER_FIELDS, "request_goodput"):
        values = [float(e[name]) for e in extras if isinstance(e.get(name), (int, float))]
        if not values:
            merged.extra[name] = None
        else:
            merged.extra[name] = max(values) if name in _PEAK_SERVER_FIELDS else statistics.fmean(values)
    kinds: Counter[str] = Counter()
    for e in extras:
        kinds.update(e.get("failed_by_kind") or {})
    merged.extra["failed"] = sum(e.get("failed") or 0 for e in extras)
    merged.extra["stopped"] = sum(e.get("stopped") or 0 for e in extras)
    merged.extra["failed_by_kind"] = dict(kinds)
    examples = [f"run {i}: {text}" for i, e in enumerate(extras, 1) for text in e.get("failure_examples") or []]
    merged.extra["failure_examples"] = examples[:6]
    merged.extra["server_notes"] = list(dict.fromkeys(note for e in extras for note in e.get("server_notes") or []))
    merged.extra["repeat_files"] = [e.get("timeline_file") for e in extras]
    return merged


def _count(value: Any) -> int | None:
    return None if value is None else int(round(float(value)))
