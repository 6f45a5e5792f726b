"""Rules over a live engine's metrics (one series per engine and device)."""

from __future__ import annotations

from kvbench.errors import KvbenchError
from kvbench.report.diagnose.exposition import Series, histogram_quantile, parse_exposition, scrape
from kvbench.report.diagnose.findings import Diagnosis, Finding, pct, sorted_findings
from kvbench.report.diagnose.thresholds import Thresholds


def diagnose_series(all_series: list[Series], thresholds: Thresholds, source: str = "") -> Diagnosis:
    t = thresholds
    findings: list[Finding] = []
    notes = ["reservation vs internal needs hindsight: live, reservation + internal is read from fragmentation"]
    checked = 0
    for series in all_series:
        v = series.values
        total, free, used = (v.get("kvbench_kv_cache_blocks_capacity"), v.get("kvbench_kv_cache_blocks_free"),
                             v.get("kvbench_kv_cache_blocks_used"))
        if total is None:
            continue
        checked += 1
        label = series.label
        frag = v.get("kvbench_kv_cache_fragmentation")
        layout = ("use the paged engine instead of contiguous slabs, reserve less (--reserve pow2), or a lower "
                  "max-len" if str(series.labels.get("engine", "")).startswith("contiguous") else "use a smaller --block-size")
        if frag is not None and frag > t.fragmentation:
            findings.append(Finding("fragmentation", "warning", label,
                                    f"online fragmentation {frag:.3f} > {t.fragmentation}", layout,
                                    {"fragmentation": frag, "threshold": t.fragmentation}))
        free_share = free / total if free is not None and total > 0 else None
        more_memory = ("give the KV cache more memory (--kv-memory, --gpu-memory-utilization) or route new "
                       "requests to the instance with the most free blocks")
        if free_share is not None and free_share < t.free_blocks:
            findings.append(Finding("free_blocks", "warning", label,
                                    f"{free:.0f} of {total:.0f} blocks free ({pct(free_share)} < "
                                    f"{pct(t.free_blocks)})", more_memory,
                                    {"free_share": free_share, "threshold": t.free_blocks}))
        p99 = histogram_quantile(0.99, series.buckets)
        if p99 is not None and p99 * 1000 > t.alloc_latency_p99_ms:
            findings.append(Finding("alloc_latency", "critical", label,
                                    f"block allocation latency p99 ~{p99 * 1000:.1f} ms (from histogram buckets) > "
                                    f"{t.alloc_latency_p99_ms:g} ms",
                                    "use a larger --block-size (fewer allocations); check the host for CPU contention",
                                    {"alloc_latency_p99_ms": p99 * 1000, "threshold_ms": t.alloc_latency_p99_ms}))
        preemptions, finished = v.get("kvbench_num_preemptions_total"), v.get("kvbench_requests_finished_total")
        if preemptions and finished is not None and preemptions / max(finished, 1.0) > t.preemptions_per_request:
            rate = preemptions / max(finished, 1.0)
            findings.append(Finding("preemption_storm", "warning", label,
                                    f"{preemptions:.0f} preemptions for {finished:.0f} finished requests "
                                    f"({rate:.2f} per request > {t.preemptions_per_request:g})", more_memory,
                                    {"preemptions_per_request": rate, "threshold": t.preemptions_per_request}))
        if frag is not None and used is not None and total > 0:
            share = frag * used / total
            if share > t.reservation_waste:
                findings.append(Finding("reservation_waste", "warning", label,
                                        f"reservation + internal hold {pct(share)} of the pool "
                                        f"(> {pct(t.reservation_waste)})", layout,
                                        {"reservation_internal_share": share, "threshold": t.reservation_waste}))
        waiting = v.get("kvbench_requests_waiting")
        if waiting and free_share is not None and free_share < t.free_blocks:
            findings.append(Finding("concurrency_capped", "warning", label,
                                    f"{waiting:.0f} requests wait while only {pct(free_share)} of the blocks are "
                                    f"free: the KV budget caps concurrency", more_memory,
                                    {"waiting": waiting, "free_share": free_share}))
    if not checked:
        raise KvbenchError(f"{source or 'the endpoint'} exposes no kvbench_kv_cache_blocks_capacity series")
    return Diagnosis(source, thresholds, sorted_findings(findings), checked, notes)


def diagnose_url(url: str, thresholds: Thresholds) -> Diagnosis:
    return diagnose_series(parse_exposition(scrape(url)), thresholds, url)
