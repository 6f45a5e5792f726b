"""One policy's fleet run as a results point (``summary.json``), and the series its plots draw.

Fleet points follow the sweep's names where they mean the same (``p99_ttft_ms``, ``output_throughput``,
``preemptions``, ``rejected``) and add what a fleet has: per-instance block usage, the imbalance between
instances (max - min free blocks), instance-seconds (cost), the prefix-cache hit rate, and requests
re-routed after an instance failed.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from kvbench.endpoint.client_metrics import meets_slo
from kvbench.engine.latency import request_latencies, summarise
from kvbench.engine.request import Request, RequestStatus
from kvbench.results.fleet_point import FleetInstance, FleetPoint
from kvbench.results.fleet_series import FleetSeries
from kvbench.studies.fleet.core import FleetRun, InstanceSlot

MAX_SERIES_POINTS = 600  # per instance, in the timeline file
CDF_POINTS = 400


def fleet_point(run: FleetRun, engine: str, scenario: str, slo: Mapping[str, float] | None = None) -> FleetPoint:
    """The results-schema point of one policy's run; with ``slo`` (milliseconds by ttft, tpot, e2el) its
    goodput: finished requests per second that met every objective."""
    finished = [r for r in run.requests if r.status is RequestStatus.FINISHED]
    rejected = [r for r in run.requests if r.status is RequestStatus.REJECTED]
    span = run.end_s
    output = sum(r.num_outputs for r in finished)
    prompt = sum(r.prompt_len for r in finished)
    latencies: dict[str, float | None] = {}
    per_request = request_latencies(finished)
    for kind in ("ttft", "tpot", "e2el"):
        latencies.update(summarise(kind, per_request[kind]))
    latencies.update(summarise("itl", []))
    instances = [_instance_summary(slot, run) for slot in run.slots]
    imbalance = _imbalance(run)
    waiting = _fleet_totals(run, column=5)
    usage = _fleet_usage(run)
    prompt_tokens = sum(i.prompt_tokens for i in instances)
    cached = sum(i.cached_tokens for i in instances)
    met = sum(_meets(request, slo) for request in finished) if slo else 0
    reason = rejected[0].reject_reason if rejected else "no request ran"
    return FleetPoint(
        engine=f"{engine}/{run.policy}",
        concurrency=0,  # open loop: arrivals do not wait for completions
        scenario=scenario,
        policy=run.policy,
        kv_engine=engine,
        status="ok" if finished else "error",
        completed=len(finished),
        rejected=len(rejected),
        rejected_by_reason=dict(Counter(r.reject_kind or "unknown" for r in rejected)),
        rerouted=run.rerouted,
        preemptions=sum(i.preemptions for i in instances),
        output_throughput=output / span if span > 0 and finished else 0.0,
        total_token_throughput=(output + prompt) / span if span > 0 and finished else 0.0,
        request_throughput=len(finished) / span if span > 0 and finished else 0.0,
        duration=span,
        total_input_tokens=prompt,
        total_output_tokens=output,
        latencies=latencies,
        elapsed_s=span,
        kv_usage_mean=usage.mean,
        kv_usage_p99=usage.p99,
        free_blocks_imbalance_mean=imbalance.mean,
        free_blocks_imbalance_p99=imbalance.p99,
        free_blocks_imbalance_max=imbalance.max,
        queued_mean=waiting.mean,
        queued_peak=waiting.max,
        instance_seconds=sum(slot.seconds(span) for slot in run.slots),
        instances_peak=max((serving + starting for _, serving, starting in run.fleet_samples), default=len(run.slots)),
        instances_mean=_mean(
            [serving + starting for _, serving, starting in run.fleet_samples],
            [run.tick_weight(t) for t, _, _ in run.fleet_samples],
        ),
        scale_ups=sum(1 for _, kind, _ in run.events if kind == "up"),
        scale_downs=sum(1 for _, kind, _ in run.events if kind == "down"),
        prefix_hit_rate=cached / prompt_tokens if prompt_tokens else None,  # None: nothing counted
        routed_after_drain=sum(slot.routed_after_drain for slot in run.slots),
        instances=instances,
        simulated=run.simulated,
        slo_ms=dict(slo) if slo else None,
        request_goodput=(met / span if span > 0 else 0.0) if slo else None,
        slo_met_share=met / len(run.requests) if slo and run.requests else None,
        error=None if finished else f"no request completed ({len(rejected)} rejected, e.g. {reason})",
        notes=list(run.notes),
    )


def _meets(request: Request, slo: Mapping[str, float]) -> bool:
    """Every objective met (times from the request's arrival, as ``request_latencies`` counts them)."""
    assert request.first_token_time is not None and request.finish_time is not None
    ttft = request.first_token_time - request.arrival_time
    e2el = request.finish_time - request.arrival_time
    tpot = (e2el - ttft) / (request.num_outputs - 1) if request.num_outputs > 1 else 0.0
    return meets_slo(ttft, tpot, e2el, slo)


def _instance_summary(slot: InstanceSlot, run: FleetRun) -> FleetInstance:
    stats = slot.final_stats or slot.stats
    mine = [(t, used, total) for t, index, used, total, _, _ in run.samples if index == slot.index]
    usage = [used / total for _, used, total in mine if total]
    weights = [run.tick_weight(t) for t, _, total in mine if total]
    free = [total - used for _, used, total in mine]
    prompt = stats.prompt_tokens if stats else 0
    cached = stats.cached_tokens if stats else 0
    usage_mean = _mean(usage, weights)  # None without samples
    return FleetInstance(
        index=slot.index,
        name=slot.name,
        state=slot.state,
        routed=slot.routed,
        finished=stats.finished if stats else 0,
        preemptions=stats.preemptions if stats else 0,
        total_blocks=stats.total_blocks if stats else None,
        usage_mean=usage_mean,
        usage_peak=max(usage, default=None),
        free_share_mean=(1.0 - usage_mean) if usage_mean is not None else None,
        free_blocks_min=min(free, default=None),
        prompt_tokens=prompt,
        cached_tokens=cached,
        prefix_hit_rate=cached / prompt if prompt else None,
        started_at_s=slot.started_at,
        ready_at_s=slot.ready_at,
        stopped_at_s=slot.stopped_at,
        startup_s=slot.startup_s,
        failure=slot.failure,
        routed_after_drain=slot.routed_after_drain,
    )


@dataclass(frozen=True)
class _Spread:
    """A sampled figure over the run, each sample weighted by the ticks it stands for (None: no sample)."""

    mean: float | None
    p99: float | None
    max: float | None


def _by_tick(run: FleetRun) -> dict[float, list[tuple]]:
    ticks: dict[float, list[tuple]] = defaultdict(list)
    for sample in run.samples:
        ticks[sample[0]].append(sample)
    return ticks


def _imbalance(run: FleetRun) -> _Spread:
    """Max - min free blocks across the instances serving at each sample (one instance: 0)."""
    ticks = _by_tick(run)
    values = [
        max(t - u for _, _, u, t, _, _ in rows) - min(t - u for _, _, u, t, _, _ in rows) for rows in ticks.values()
    ]
    return _stats(values, [run.tick_weight(t) for t in ticks])


def _fleet_usage(run: FleetRun) -> _Spread:
    ticks = {t: rows for t, rows in _by_tick(run).items() if sum(total for _, _, _, total, _, _ in rows)}
    values = [sum(u for _, _, u, _, _, _ in rows) / sum(t for _, _, _, t, _, _ in rows) for rows in ticks.values()]
    return _stats(values, [run.tick_weight(t) for t in ticks])


def _fleet_totals(run: FleetRun, column: int) -> _Spread:
    ticks = _by_tick(run)
    return _stats([sum(row[column] for row in rows) for rows in ticks.values()], [run.tick_weight(t) for t in ticks])


def _stats(values: list[float], weights: list[int] | None = None) -> _Spread:
    """Mean, p99 (linear, as numpy's) and max of ``values``, each standing for ``weights`` ticks: the same
    figures as over the values repeated, without repeating them."""
    if not values:
        return _Spread(None, None, None)
    array = np.asarray(values, dtype=float)
    counts = np.ones(len(array), dtype=np.int64) if weights is None else np.asarray(weights, dtype=np.int64)
    return _Spread(
        float(np.average(array, weights=counts)), _repeated_percentile(array, counts, 99.0), float(array.max())
    )


def _repeated_percentile(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """``np.percentile(np.repeat(values, counts), q)`` (linear interpolation), with no repeated array."""
    order = np.argsort(values, kind="stable")
    values, ends = values[order], np.cumsum(counts[order])  # sorted value i fills positions ends[i-1] .. ends[i]-1
    position = q / 100.0 * (int(ends[-1]) - 1)
    low = int(math.floor(position))
    below = values[np.searchsorted(ends, low, side="right")]
    above = values[np.searchsorted(ends, min(low + 1, int(ends[-1]) - 1), side="right")]
    return float(below + (above - below) * (position - low))


def _mean(values: list[float], weights: list[int] | None = None) -> float | None:
    return float(np.average(values, weights=weights)) if values else None


def fleet_series(run: FleetRun) -> FleetSeries:
    """What the plots draw: block usage per instance over time, the TTFT distribution, instances over time."""
    per_instance: dict[int, list[list[float]]] = defaultdict(list)
    for t, index, used, total, _, _ in run.samples:
        per_instance[index].append([t, used / total if total else 0.0])
    for index, series in per_instance.items():
        stride = max(1, len(series) // MAX_SERIES_POINTS)
        per_instance[index] = series[::stride]
    ttft = sorted(
        r.first_token_time - r.arrival_time
        for r in run.requests
        if r.status is RequestStatus.FINISHED and r.first_token_time is not None
    )
    if len(ttft) > CDF_POINTS:
        positions = np.linspace(0, len(ttft) - 1, CDF_POINTS).round().astype(int)
        cdf = [[ttft[p], (p + 1) / len(ttft)] for p in positions]
    else:
        cdf = [[value, (p + 1) / len(ttft)] for p, value in enumerate(ttft)]
    return FleetSeries(
        policy=run.policy,
        usage={str(index): series for index, series in sorted(per_instance.items())},
        ttft_cdf=cdf,
        instances=[[t, serving, starting] for t, serving, starting in run.fleet_samples],
        events=[[t, kind, index] for t, kind, index in run.events],
        placement=[run.placement.get(r.request_id) for r in run.requests],  # the instance of each request
        names={str(slot.index): slot.name for slot in run.slots if slot.name},  # a server's label
    )
