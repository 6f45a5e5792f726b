"""Why a server's prefix-cache hits were lost, from what a point recorded: its requests' cached tokens, what
the same requests allow (``workload``: an unbounded cache's hits in the order they were sent), and the server's
own KV events (eviction churn and thrash).

Each rule speaks in the server's own options (``remedies``): eviction thrash (removed blocks stored again within
the thrash window: the cache is too small for the workload's reuse), shared prefixes shorter than one block
(never served, whatever the memory), prefix caching off while the prompts share prefixes, and a hit rate far
below the unbounded cache's (eviction, or a scheduling or configuration difference worth a look) or, for a
replayed trace, below what kvbench's simulation of it predicts with the server's own KV blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvbench import units
from kvbench.report.diagnose.findings import Finding, NotEvaluated
from kvbench.report.diagnose.remedies import render
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.results.endpoint_figures import EndpointFigures, KvEventsSummary, TraceFigures
from kvbench.results.prefix_reuse_figures import PrefixReuse

MIN_REMOVED = 10  # fewer removals say nothing about thrash
MIN_REQUESTS = 4  # fewer requests say nothing about the workload's sharing


def reuse_findings(
    point: Mapping[str, Any], label: str, t: Thresholds
) -> tuple[list[Finding], list[NotEvaluated], list[str]]:
    """The reuse rules over one server point: findings, rules the data cannot decide, notes."""
    figures = EndpointFigures.from_json(point)
    reuse = figures.prefix_reuse or PrefixReuse()
    events, workload, trace = figures.kv_events, reuse.workload, figures.trace
    family = next(iter((figures.scrapes.families if figures.scrapes else None) or []), "vllm")
    context = {"block_size": workload.block_size if workload else None}
    findings: list[Finding] = []
    skipped: list[NotEvaluated] = []
    notes: list[str] = []

    def find(rule: str, severity: str, evidence: str, remedies: tuple[str, ...], values: dict[str, Any]) -> None:
        findings.append(
            Finding(rule, severity, label, evidence, render(remedies, family, context), values, remedies, family)
        )

    rate = _share(reuse.hit_rate_requests)
    if rate is None:
        rate = _share(reuse.hit_rate_counters)
    if events is not None:
        _thrash(events, t, find, skipped, label, trace)
        if events.flag:
            notes.append(f"{label}: KV events: {events.flag}")
    if reuse.flag:
        notes.append(f"{label}: cached tokens: {reuse.flag}")
    if workload is None or reuse.requests < MIN_REQUESTS:
        skipped.append(
            NotEvaluated(
                "prefix_reuse",
                label,
                "the requests' own reuse is unknown (text prompts, too few requests, or no block size from the server)",
            )
        )
        return findings, skipped, notes
    ideal = _share(workload.ideal_hit_rate)
    requests = reuse.requests
    short = workload.requests_sharing_under_one_block
    block = workload.block_size
    if short and short >= 0.1 * requests:
        find(
            "prefix_shorter_than_block",
            "warning",
            f"{short} of {requests} requests start like an earlier one but share less than one block "
            f"({block} tokens) with it: a block-granular prefix cache never serves such a prefix",
            ("prefix_at_least_one_block",),
            {"requests": short, "block_size": block},
        )
    predicted = _share(trace.predicted_hit_rate) if trace else None
    if predicted is not None and rate is not None and predicted - rate > t.max_reuse_gap:
        find(
            "hit_rate_below_prediction",
            "warning",
            f"prefix-cache hit rate {units.share(rate)}, {units.share(predicted - rate)} below the "
            f"{units.share(predicted)} kvbench's "
            "simulation of the same trace predicts with the server's KV blocks: a scheduling or configuration "
            "difference worth a look (or a cache shared with other clients)",
            ("more_kv_memory", "shareable_prefixes"),
            {"hit_rate": rate, "predicted_hit_rate": predicted},
        )
    if ideal is None or rate is None:
        return findings, skipped, notes
    if ideal >= 0.1 and rate == 0:
        find(
            "prefix_caching_off",
            "warning",
            f"the server served no prompt token from its prefix cache, while these requests would find "
            f"{units.share(ideal)} of theirs in an unbounded one: prefix caching is off, or every prefix was evicted",
            ("enable_prefix_caching", "more_kv_memory"),
            {"hit_rate": rate, "ideal_hit_rate": ideal},
        )
    elif ideal - rate > t.max_reuse_gap:
        churn = events.kv_eviction_churn_per_s if events else None
        why = (
            f"; the server evicted {churn:.1f} blocks/s meanwhile"
            if isinstance(churn, (int, float)) and churn > 0
            else ""
        )
        find(
            "hit_rate_below_ideal",
            "warning",
            f"prefix-cache hit rate {units.share(rate)}, {units.share(ideal - rate)} below the {units.share(ideal)} "
            f"an unbounded cache serves the same requests in the same order{why}: eviction, or a scheduling or "
            "configuration difference worth a look",
            ("more_kv_memory", "shareable_prefixes"),
            {"hit_rate": rate, "ideal_hit_rate": ideal, "gap": ideal - rate},
        )
    return findings, skipped, notes


def _thrash(
    events: KvEventsSummary,
    t: Thresholds,
    find: Any,
    skipped: list[NotEvaluated],
    label: str,
    trace: TraceFigures | None,
) -> None:
    share, removed, window = _share(events.kv_thrash_share), events.kv_blocks_removed, events.kv_thrash_window_s
    if share is None or not isinstance(removed, int) or removed < MIN_REMOVED:
        skipped.append(NotEvaluated("kv_eviction_thrash", label, "too few blocks were removed to judge thrash"))
        return
    if share > t.max_thrash_share:
        churn = events.kv_eviction_churn_per_s
        find(
            "kv_eviction_thrash",
            "warning",
            f"{units.share(share)} of the {removed:,} KV blocks the server removed were stored again "
            f"within {window:g} s "
            f"({churn:.1f} removals/s): it evicts prefixes it needs again soon{_more_memory(trace)}",
            ("more_kv_memory", "lower_concurrency"),
            {"thrash_share": share, "removed": removed, "window_s": window, "churn_per_s": churn},
        )


def _more_memory(trace: TraceFigures | None) -> str:
    """What kvbench's simulation of a replayed trace says more KV blocks would keep, in words ('' without one)."""
    if trace is None:
        return ""
    now = _share(trace.predicted_hit_rate)
    steps = [
        (blocks, rate)
        for blocks, rate in trace.predicted_with_more_blocks
        if isinstance(blocks, int) and _share(rate) is not None
    ]
    if now is None or not steps:
        return ""
    said = ", ".join(f"{units.share(rate)} with {blocks:,} blocks" for blocks, rate in steps)
    return f"; kvbench's simulation of the trace predicts {units.share(now)} with the server's blocks, {said}"


def _share(value: object) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        return None
    return float(value)
