"""Rules over a run's recorded points: each finding with its evidence and a suggestion."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvbench import units
from kvbench.errors import KvbenchError
from kvbench.fileio import run_file
from kvbench.json_input import read_text
from kvbench.measure.kv_residency import read_kv_events_text, rebuild
from kvbench.report.diagnose.findings import (
    Diagnosis,
    Finding,
    Measurement,
    NotEvaluated,
    sorted_findings,
)
from kvbench.report.diagnose.remedies import render
from kvbench.report.diagnose.reuse_rules import reuse_findings
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.report.diagnose.watch_timeline import NoScrapes, diagnose_timeline
from kvbench.results.diagnosed_point import DiagnosedPoint
from kvbench.results.endpoint_figures import EndpointFigures, is_endpoint_point
from kvbench.results.fleet_point import FleetInstance
from kvbench.results.run_meta import RunMeta
from kvbench.results.summary_load import load_summary
from kvbench.values import number


def _command_of(meta: RunMeta) -> str | None:
    """The kvbench command that made a run (``meta.command`` is ``kvbench <command> ...``): its flags are the
    ones a suggestion may name."""
    words = (meta.command or "").split()
    return words[1] if len(words) > 1 and words[0] == "kvbench" else None


def _finding(
    command: str | None,
    rule: str,
    severity: str,
    label: str,
    evidence: str,
    remedies: tuple[str, ...],
    values: dict,
    context: Mapping[str, Any] | None = None,
) -> Finding:
    """A finding on a kvbench run: its remedies name the settings of the command that made it (a sweep sizes
    every engine's KV budget, vLLM's reference column included)."""
    context = {**(context or {}), "command": command}
    return Finding(rule, severity, label, evidence, render(remedies, "kvbench", context), values, remedies)


def diagnose_points(
    points: Iterable[Mapping[str, Any]],
    meta: RunMeta,
    thresholds: Thresholds,
    source: str = "",
    directory: Path | None = None,
    kind: str | None = None,
) -> Diagnosis:
    """The rules over each point; a point measured against a server over HTTP is judged by the live rules over
    the scrapes it recorded (``watch-*.jsonl`` in ``directory``), as ``kvbench diagnose`` judges a watch.
    ``kind`` (the summary's: sweep, waste, fleet) names the command whose flags advice may use when the run's
    metadata does not record its command line."""
    if _command_of(meta) is None and kind is not None:  # not recorded: the kind names the command
        meta = replace(meta, command=f"kvbench {kind}")
    command = _command_of(meta)
    findings: list[Finding] = []
    notes: list[str] = []
    skipped: list[NotEvaluated] = []
    measured: list[Measurement] = []
    checked = 0
    for data in points:
        if is_endpoint_point(data):
            checked += 1
            live = _endpoint_diagnosis(data, thresholds, directory)
            findings += live.findings
            skipped += live.not_evaluated
            measured += live.measurements
            notes += live.notes
            continue
        point = DiagnosedPoint.from_json(data)
        label = point.label
        if point.status == "error":  # a point that measured nothing is itself the worst finding
            findings.append(
                _finding(
                    command,
                    "point_failed",
                    "critical",
                    label,
                    f"the point failed and measured nothing: {point.error or 'no reason given'}",
                    ("rerun_failed_point",),
                    {"status": "error"},
                )
            )
            continue
        checked += 1
        waste = command == "waste"  # it fills the pool on purpose: only each strategy's layout counts
        rules: tuple[Callable[..., Finding | None], ...] = _LAYOUT_RULES if waste else _POINT_RULES
        if waste:
            notes.append(
                "a waste run fills the KV pool on purpose to measure its shares: free blocks, capped "
                "concurrency, preemptions and allocation latency are not judged"
            )
        for rule in rules:
            finding = rule(point, meta, thresholds, label)
            if finding is not None:
                findings.append(finding)
        if point.is_fleet:  # a fleet point: each instance, and the balance between them
            findings += _fleet_findings(point, thresholds, label)
    return Diagnosis(
        source, thresholds, sorted_findings(findings), checked, list(dict.fromkeys(notes)), skipped, measured
    )


def _endpoint_diagnosis(data: Mapping[str, Any], thresholds: Thresholds, directory: Path | None) -> Diagnosis:
    """A server point: its failed requests, then the live rules over its recorded scrapes, labelled by point."""
    point, figures = DiagnosedPoint.from_json(data), EndpointFigures.from_json(data)
    rate = figures.request_rate
    label = point.label if rate is None else f"{point.engine} {rate:g} req/s"
    findings: list[Finding] = []
    if point.status == "error":
        findings.append(
            Finding(
                "requests_failed",
                "critical",
                label,
                str(point.error or "requests failed"),
                render(("check_failed_requests",), "vllm"),
                {"failed": figures.failed},
                ("check_failed_requests",),
                "vllm",
            )
        )
    reuse, reuse_skipped, reuse_notes = reuse_findings(data, label, thresholds)
    findings += reuse
    reuse_measured = _thrash_curve(figures.kv_events_file, label, directory, reuse_notes)
    timeline_file = figures.timeline_file or ""
    watch = (
        run_file(directory, "watch-" + timeline_file.removeprefix("timeline-").removesuffix(".json") + ".jsonl")
        if directory is not None and timeline_file
        else None
    )
    live, missing = None, "no recorded scrapes of the server's /metrics to judge its KV cache by"
    if watch is not None and watch.is_file():
        duration = point.duration
        try:
            live = diagnose_timeline(watch, thresholds, (0.0, duration) if duration is not None else None)
        except NoScrapes as err:
            failed = f"all {err.failed} scrapes of the server's /metrics failed" if err.failed else "no scrape"
            missing = f"{failed}: nothing to judge its KV cache by"
    if live is None:
        return Diagnosis(
            label, thresholds, findings, 1, [f"{label}: {missing}", *reuse_notes], reuse_skipped, reuse_measured
        )
    relabel = [replace(f, source=f"{label}: {f.source}") for f in live.findings]
    return Diagnosis(
        label,
        thresholds,
        findings + relabel,
        1,
        live.notes + reuse_notes,
        reuse_skipped + [replace(n, source=f"{label}: {n.source}") for n in live.not_evaluated],
        reuse_measured + [replace(m, source=f"{label}: {m.source}") for m in live.measurements],
    )


THRASH_CURVE_S = (1.0, 10.0, 60.0)  # windows the recorded events are re-read at
KV_EVENTS_FILE_BYTES = 1 << 30  # 2M events kept at most, a few hundred MB as JSON


def _thrash_curve(name: str | None, label: str, directory: Path | None, notes: list[str]) -> list[Measurement]:
    """A point's recorded KV events (``name``, in ``directory``) re-read: the share of removed blocks stored again
    within 1, 10 and 60 s (how soon what the server evicts comes back). An unreadable file is a note, never a
    guess."""
    if directory is None or not isinstance(name, str):
        return []
    try:
        _, changes = read_kv_events_text(read_text(run_file(directory, name), max_bytes=KV_EVENTS_FILE_BYTES))
    except (OSError, ValueError, KvbenchError) as err:
        notes.append(f"{label}: its KV events file cannot be read: {err}")
        return []
    out = []
    for window in THRASH_CURVE_S:
        share = rebuild(changes, window, complete=True).thrash_share
        text = (
            "no block was removed"
            if share is None
            else f"{units.share(share)} of the removed KV blocks were stored again within {window:g} s"
        )
        out.append(Measurement(label, f"kv_thrash_share_{window:g}s", share, text))
    return out


def _layout(point: DiagnosedPoint, meta: RunMeta) -> tuple[tuple[str, ...], dict[str, Any]]:
    """The remedy for KV slots held without token states: the contiguous slab layout, or the block size."""
    engine = point.engine or ""
    if engine.startswith("contiguous"):
        return ("layout",), {"reserve": meta.reserve_policy, "max_len": meta.max_len}
    block_size = engine.split("-", 1)[1] if engine.startswith("paged-") else meta.block_size
    return ("smaller_blocks",), {"block_size": block_size}


def _rule_fragmentation(point: DiagnosedPoint, meta: RunMeta, t: Thresholds, label: str) -> Finding | None:
    value = point.fragmentation_mean
    if value is None or value <= t.fragmentation:
        return None
    remedies, context = _layout(point, meta)
    return _finding(
        _command_of(meta),
        "fragmentation",
        "warning",
        label,
        f"mean online fragmentation {value:.3f} (1 - used / allocated) > {t.fragmentation}: "
        f"{units.share(value)} of the allocated KV slots hold no token state",
        remedies,
        {"fragmentation_mean": value, "threshold": t.fragmentation},
        context,
    )


def _rule_free_blocks(point: DiagnosedPoint, meta: RunMeta, t: Thresholds, label: str) -> Finding | None:
    free = point.waste.free_share
    if free is None or free >= t.free_blocks:
        return None
    pool, peak = point.kv_pool_bytes, point.kv_peak_allocated_bytes
    at_peak = f"; at peak allocation {units.share(1 - peak / pool)} were free" if pool and peak is not None else ""
    return _finding(
        _command_of(meta),
        "free_blocks",
        "warning",
        label,
        f"free KV blocks averaged {units.share(free)} of the pool (< {units.share(t.free_blocks)}){at_peak}",
        ("more_kv_memory", "lower_concurrency", "route_to_free"),
        {"free_share_mean": free, "threshold": t.free_blocks},
    )


def _rule_alloc_latency(point: DiagnosedPoint, meta: RunMeta, t: Thresholds, label: str) -> Finding | None:
    p99 = point.alloc_latency_p99_s
    if p99 is None or p99 * 1000 <= t.alloc_latency_p99_ms:
        return None
    return _finding(
        _command_of(meta),
        "alloc_latency",
        "critical",
        label,
        f"block allocation latency p99 {p99 * 1000:.1f} ms > {t.alloc_latency_p99_ms:g} ms over "
        f"{point.alloc_count} allocation calls; allocation sits on the step's "
        "critical path",
        ("larger_blocks", "check_host"),
        {"alloc_latency_p99_ms": p99 * 1000, "threshold_ms": t.alloc_latency_p99_ms},
    )


def _rule_preemptions(point: DiagnosedPoint, meta: RunMeta, t: Thresholds, label: str) -> Finding | None:
    preemptions, completed = point.preemptions, point.completed
    if not preemptions or completed is None:
        return None
    rate = preemptions / max(completed, 1.0)
    if rate <= t.preemptions_per_request:
        return None
    return _finding(
        _command_of(meta),
        "preemption_storm",
        "warning",
        label,
        f"{preemptions:.0f} preemptions for {completed:.0f} completed requests "
        f"({rate:.2f} per request > {t.preemptions_per_request:g}): recompute wastes work",
        ("more_kv_memory", "lower_concurrency"),
        {"preemptions_per_request": rate, "threshold": t.preemptions_per_request},
    )


def _rule_reservation(point: DiagnosedPoint, meta: RunMeta, t: Thresholds, label: str) -> Finding | None:
    waste = point.waste
    reservation, internal = waste.reservation_pct, waste.internal_pct
    if reservation is None or internal is None:
        return None
    share = (reservation + internal) / 100.0
    if share <= t.reservation_waste:
        return None
    remedies, context = _layout(point, meta)
    return _finding(
        _command_of(meta),
        "reservation_waste",
        "warning",
        label,
        f"reservation + internal fragmentation took {units.share(share)} of the pool on average "
        f"(> {units.share(t.reservation_waste)}); token states only {waste.token_state_pct or 0:.1f}%",
        remedies,
        {"reservation_internal_share": share, "threshold": t.reservation_waste},
        context,
    )


def _rule_capped(point: DiagnosedPoint, meta: RunMeta, t: Thresholds, label: str) -> Finding | None:
    concurrency = number(point.concurrency)
    peak = point.peak_running
    remedies: tuple[str, ...] = ("more_kv_memory",)
    context: dict[str, Any] = {}
    if (point.engine or "").startswith("contiguous"):  # the paged engine fits more in the same budget
        remedies, context = ("more_kv_memory", "layout"), _layout(point, meta)[1]
    if point.status == "oom":
        evidence = f"OOM: {point.status_reason or 'requests rejected for lack of KV memory'}"
        if peak is not None and concurrency is not None:
            evidence += f" (peak running {peak:.0f} of concurrency {concurrency:.0f})"
        return _finding(
            _command_of(meta),
            "concurrency_capped",
            "critical",
            label,
            evidence,
            remedies,
            {"peak_running": peak, "concurrency": concurrency, "status": "oom"},
            context,
        )
    if concurrency is None or peak is None:
        return None
    offered = concurrency
    total = (point.completed or 0) + (point.rejected or 0)
    if total:
        offered = min(offered, total)
    if peak >= offered or peak >= meta.max_num_seqs:
        return None
    return _finding(
        _command_of(meta),
        "concurrency_capped",
        "warning",
        label,
        f"at most {peak:.0f} of {offered:.0f} requests ran at once: the KV budget caps concurrency",
        remedies,
        {"peak_running": peak, "concurrency": concurrency},
        context,
    )


IMBALANCE_SHARE = 0.25  # mean free-block spread over one pool (pools of different sizes: mean usage spread)


def _fleet_findings(point: DiagnosedPoint, t: Thresholds, label: str) -> list[Finding]:
    """Free blocks per instance (the article's alert, one instance at a time) and the imbalance between them."""
    findings = []
    for instance in point.instances:
        free = instance.free_share_mean
        if free is not None and free < t.free_blocks:
            findings.append(
                _finding(
                    "fleet",
                    "free_blocks",
                    "warning",
                    f"{label} instance {instance.index}",
                    f"free KV blocks averaged {units.share(free)} of the instance's pool "
                    f"(< {units.share(t.free_blocks)}); "
                    f"it took {instance.routed} requests and preempted {instance.preemptions}",
                    ("add_instance", "route_by_free_blocks"),
                    {"free_share_mean": free, "threshold": t.free_blocks},
                )
            )
    pools = {i.total_blocks for i in point.instances}
    if len(pools) > 1:  # pools of different sizes: their free blocks differ however well they are loaded
        return findings + _usage_spread(point.instances, label)
    total = max((p or 0 for p in pools), default=0)
    imbalance = point.free_blocks_imbalance_mean
    if imbalance is not None and total and imbalance / total > IMBALANCE_SHARE:
        findings.append(
            _finding(
                "fleet",
                "fleet_imbalance",
                "warning",
                label,
                f"free blocks differed by {imbalance:,.0f} blocks between the emptiest and the fullest instance on "
                f"average ({units.share(imbalance / total)} of one pool > {units.share(IMBALANCE_SHARE)})",
                ("route_by_free_blocks",),
                {"free_blocks_imbalance_mean": imbalance, "share_of_pool": imbalance / total},
            )
        )
    return findings


def _usage_spread(instances: list[FleetInstance], label: str) -> list[Finding]:
    """The imbalance of instances with pools of different sizes: the spread of their mean KV usage, in points."""
    known = [u for u in (i.usage_mean for i in instances) if u is not None]
    spread = max(known) - min(known) if len(known) > 1 else 0.0
    if spread <= IMBALANCE_SHARE:
        return []
    pools = "/".join(f"{i.total_blocks or 0:,.0f}" for i in instances)
    return [
        _finding(
            "fleet",
            "fleet_imbalance",
            "warning",
            label,
            f"mean KV usage differed by {100 * spread:.0f} points between the fullest and the emptiest instance "
            f"(pools of {pools} blocks; > {100 * IMBALANCE_SHARE:.0f} points)",
            ("route_by_free_blocks",),
            {"usage_spread": spread, "threshold": IMBALANCE_SHARE},
        )
    ]


_POINT_RULES = (
    _rule_fragmentation,
    _rule_free_blocks,
    _rule_alloc_latency,
    _rule_preemptions,
    _rule_reservation,
    _rule_capped,
)
_LAYOUT_RULES = (_rule_fragmentation, _rule_reservation)


def diagnose_run(location: str | Path, thresholds: Thresholds) -> Diagnosis:
    summary = load_summary(location)
    try:
        return diagnose_points(
            summary.points.values(),
            RunMeta.from_json(summary.meta),
            thresholds,
            str(summary.path),
            summary.path.parent,
            summary.kind,
        )
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        # a summary edited by hand, or written by another version: say what is wrong, in one line
        raise KvbenchError(
            f"{summary.path}: cannot diagnose it, its points lack or mistype a field ({type(err).__name__}: {err})"
        ) from None
