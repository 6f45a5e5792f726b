"""Build results-schema points (DESIGN.md) from a run, and aggregate repeated runs."""

from __future__ import annotations

import math
import statistics
from typing import Any

from kvbench.engine.result import RunResult
from kvbench.report.schema import MEMORY_FIELDS

# numeric top-level fields aggregated over repeats (mean, std, 95% CI, samples)
REPEATED_FIELDS = (
    "output_throughput", "total_token_throughput", "request_throughput",
    "mean_ttft_ms", "p50_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "p50_tpot_ms", "p99_tpot_ms",
    "mean_itl_ms", "p99_itl_ms", "mean_e2el_ms", "p50_e2el_ms", "p99_e2el_ms",
)


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
        "effective_usage_pct": 100 * acct.effective_usage(),
        "fragmentation_mean": acct.fragmentation_mean(),
        "elapsed_s": acct.elapsed_s,
        "memory": {name: (memory or {}).get(name) for name in (*MEMORY_FIELDS, "nvml_process_peak_bytes")},
    }
    if oom:
        point["status_reason"] = f"{len(oom)} request(s) rejected: {oom[0].reject_reason}"
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
    """Mean of each repeated metric with its std and 95% confidence interval; per-repeat samples kept."""
    if len(points) == 1:
        return points[0]
    merged = dict(points[-1])
    merged["repeats"] = len(points)
    merged["samples"] = {}
    statuses = {p["status"] for p in points}
    merged["status"] = "error" if "error" in statuses else ("oom" if "oom" in statuses else "ok")
    for name in REPEATED_FIELDS:
        values = [p[name] for p in points if isinstance(p.get(name), (int, float)) and not math.isnan(p[name])]
        if not values:
            continue
        mean = statistics.fmean(values)
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        merged[name] = mean
        merged[f"{name}_std"] = std
        merged[f"{name}_ci95"] = _t95(len(values)) * std / math.sqrt(len(values)) if len(values) > 1 else 0.0
        merged["samples"][name] = values
    return merged


def _t95(n: int) -> float:
    """Two-sided 95% Student t quantile for n-1 degrees of freedom."""
    table = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776, 6: 2.571, 7: 2.447, 8: 2.365, 9: 2.306, 10: 2.262}
    return table.get(n, 1.96 + 2.4 / max(n - 1, 1))
