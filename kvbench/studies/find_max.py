"""``sweep --target URL --find-max``: the highest load a server holds within an SLO, and what stops it there.

The search is a bisection over the concurrency (closed loop, integers) or the request rate (open loop, to 10%)
between the lowest and highest level asked for, bounded by a number of points. A point *meets* the SLO when
every request completed and at least ``attainment`` of them met every objective (vLLM's goodput over its
throughput). Every probe is a real point of the run (results.jsonl, timelines).

Why the load stops there is judged on the first point past the limit from the server's scrapes, with the live
rules of ``kvbench diagnose`` (report/diagnose/live_rules) over them, and the server's own flag to change:

- ``kv_full``: KV usage reached ~100% and requests were preempted (or waited with no free blocks);
- ``batch_cap``: requests waited while KV usage stayed low: the scheduler's cap on running requests;
- ``prefill_queue``: the queue of waiting requests grew while the KV cache had room for them;
- ``compute``: neither: latency grew with the batch (the server's compute or bandwidth is the limit);
- ``failures``: requests failed (their kinds say why), ``unknown``: no scrape to judge from.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from kvbench import units
from kvbench.endpoint.scraper import Scrape
from kvbench.errors import KvbenchError
from kvbench.report.diagnose.live_rules import Window, diagnose_windows
from kvbench.report.diagnose.remedies import render
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.results.endpoint_figures import EndpointFigures, failure_text, slo_share
from kvbench.results.find_max_search import Limit, Probe, Search
from kvbench.results.point import Point

KV_FULL_USAGE = 0.95  # usage at or above this share, with preemptions, is a full KV cache
LOW_USAGE = 0.5  # requests waiting below this usage wait for the scheduler, not for memory
RATE_TOLERANCE = 1.1  # the rate bisection stops when the bracket is this narrow (ratio)


def meets_slo(point: Point, attainment: float) -> bool:
    """Every request completed, and at least ``attainment`` of them met every objective."""
    if point.status != "ok" or not point.completed:
        return False
    share = slo_share(point)
    if share is None:
        raise KvbenchError("finding the highest load needs an SLO to judge each point by, e.g. ttft=500,tpot=50")
    return share >= attainment - 1e-12


def _windows(scrapes: Sequence[Scrape], load_end_s: float) -> list[Window]:
    """The scrapes during the load, one window per engine instance (as ``kvbench watch`` records them)."""
    by_source: dict[str, list[tuple[float, Any]]] = {}
    for scrape in scrapes:
        if scrape.error is not None or not 0.0 <= scrape.elapsed_s <= load_end_s:
            continue
        for state in scrape.states:
            by_source.setdefault(state.source, []).append((scrape.elapsed_s, state))
    return [Window(samples) for samples in by_source.values() if samples]


def limit_of(point: Point, scrapes: Sequence[Scrape], load_end_s: float) -> Limit:
    """Why ``point`` (the first past the limit) misses the SLO, from its server figures and scrapes."""
    windows = _windows(scrapes, load_end_s)
    family = windows[0].last.family if windows else "vllm"
    figures = EndpointFigures.of(point)
    if figures.failed > 0:
        return Limit(
            "failures",
            failure_text(figures.failed, point.completed, figures.failed_by_kind, figures.failure_examples),
            "look at the failures' kinds: timeouts and 503s under load are the server refusing work",
        )
    if not windows:
        return Limit(
            "unknown",
            "no scrape of the server's /metrics during the load: nothing to judge the limit by",
            "tell kvbench where the server's metrics are (the metrics URL)",
        )
    diagnosis = diagnose_windows(windows, Thresholds())
    usage_peak, usage_mean = figures.server.kv_usage_peak, figures.server.kv_usage_mean
    peak_text, mean_text = units.share(usage_peak, 0, missing="?"), units.share(usage_mean, 0, missing="?")
    preemptions = point.preemptions or 0
    waiting_peak = figures.server.waiting_peak or 0
    rules = {f.rule: f for f in diagnosis.findings}
    capped = rules.get("concurrency_capped")
    if (
        (usage_peak is not None and usage_peak >= KV_FULL_USAGE and preemptions > 0)
        or "preemption_storm" in rules
        or (capped is not None and capped.values.get("bound") == "kv_memory")
    ):
        evidence = f"KV usage peaked at {peak_text} with {preemptions:.0f} preemptions"
        if capped is not None and capped.values.get("bound") == "kv_memory":
            evidence += f"; {capped.evidence}"
        return Limit("kv_full", evidence, render(("more_kv_memory",), family) or "give the KV cache more memory")
    if waiting_peak > 0 and usage_mean is not None and usage_mean < LOW_USAGE:
        evidence = f"up to {waiting_peak:.0f} requests waited while KV usage averaged {mean_text} (peak {peak_text})"
        if capped is not None:
            evidence += f"; {capped.evidence}"
        return Limit(
            "batch_cap", evidence, render(("raise_batch_cap",), family) or "raise the server's cap on running requests"
        )
    waiting = [(t, s.waiting) for w in windows for t, s in w.samples if s.waiting is not None]
    if len(waiting) >= 3 and _rising(waiting):
        return Limit(
            "prefill_queue",
            f"the waiting queue grew from {waiting[0][1]:.0f} to {waiting[-1][1]:.0f} while "
            f"KV usage peaked at {peak_text}",
            render(("prefill_queue",), family),
        )
    return Limit(
        "compute",
        f"no queue and KV usage at most {peak_text}: the latency objectives were missed "
        f"with every request running ({point.peak_running} at once)",
        render(("scale_compute",), family),
    )


def _rising(points: Sequence[tuple[float, float]]) -> bool:
    """More at the end than at the start, with a rising least-squares line."""
    if points[-1][1] <= points[0][1]:
        return False
    n = len(points)
    mean_t = sum(p[0] for p in points) / n
    mean_v = sum(p[1] for p in points) / n
    return sum((p[0] - mean_t) * (p[1] - mean_v) for p in points) > 0


Measure = Callable[[float], tuple[Point, Sequence[Scrape], float]]  # level -> (point, scrapes, load end)


def find_max(
    engine: str, low: float, high: float, by: str, max_points: int, attainment: float, measure: Measure
) -> Search:
    """Bisect between ``low`` and ``high`` for the highest level meeting the SLO, in at most ``max_points`` points."""
    if max_points < 2:
        raise KvbenchError("the search for the highest load needs at least 2 points (the lowest and highest level)")
    search = Search(engine, by)
    misses: dict[float, tuple[Point, Sequence[Scrape], float]] = {}

    def probe(level: float) -> bool:
        point, scrapes, end = measure(level)
        ok = meets_slo(point, attainment)
        search.probes.append(Probe(level, ok, slo_share(point), point.status))
        if ok:
            search.best = level if search.best is None else max(search.best, level)
        else:
            misses[level] = (point, scrapes, end)
            search.first_miss = level if search.first_miss is None else min(search.first_miss, level)
        return ok

    if probe(high):
        search.stopped = (
            f"the highest level asked for ({search.level_text(high)}) meets the SLO: raise it to look further"
        )
        return search
    if low >= high or not probe(low):
        search.stopped = f"even the lowest level ({search.level_text(low)}) misses the SLO"
    else:
        lo, hi = low, high
        while len(search.probes) < max_points and not _closed(lo, hi, by):
            mid = float((int(lo) + int(hi)) // 2) if by == "concurrency" else math.sqrt(lo * hi)
            if probe(mid):
                lo = mid
            else:
                hi = mid
        search.stopped = (
            "bracket closed"
            if _closed(lo, hi, by)
            else f"point budget spent ({max_points}); the limit lies between {search.level_text(lo)} and "
            f"{search.level_text(hi)}"
        )
    if search.first_miss is not None:
        point, scrapes, end = misses[search.first_miss]
        search.limit = limit_of(point, scrapes, end)
    return search


def _closed(lo: float, hi: float, by: str) -> bool:
    return hi - lo <= 1 if by == "concurrency" else hi / lo <= RATE_TOLERANCE
