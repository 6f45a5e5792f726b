"""Rules over a run's recorded points: each finding with its evidence and a suggestion."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from kvbench.report.diagnose.findings import Diagnosis, Finding, pct, sorted_findings
from kvbench.report.diagnose.thresholds import Thresholds


def diagnose_points(points: Iterable[Mapping[str, Any]], meta: Mapping[str, Any], thresholds: Thresholds,
                    source: str = "") -> Diagnosis:
    findings: list[Finding] = []
    notes: list[str] = []
    checked = 0
    for point in points:
        label = (f"fleet {point.get('engine')}" if "policy" in point
                 else f"{point.get('engine')} C={point.get('concurrency')}")
        if point.get("status") == "error":  # a point that measured nothing is itself the worst finding
            findings.append(Finding("point_failed", "critical", label,
                                    f"the point failed and measured nothing: {point.get('error', 'no reason given')}",
                                    "look at its traceback in results.jsonl, fix the cause and rerun it "
                                    "(kvbench sweep --resume reruns failed points)", {"status": "error"}))
            continue
        checked += 1
        for rule in _POINT_RULES:
            finding = rule(point, meta, thresholds, label)
            if finding is not None:
                findings.append(finding)
        if "policy" in point:  # a fleet point: each instance, and the balance between them
            findings += _fleet_findings(point, thresholds, label)
    return Diagnosis(source, thresholds, sorted_findings(findings), checked, notes)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        return None
    return float(value)


def _layout_hint(point: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    if str(point.get("engine", "")).startswith("contiguous"):
        reserve = meta.get("reserve", "max")
        return (f"use the paged engine (--engines paged) instead of contiguous slabs; or reserve less than "
                f"--reserve {reserve} (pow2 or oracle); or a lower max-len (now {meta.get('max_len', '?')})")
    engine = str(point.get("engine", ""))
    block_size = engine.split("-", 1)[1] if engine.startswith("paged-") else meta.get("block_size", "?")
    return f"use a smaller --block-size (now {block_size}; 16-32 work best)"


def _rule_fragmentation(point, meta, t: Thresholds, label) -> Finding | None:
    value = _num(point.get("fragmentation_mean"))
    if value is None or value <= t.fragmentation:
        return None
    return Finding("fragmentation", "warning", label,
                   f"mean online fragmentation {value:.3f} (1 - used / allocated) > {t.fragmentation}: "
                   f"{pct(value)} of the allocated KV slots hold no token state",
                   _layout_hint(point, meta), {"fragmentation_mean": value, "threshold": t.fragmentation})


def _free_share(point) -> float | None:
    waste = point.get("waste") or {}
    free = _num(waste.get("free_pct"))
    if free is None:
        parts = [_num(waste.get(k)) for k in ("token_state_pct", "reservation_pct", "internal_pct", "external_pct")]
        if any(p is None for p in parts):
            return None
        free = 100.0 - sum(parts)
    return max(0.0, free) / 100.0


def _rule_free_blocks(point, meta, t: Thresholds, label) -> Finding | None:
    free = _free_share(point)
    if free is None or free >= t.free_blocks:
        return None
    pool, peak = _num(point.get("kv_pool_bytes")), _num(point.get("kv_peak_allocated_bytes"))
    at_peak = f"; at peak allocation {pct(1 - peak / pool)} were free" if pool and peak is not None else ""
    return Finding("free_blocks", "warning", label,
                   f"free KV blocks averaged {pct(free)} of the pool (< {pct(t.free_blocks)}){at_peak}",
                   "give the KV cache more memory (a larger --kv-memory or --gpu-memory-utilization), or lower "
                   "the concurrency / route new requests to the instance with the most free blocks",
                   {"free_share_mean": free, "threshold": t.free_blocks})


def _rule_alloc_latency(point, meta, t: Thresholds, label) -> Finding | None:
    metrics = point.get("metrics") or {}
    p99 = _num(metrics.get("block_alloc_latency_p99_seconds"))
    if p99 is None or p99 * 1000 <= t.alloc_latency_p99_ms:
        return None
    return Finding("alloc_latency", "critical", label,
                   f"block allocation latency p99 {p99 * 1000:.1f} ms > {t.alloc_latency_p99_ms:g} ms over "
                   f"{metrics.get('block_alloc_count', '?')} allocation calls",
                   "allocation sits on the step's critical path: use a larger --block-size (fewer allocations), "
                   "keep the pool off a contended host (CPU oversubscription stalls the allocator)",
                   {"alloc_latency_p99_ms": p99 * 1000, "threshold_ms": t.alloc_latency_p99_ms})


def _rule_preemptions(point, meta, t: Thresholds, label) -> Finding | None:
    preemptions, completed = _num(point.get("preemptions")), _num(point.get("completed"))
    if not preemptions or completed is None:
        return None
    rate = preemptions / max(completed, 1.0)
    if rate <= t.preemptions_per_request:
        return None
    return Finding("preemption_storm", "warning", label,
                   f"{preemptions:.0f} preemptions for {completed:.0f} completed requests "
                   f"({rate:.2f} per request > {t.preemptions_per_request:g}): recompute wastes work",
                   "give the KV cache more memory (a larger --kv-memory or --gpu-memory-utilization) or lower the "
                   "concurrency so running requests can grow without evicting each other",
                   {"preemptions_per_request": rate, "threshold": t.preemptions_per_request})


def _rule_reservation(point, meta, t: Thresholds, label) -> Finding | None:
    waste = point.get("waste") or {}
    reservation, internal = _num(waste.get("reservation_pct")), _num(waste.get("internal_pct"))
    if reservation is None or internal is None:
        return None
    share = (reservation + internal) / 100.0
    if share <= t.reservation_waste:
        return None
    return Finding("reservation_waste", "warning", label,
                   f"reservation + internal fragmentation took {pct(share)} of the pool on average "
                   f"(> {pct(t.reservation_waste)}); token states only {waste.get('token_state_pct', 0):.1f}%",
                   _layout_hint(point, meta), {"reservation_internal_share": share, "threshold": t.reservation_waste})


def _rule_capped(point, meta, t: Thresholds, label) -> Finding | None:
    concurrency = _num(point.get("concurrency"))
    peak = _num(point.get("peak_running"))
    hint = ("give the KV cache more memory (--kv-memory, --gpu-memory-utilization)"
            + ("; the paged engine fits more requests in the same budget; or a lower max-len or --reserve pow2"
               if str(point.get("engine", "")).startswith("contiguous") else ""))
    if point.get("status") == "oom":
        evidence = f"OOM: {point.get('status_reason') or 'requests rejected for lack of KV memory'}"
        if peak is not None and concurrency is not None:
            evidence += f" (peak running {peak:.0f} of concurrency {concurrency:.0f})"
        return Finding("concurrency_capped", "critical", label, evidence, hint,
                       {"peak_running": peak, "concurrency": concurrency, "status": "oom"})
    if concurrency is None or peak is None:
        return None
    offered = concurrency
    total = (_num(point.get("completed")) or 0) + (_num(point.get("rejected")) or 0)
    if total:
        offered = min(offered, total)
    if peak >= offered or peak >= meta.get("max_num_seqs", 256):
        return None
    return Finding("concurrency_capped", "warning", label,
                   f"at most {peak:.0f} of {offered:.0f} requests ran at once: the KV budget caps concurrency",
                   hint, {"peak_running": peak, "concurrency": concurrency})


IMBALANCE_SHARE = 0.25  # mean max - min free blocks across instances, as a share of one instance's pool


def _fleet_findings(point, t: Thresholds, label: str) -> list[Finding]:
    """Free blocks per instance (the article's alert, one instance at a time) and the imbalance between them."""
    findings = []
    for instance in point.get("instances") or []:
        free = _num(instance.get("free_share_mean"))
        if free is not None and free < t.free_blocks:
            findings.append(Finding(
                "free_blocks", "warning", f"{label} instance {instance.get('index')}",
                f"free KV blocks averaged {pct(free)} of the instance's pool (< {pct(t.free_blocks)}); "
                f"it took {instance.get('routed')} requests and preempted {instance.get('preemptions')}",
                "add capacity (kvbench fleet --autoscale adds an instance above --scale-up usage) or route by free "
                "blocks (--policies most-free-blocks)", {"free_share_mean": free, "threshold": t.free_blocks}))
    total = max((_num(i.get("total_blocks")) or 0 for i in point.get("instances") or []), default=0)
    imbalance = _num(point.get("free_blocks_imbalance_mean"))
    if imbalance is not None and total and imbalance / total > IMBALANCE_SHARE:
        findings.append(Finding(
            "fleet_imbalance", "warning", label,
            f"free blocks differed by {imbalance:,.0f} blocks between the emptiest and the fullest instance on "
            f"average ({pct(imbalance / total)} of one pool > {pct(IMBALANCE_SHARE)})",
            "route by free KV blocks (--policies most-free-blocks) so no instance fills while another idles",
            {"free_blocks_imbalance_mean": imbalance, "share_of_pool": imbalance / total}))
    return findings


_POINT_RULES = (_rule_fragmentation, _rule_free_blocks, _rule_alloc_latency, _rule_preemptions, _rule_reservation,
                _rule_capped)


def diagnose_run(location: str | Path, thresholds: Thresholds) -> Diagnosis:
    from kvbench.report.summary_load import load_summary

    summary = load_summary(location)
    return diagnose_points(summary.points.values(), summary.meta, thresholds, str(summary.path))
