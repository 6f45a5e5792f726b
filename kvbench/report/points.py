"""Build results-schema points (DESIGN.md) from a run, and aggregate repeated runs."""

from __future__ import annotations

import math
import statistics
from typing import Any

from kvbench.engine.result import RunResult
from kvbench.report.schema import MEMORY_FIELDS

# headline metrics whose spread is reported (std, 95% CI, per-repeat samples) with --repeat
REPEATED_FIELDS = (
    "output_throughput", "total_token_throughput", "request_throughput",
    *(f"{stat}_{kind}_ms" for kind in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "p50", "p90", "p99")),
)
_PEAK_FIELDS = ("peak_running", "kv_peak_allocated_bytes", "kv_peak_used_bytes")  # max over repeats


def point_from_result(
    result: RunResult, engine: str, concurrency: int, scenario: str, bytes_per_token: int,
    memory: dict[str, Any] | None = None,
) -> dict[str, Any]:
    acct = result.accountant
    rejected = result.rejected
    oom = [r for r in rejected if r.reject_kind in ("oom", "pool")]  # no memory now, or never enough
    point: dict[str, Any] = {
        "engine": engine,
        "concurrency": concurrency,
        "scenario": scenario,
        "status": "oom" if oom else "ok",
        "completed": len(result.completed),
        "rejected": len(rejected),
        "rejected_oom": len(oom),
        "preemptions": result.num_preemptions,
        **result.throughput(),
        **result.latencies(),
        "peak_running": result.peak_running,
        "mean_running": acct.mean_running(),
        "kv_pool_bytes": result.pool_slots * bytes_per_token,
        "kv_peak_allocated_bytes": acct.peak_allocated * bytes_per_token,
        "kv_mean_allocated_bytes": sum(acct.mean_slots(p) for p in ("used", "reserved", "internal")) * bytes_per_token,
        "kv_mean_used_bytes": acct.mean_slots("used") * bytes_per_token,
        "kv_peak_used_bytes": acct.peak["used"] * bytes_per_token,
        "waste": acct.waste_pct(),
        "waste_peak_pct": {part: 100.0 * slots / result.pool_slots if result.pool_slots else None
                           for part, slots in acct.peak.items()},  # each part's own peak, in % of the pool
        "effective_usage_pct": 100 * acct.effective_usage(),
        "fragmentation_mean": acct.fragmentation_mean(),
        "elapsed_s": acct.elapsed_s,
        "memory": {name: (memory or {}).get(name) for name in (*MEMORY_FIELDS, "nvml_process_peak_bytes")},
    }
    if oom:
        point["status_reason"] = f"{len(oom)} request(s) rejected: {oom[0].reject_reason}"
    elif not result.completed:  # a point with nothing done has no figures to show: say why, never "ok"
        point["status"] = "error"
        reason = f"{len(rejected)} request(s) rejected: {rejected[0].reject_reason}" if rejected else "no request ran"
        point["error"] = f"no request completed ({reason})"
    return point


def timeline_of(result: RunResult, max_points: int = 400) -> list[list[float]]:
    """(time s, blocks in use) pairs, thinned to at most ``max_points``."""
    line = result.accountant.timeline
    stride = max(1, len(line) // max_points)
    thinned = [[t, blocks] for t, blocks, _ in line[::stride]]
    if line:
        thinned.append([result.accountant.elapsed_s, line[-1][1]])
    return thinned


def aggregate_repeats(points: list[dict[str, Any]]) -> dict[str, Any]:
    """One point from K repeats: means (with std, 95% CI and samples for the headline metrics), peaks as the
    maximum, waste shares averaged, memory peaks maximised, and the worst status with its reason."""
    if len(points) == 1:
        return points[0]
    merged = dict(points[-1])
    merged["repeats"] = len(points)
    merged["samples"] = {}
    for status in ("error", "oom"):
        worst = next((p for p in points if p["status"] == status), None)
        if worst is not None:
            merged["status"] = status
            for key in ("status_reason", "error"):
                if key in worst:
                    merged[key] = worst[key]
            break
    for name, value in points[-1].items():
        if name in REPEATED_FIELDS or name in _PEAK_FIELDS or not _is_number(value) or name == "concurrency":
            continue
        values = _numbers(points, name)
        if values:
            merged[name] = values[0] if len(set(values)) == 1 else statistics.fmean(values)  # equal counts stay ints
    for name in _PEAK_FIELDS:
        if _numbers(points, name):
            merged[name] = max(_numbers(points, name))
    for group, combine in (("waste", statistics.fmean), ("memory", max)):
        if isinstance(points[-1].get(group), dict):
            merged[group] = {key: (combine(values) if (values := [p[group][key] for p in points
                                                                  if _is_number((p.get(group) or {}).get(key))])
                                   else None) for key in points[-1][group]}
    for name in REPEATED_FIELDS:
        values = _numbers(points, name)
        if not values:
            continue
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        merged[name] = statistics.fmean(values)
        merged[f"{name}_std"] = std
        merged[f"{name}_ci95"] = _t95(len(values)) * std / math.sqrt(len(values)) if len(values) > 1 else 0.0
        merged["samples"][name] = values
    return merged


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _numbers(points: list[dict[str, Any]], name: str) -> list[float]:
    return [p[name] for p in points if _is_number(p.get(name))]


def _t95(n: int) -> float:
    """Two-sided 95% Student t quantile for n-1 degrees of freedom."""
    table = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}
    return table.get(n, 1.96 + 2.4 / max(n - 1, 1))
