"""``kvbench diagnose``: rules over recorded results or live Prometheus metrics, each finding with evidence
and a concrete suggestion, and the same rules as Prometheus alerting rules.

Defaults come from the seed article (fragmentation > 0.3, free blocks < 10% of the pool, block allocation
latency p99 > 50 ms) plus what the data makes obvious: preemption storms, a baseline that spends most of
its pool on reservation, and a KV budget so small that it caps concurrency.
"""

from __future__ import annotations

import math
import re
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

import tomllib

from kvbench.errors import KvbenchError

SEVERITIES = ("critical", "warning", "info")
_DURATION = re.compile(r"^(\d+(ms|s|m|h|d|w|y))+$")


@dataclass(frozen=True)
class Thresholds:
    fragmentation: float = 0.3  # online fragmentation 1 - used / allocated
    free_blocks: float = 0.10  # free blocks as a share of the pool (below: too little headroom)
    alloc_latency_p99_ms: float = 50.0  # p99 of one block allocation call
    preemptions_per_request: float = 0.5  # preemptions per completed request
    reservation_waste: float = 0.5  # reservation + internal as a share of the pool
    alert_for: str = "5m"  # Prometheus `for:` of the emitted alerts

    FRACTIONS = ("fragmentation", "free_blocks", "reservation_waste")

    def validate(self) -> Thresholds:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "alert_for":
                if not isinstance(value, str) or not _DURATION.match(value):
                    raise KvbenchError(f"threshold alert_for: {value!r} is not a Prometheus duration such as 5m")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise KvbenchError(f"threshold {f.name}: {value!r} must be a non-negative number")
            if f.name in self.FRACTIONS and value > 1:
                raise KvbenchError(f"threshold {f.name}: {value!r} is a fraction of the pool, between 0 and 1")
        return self

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_thresholds(path: Path | None, **overrides: Any) -> Thresholds:
    """Defaults, then a TOML file (top-level keys or a [thresholds] table), then non-None ``overrides``."""
    thresholds = Thresholds()
    if path is not None:
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except OSError as err:
            raise KvbenchError(f"cannot read thresholds file {path}: {err.strerror or err}") from None
        except tomllib.TOMLDecodeError as err:
            raise KvbenchError(f"thresholds file {path} is not valid TOML: {err}") from None
        table = data.get("thresholds", data) if isinstance(data.get("thresholds"), dict) else data
        known = {f.name for f in fields(Thresholds)}
        values = {}
        for key, value in table.items():
            name = "alert_for" if key == "for" else key
            if name not in known:
                raise KvbenchError(f"thresholds file {path}: unknown key {key!r}; known: {', '.join(sorted(known))}")
            values[name] = float(value) if isinstance(value, int) and not isinstance(value, bool) else value
        thresholds = replace(thresholds, **values)
    thresholds = replace(thresholds, **{k: v for k, v in overrides.items() if v is not None})
    return thresholds.validate()


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: str
    source: str  # the point ("contiguous C=10") or series ("engine=paged device=cpu") it came from
    evidence: str
    suggestion: str
    values: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "values": dict(self.values)}


@dataclass
class Diagnosis:
    source: str  # run directory or URL
    thresholds: Thresholds
    findings: list[Finding]
    checked: int  # points or series examined
    notes: list[str]

    @property
    def fired(self) -> bool:
        return bool(self.findings)

    def as_dict(self) -> dict[str, Any]:
        return {"source": self.source, "thresholds": self.thresholds.as_dict(), "checked": self.checked,
                "fired": self.fired, "findings": [f.as_dict() for f in self.findings], "notes": self.notes}


def _sorted(findings: Iterable[Finding]) -> list[Finding]:
    return sorted(findings, key=lambda f: (SEVERITIES.index(f.severity), f.source, f.rule))


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


# -- recorded results ---------------------------------------------------------------------------------------
def diagnose_points(points: Iterable[Mapping[str, Any]], meta: Mapping[str, Any], thresholds: Thresholds,
                    source: str = "") -> Diagnosis:
    findings: list[Finding] = []
    notes: list[str] = []
    checked = 0
    for point in points:
        label = f"{point.get('engine')} C={point.get('concurrency')}"
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
    return Diagnosis(source, thresholds, _sorted(findings), checked, notes)


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
                   f"{_pct(value)} of the allocated KV slots hold no token state",
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
    at_peak = f"; at peak allocation {_pct(1 - peak / pool)} were free" if pool and peak is not None else ""
    return Finding("free_blocks", "warning", label,
                   f"free KV blocks averaged {_pct(free)} of the pool (< {_pct(t.free_blocks)}){at_peak}",
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
                   f"reservation + internal fragmentation took {_pct(share)} of the pool on average "
                   f"(> {_pct(t.reservation_waste)}); token states only {waste.get('token_state_pct', 0):.1f}%",
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


_POINT_RULES = (_rule_fragmentation, _rule_free_blocks, _rule_alloc_latency, _rule_preemptions, _rule_reservation,
                _rule_capped)


def diagnose_run(location: str | Path, thresholds: Thresholds) -> Diagnosis:
    from kvbench.report.summary_load import load_summary

    summary = load_summary(location)
    return diagnose_points(summary.points.values(), summary.meta, thresholds, str(summary.path))


# -- live metrics -------------------------------------------------------------------------------------------
def scrape(url: str, timeout_s: float = 5.0) -> str:
    if not url.startswith(("http://", "https://")):
        raise KvbenchError(f"metrics URL {url!r}: expected http://HOST:PORT/metrics")
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:  # noqa: S310 (user-given http URL)
            return response.read().decode("utf-8")
    except urllib.error.URLError as err:
        raise KvbenchError(f"cannot scrape {url}: {getattr(err, 'reason', err)}") from None
    except OSError as err:
        raise KvbenchError(f"cannot scrape {url}: {err}") from None


@dataclass
class Series:
    """The kvbench samples of one (engine, device)."""

    labels: dict[str, str]
    values: dict[str, float]
    buckets: list[tuple[float, float]]  # (le, cumulative count) of the allocation latency histogram

    @property
    def label(self) -> str:
        return " ".join(f"{k}={v}" for k, v in sorted(self.labels.items()))


def parse_exposition(text: str) -> list[Series]:
    """kvbench series from Prometheus exposition text, grouped by their engine and device labels."""
    from prometheus_client.parser import text_string_to_metric_families

    grouped: dict[tuple, Series] = {}
    try:
        families = list(text_string_to_metric_families(text))
    except Exception as err:
        raise KvbenchError(f"not Prometheus exposition text: {err}") from None
    for family in families:
        for sample in family.samples:
            if not sample.name.startswith("kvbench_"):
                continue
            labels = {k: v for k, v in sample.labels.items() if k in ("engine", "device")}
            series = grouped.setdefault(tuple(sorted(labels.items())), Series(labels, {}, []))
            if sample.name.endswith("_bucket") and "le" in sample.labels:
                series.buckets.append((float(sample.labels["le"]), float(sample.value)))
            else:
                series.values[sample.name] = float(sample.value)
    for series in grouped.values():
        series.buckets.sort()
    return list(grouped.values())


def histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float | None:
    """Prometheus' histogram_quantile over cumulative (le, count) buckets; None without observations."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    rank = q * total
    lower_le, lower_count = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if math.isinf(le):
                return lower_le
            if count == lower_count:
                return le
            return lower_le + (le - lower_le) * (rank - lower_count) / (count - lower_count)
        lower_le, lower_count = le, count
    return buckets[-1][0]


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
                                    f"{free:.0f} of {total:.0f} blocks free ({_pct(free_share)} < "
                                    f"{_pct(t.free_blocks)})", more_memory,
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
                                        f"reservation + internal hold {_pct(share)} of the pool "
                                        f"(> {_pct(t.reservation_waste)})", layout,
                                        {"reservation_internal_share": share, "threshold": t.reservation_waste}))
        waiting = v.get("kvbench_requests_waiting")
        if waiting and free_share is not None and free_share < t.free_blocks:
            findings.append(Finding("concurrency_capped", "warning", label,
                                    f"{waiting:.0f} requests wait while only {_pct(free_share)} of the blocks are "
                                    f"free: the KV budget caps concurrency", more_memory,
                                    {"waiting": waiting, "free_share": free_share}))
    if not checked:
        raise KvbenchError(f"{source or 'the endpoint'} exposes no kvbench_kv_cache_blocks_capacity series")
    return Diagnosis(source, thresholds, _sorted(findings), checked, notes)


def diagnose_url(url: str, thresholds: Thresholds) -> Diagnosis:
    return diagnose_series(parse_exposition(scrape(url)), thresholds, url)


# -- Prometheus alerting rules -------------------------------------------------------------------------------
def alerting_rules(t: Thresholds) -> dict[str, Any]:
    """Prometheus alerting rules (groups -> rules) with the same thresholds and DESIGN.md metric names."""
    free_share = "kvbench_kv_cache_blocks_free / kvbench_kv_cache_blocks_capacity"
    where = "{{ $labels.engine }} on {{ $labels.device }} ({{ $labels.instance }})"

    def rule(alert, expr, severity, summary, description):
        return {"alert": alert, "expr": expr, "for": t.alert_for, "labels": {"severity": severity},
                "annotations": {"summary": summary, "description": description}}

    rules = [
        rule("KvCacheFragmentationHigh", f"kvbench_kv_cache_fragmentation > {t.fragmentation:g}", "warning",
             f"KV cache fragmentation above {t.fragmentation:g}",
             f"{where}: online fragmentation is {{{{ $value | humanizePercentage }}}}. Use the paged engine, "
             "a smaller block size, or a lower max-len."),
        rule("KvCacheFreeBlocksLow", f"{free_share} < {t.free_blocks:g}", "warning",
             f"KV cache free blocks below {_pct(t.free_blocks)} of the pool",
             f"{where}: only {{{{ $value | humanizePercentage }}}} of the KV blocks are free. Give the KV cache "
             "more memory or route new requests to the instance with the most free blocks."),
        rule("KvBlockAllocLatencyHigh",
             "histogram_quantile(0.99, sum by (le, engine, device, instance) "
             f"(rate(kvbench_block_alloc_latency_seconds_bucket[5m]))) > {t.alloc_latency_p99_ms / 1000:g}",
             "critical", f"KV block allocation p99 latency above {t.alloc_latency_p99_ms:g} ms",
             f"{where}: p99 block allocation latency is {{{{ $value | humanizeDuration }}}}. Use a larger block "
             "size or check the host for CPU contention."),
        rule("KvPreemptionStorm",
             "increase(kvbench_num_preemptions_total[10m]) / clamp_min(increase(kvbench_requests_finished_total[10m]), 1)"
             f" > {t.preemptions_per_request:g}", "warning",
             f"More than {t.preemptions_per_request:g} preemptions per finished request",
             f"{where}: {{{{ $value }}}} preemptions per finished request over 10m. Give the KV cache more "
             "memory or lower the concurrency."),
        rule("KvCacheReservationWaste",
             "kvbench_kv_cache_fragmentation * kvbench_kv_cache_blocks_used / kvbench_kv_cache_blocks_capacity"
             f" > {t.reservation_waste:g}", "warning",
             f"Reservation + internal fragmentation above {_pct(t.reservation_waste)} of the KV pool",
             f"{where}: {{{{ $value | humanizePercentage }}}} of the pool is reserved but holds no token state. "
             "Use the paged engine or reserve less."),
        rule("KvBudgetCapsConcurrency", f"kvbench_requests_waiting > 0 and {free_share} < {t.free_blocks:g}",
             "warning", "Requests wait for KV memory",
             f"{where}: requests are queued while fewer than {_pct(t.free_blocks)} of the blocks are free: the KV "
             "budget caps concurrency. Give the KV cache more memory."),
    ]
    return {"groups": [{"name": "kvbench-kv-cache", "rules": rules}]}


def rules_yaml(thresholds: Thresholds) -> str:
    import yaml

    header = ("# Prometheus alerting rules for kvbench metrics (generated by `kvbench diagnose "
              "--emit-prometheus-rules`)\n")
    return header + yaml.safe_dump(alerting_rules(thresholds), sort_keys=False, width=120)
