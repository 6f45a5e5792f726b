"""Rules over a live engine's metrics: one scrape, or a timeline of scrapes (``kvbench watch``).

The same rules as over recorded runs, where the engine exposes what they need: free blocks under the
threshold, preemption storms, requests waiting (for memory, or at low KV usage for the scheduler's batch cap),
plus the prefix-cache hit rate. A rule an engine's metrics cannot decide (vLLM has no fragmentation or
allocation-latency metric) is listed as not evaluated, with kvbench's estimate of paging's internal waste
(half a block per running request) marked as an estimate. Counters are judged over the watched window when
there is one, else since the engine started; gauges at the last scrape, free blocks also over the window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench import units
from kvbench.report.diagnose.findings import (
    Diagnosis,
    Finding,
    Measurement,
    NotEvaluated,
    sorted_findings,
)
from kvbench.report.diagnose.remedies import render
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.results.exposition import histogram_quantile, scrape
from kvbench.results.servers import ServerState, read_states

NO_FRAGMENTATION = {
    "vllm": "vLLM exposes no fragmentation metric: kv_cache_usage_perc counts blocks in use, not how full they are",
    "sglang": "SGLang exposes no fragmentation metric, only the share of its token pool in use",
    "kvbench": "the exposition has no kvbench_kv_cache_fragmentation",
}
NO_RESERVATION = {
    "vllm": "vLLM allocates blocks as tokens arrive and reserves none ahead, so there is no reservation to "
    "measure; the empty tails of partly filled blocks are estimated below",
    "sglang": "SGLang allocates its token pool as tokens arrive and exposes no reservation",
    "kvbench": "the exposition has no kvbench_kv_cache_fragmentation",
}
NO_ALLOC_LATENCY = {
    "vllm": "vLLM exposes no block-allocation latency",
    "sglang": "SGLang exposes no allocation latency",
    "kvbench": "no block allocation was observed (kvbench_block_alloc_latency_seconds is empty)",
}
NO_PREEMPTIONS = {
    "sglang": "this SGLang exposes no cumulative retraction counter (num_retracted_requests_total) with its "
    "finished requests",
}


def seconds(value: float) -> str:
    return f"{value:.1f} s" if value < 10 else f"{value:,.0f} s"


@dataclass
class Window:
    """The scrapes of one engine instance, oldest first: one for ``diagnose --url``, many from a watch."""

    samples: list[tuple[float, ServerState]]  # (seconds since the first scrape, state)

    @property
    def last(self) -> ServerState:
        return self.samples[-1][1]

    @property
    def span_s(self) -> float:
        return self.samples[-1][0] - self.samples[0][0]

    def counter(self, name: str) -> tuple[float | None, str]:
        """A counter's increase over the window (since the engine started, for one scrape) and how it was
        measured. A counter that went down (the engine restarted) counts from its last start."""
        values = [(t, getattr(s, name)) for t, s in self.samples if getattr(s, name) is not None]
        if not values:
            return None, ""
        if len(self.samples) < 2 or len(values) < 2:
            return values[-1][1], "since the engine started"
        first, last = values[0][1], values[-1][1]
        return (last - first if last >= first else last), f"over the {seconds(self.span_s)} watched"

    def gauge(self, name: str) -> list[float]:
        return [value for _, s in self.samples if (value := getattr(s, name)) is not None]


class _Out:
    def __init__(self, window: Window) -> None:
        self.state = window.last
        self.findings: list[Finding] = []
        self.skipped: list[NotEvaluated] = []
        self.measured: list[Measurement] = []

    def find(self, rule: str, severity: str, evidence: str, remedies: tuple[str, ...], values: dict) -> None:
        s = self.state
        self.findings.append(
            Finding(
                rule, severity, s.source, evidence, render(remedies, s.family, s.context()), values, remedies, s.family
            )
        )

    def skip(self, rule: str, reasons: dict[str, str], fields: tuple[str, ...] = ()) -> None:
        """``rule`` not evaluated: for a value the engine reported outside its meaning if that is why (the
        field is None then too), else for the family's reason."""
        invalid = [self.state.invalid[f] for f in fields if f in self.state.invalid]
        reason = "invalid value: " + "; ".join(invalid) if invalid else reasons.get(self.state.family, "not exposed")
        self.skipped.append(NotEvaluated(rule, self.state.source, reason))

    def measure(self, name: str, value: float | None, text: str, estimate: bool = False) -> None:
        self.measured.append(Measurement(self.state.source, name, value, text, estimate))


def _rule_fragmentation(w: Window, t: Thresholds, out: _Out) -> None:
    values = w.gauge("fragmentation")
    if not values:
        out.skip("fragmentation", NO_FRAGMENTATION, ("fragmentation",))
        return
    frag = sum(values) / len(values)
    over = f" (mean of {len(values)} scrapes)" if len(values) > 1 else ""
    if frag > t.fragmentation:
        out.find(
            "fragmentation",
            "warning",
            f"online fragmentation {frag:.3f}{over} > {t.fragmentation}",
            _layout(out.state),
            {"fragmentation": frag, "threshold": t.fragmentation},
        )


def _layout(state: ServerState) -> tuple[str, ...]:
    return ("layout",) if str(state.labels.get("engine", "")).startswith("contiguous") else ("smaller_blocks",)


def _rule_free_blocks(w: Window, t: Thresholds, out: _Out) -> None:
    shares = w.gauge("free_share")
    if not shares:
        out.skip("free_blocks", {out.state.family: "the engine exposes no KV usage"}, ("usage",))
        return
    last = shares[-1]
    low = [share for share in shares if share < t.free_blocks]
    if last >= t.free_blocks and len(low) * 2 < len(shares):
        return
    state = out.state
    # the last scrape's usage may be missing (set aside as invalid): then the last one seen is named
    usage = state.usage if state.usage is not None else 1.0 - last
    blocks = (
        f"{state.free_blocks:.0f} of {state.total_blocks:.0f} blocks free"
        if state.free_blocks is not None
        else f"KV usage {units.share(usage)}"
    )
    evidence = f"{blocks} ({units.share(last)} < {units.share(t.free_blocks)})"
    if len(shares) > 1:
        evidence = (
            f"free KV share below {units.share(t.free_blocks)} in {len(low)} of {len(shares)} scrapes (lowest "
            f"{units.share(min(shares))}); at the last: {blocks} ({units.share(last)})"
        )
    out.find(
        "free_blocks",
        "warning",
        evidence,
        ("more_kv_memory", "lower_concurrency", "route_to_free"),
        {"free_share": last, "threshold": t.free_blocks},
    )


def _rule_alloc_latency(w: Window, t: Thresholds, out: _Out) -> None:
    p99 = histogram_quantile(0.99, out.state.alloc_buckets)
    if p99 is None:
        out.skip("alloc_latency", NO_ALLOC_LATENCY, ("alloc_buckets",))
        return
    if p99 * 1000 > t.alloc_latency_p99_ms:
        out.find(
            "alloc_latency",
            "critical",
            f"block allocation latency p99 ~{p99 * 1000:.1f} ms (from histogram "
            f"buckets) > {t.alloc_latency_p99_ms:g} ms",
            ("larger_blocks", "check_host"),
            {"alloc_latency_p99_ms": p99 * 1000, "threshold_ms": t.alloc_latency_p99_ms},
        )


def _rule_preemptions(w: Window, t: Thresholds, out: _Out) -> None:
    preemptions, over = w.counter("preemptions")
    finished, _ = w.counter("finished")
    if preemptions is None or finished is None:
        out.skip(
            "preemption_storm",
            {
                **NO_PREEMPTIONS,
                out.state.family: NO_PREEMPTIONS.get(
                    out.state.family, "the engine exposes no preemption and finished-request counters"
                ),
            },
            ("preemptions", "finished"),
        )
        return
    out.measure(
        "preemptions", preemptions, f"{preemptions:.0f} preemptions for {finished:.0f} finished requests {over}"
    )
    if preemptions and preemptions / max(finished, 1.0) > t.preemptions_per_request:
        rate = preemptions / max(finished, 1.0)
        out.find(
            "preemption_storm",
            "warning",
            f"{preemptions:.0f} preemptions for {finished:.0f} finished requests "
            f"{over} ({rate:.2f} per request > {t.preemptions_per_request:g}): recompute wastes work",
            ("more_kv_memory", "lower_concurrency"),
            {"preemptions_per_request": rate, "threshold": t.preemptions_per_request},
        )


def _rule_reservation(w: Window, t: Thresholds, out: _Out) -> None:
    state = out.state
    if state.fragmentation is None or state.used_blocks is None or not state.total_blocks:
        out.skip("reservation_waste", NO_RESERVATION, ("fragmentation", "used_blocks", "total_blocks"))
        return
    share = state.fragmentation * state.used_blocks / state.total_blocks
    if share > t.reservation_waste:
        out.find(
            "reservation_waste",
            "warning",
            f"reservation + internal hold {units.share(share)} of the pool (> {units.share(t.reservation_waste)})",
            _layout(state),
            {"reservation_internal_share": share, "threshold": t.reservation_waste},
        )


def _growing(points: Sequence[tuple[float, float]]) -> bool:
    """More waiting at the end than at the start, with a rising least-squares line through the scrapes."""
    if len(points) < 3 or points[-1][1] <= points[0][1]:
        return False
    n = len(points)
    mean_t = sum(p[0] for p in points) / n
    mean_v = sum(p[1] for p in points) / n
    return sum((p[0] - mean_t) * (p[1] - mean_v) for p in points) > 0


def _rule_capped(w: Window, t: Thresholds, out: _Out) -> None:
    state = out.state
    name = "waiting_capacity" if state.waiting_capacity is not None else "waiting"
    waiting = getattr(state, name)
    free = state.free_share
    if waiting is None or free is None:
        out.skip(
            "concurrency_capped", {state.family: "the engine exposes no waiting requests or KV usage"}, (name, "usage")
        )
        return
    what = "requests wait for scheduling capacity" if name == "waiting_capacity" else "requests wait"
    assert state.usage is not None  # free_share is read from it
    if waiting and free < t.free_blocks:
        out.find(
            "concurrency_capped",
            "warning",
            f"{waiting:.0f} {what} while only {units.share(free)} of the KV blocks are free: "
            "the KV budget caps concurrency",
            ("more_kv_memory",),
            {"waiting": waiting, "free_share": free, "bound": "kv_memory"},
        )
        return
    if state.family == "kvbench" or not waiting or state.usage >= t.low_kv_usage:
        return
    trend = [(ts, getattr(s, name)) for ts, s in w.samples if getattr(s, name) is not None]
    if len(w.samples) > 1:
        if not _growing(trend):
            return
        evidence = (
            f"the queue grew from {trend[0][1]:.0f} to {waiting:.0f} {what} over {seconds(w.span_s)} while "
            f"KV usage stayed low ({units.share(state.usage)} at the last scrape, < {units.share(t.low_kv_usage)})"
        )
        severity = "warning"
    else:
        evidence = (
            f"{waiting:.0f} {what} at KV usage {units.share(state.usage)} (< {units.share(t.low_kv_usage)}); "
            "one scrape cannot show whether the queue grows (kvbench watch records a timeline)"
        )
        severity = "info"
    out.find(
        "concurrency_capped",
        severity,
        evidence + ": the batch cap, not KV memory, limits concurrency",
        ("raise_batch_cap",),
        {"waiting": waiting, "kv_usage": state.usage, "bound": "scheduler"},
    )


def _rule_prefix_cache(w: Window, t: Thresholds, out: _Out) -> None:
    state = out.state
    fields = ("prefix_queries", "prefix_hits", "prefix_hit_rate")
    if any(f in state.invalid for f in fields):  # hits without queries would read as a 0% rate
        out.skip("prefix_cache_hit_rate", {}, fields)
        return
    queries, over = w.counter("prefix_queries")
    hits, _ = w.counter("prefix_hits")
    rate = (hits or 0.0) / queries if queries else (state.prefix_hit_rate if queries is None else None)
    enabled = state.config.get("enable_prefix_caching")
    if rate is None:
        if state.family != "kvbench":
            out.skip(
                "prefix_cache_hit_rate",
                {
                    state.family: f"no prompt token was looked up in the prefix cache {over}"
                    if queries == 0
                    else "the engine exposes no prefix-cache counters"
                },
                fields,
            )
    else:
        looked = f" of {queries:.0f} prompt tokens looked up {over}" if queries else " (the rate the engine reports)"
        out.measure("prefix_cache_hit_rate", rate, f"prefix-cache hit rate {units.share(rate)}{looked}")
        if t.min_prefix_hit_rate > 0 and rate < t.min_prefix_hit_rate:
            remedies = (
                ("enable_prefix_caching", "shareable_prefixes") if enabled == "False" else ("shareable_prefixes",)
            )
            out.find(
                "prefix_cache_hit_rate",
                "warning",
                f"prefix-cache hit rate {units.share(rate)}{looked} (< {units.share(t.min_prefix_hit_rate)})",
                remedies,
                {"hit_rate": rate, "threshold": t.min_prefix_hit_rate},
            )
            return
    if enabled == "False":
        out.find(
            "prefix_caching_off",
            "info",
            "prefix caching is off (cache_config_info enable_prefix_caching="
            "False): prompts sharing a prefix are prefilled and stored again",
            ("enable_prefix_caching",),
            {"enable_prefix_caching": False},
        )


def _measure_state(w: Window, out: _Out) -> None:
    """What the engine held: at its one scrape, or over a window its peak and mean (a point or a watch is read
    for its busiest moment and its average, not for where the last scrape happened to fall)."""
    s = out.state
    usage, running, waiting = w.gauge("usage"), w.gauge("running"), w.gauge("waiting")
    if len(usage) > 1:
        out.measure(
            "kv_usage",
            max(usage),
            f"KV usage peak {units.share(max(usage))}, mean {units.share(sum(usage) / len(usage))} "
            f"over {len(usage)} scrapes" + (f" ({s.total_blocks:.0f} blocks)" if s.total_blocks else ""),
        )
    elif s.usage is not None:
        blocks = (
            (
                f", {s.free_blocks:.0f} of {s.total_blocks:.0f} blocks free"
                + (f" ({s.block_size} tokens each)" if s.block_size else "")
            )
            if s.total_blocks
            else ""
        )
        out.measure("kv_usage", s.usage, f"KV usage {units.share(s.usage)}{blocks}")
    if len(running) > 1:
        queued = f"; waiting peak {max(waiting):.0f}, mean {sum(waiting) / len(waiting):.1f}" if waiting else ""
        out.measure(
            "running",
            max(running),
            f"running peak {max(running):.0f}, mean {sum(running) / len(running):.1f}{queued}",
        )
    elif s.running is not None:
        queued = "" if s.waiting is None else f", {s.waiting:.0f} waiting"
        out.measure("running", s.running, f"{s.running:.0f} running{queued}")
    if s.prompt_tokens_mean is not None and s.generation_tokens_mean is not None:
        out.measure(
            "mean_request_tokens",
            s.prompt_tokens_mean + s.generation_tokens_mean,
            f"finished requests averaged {s.prompt_tokens_mean:.0f} prompt + {s.generation_tokens_mean:.0f} "
            "output tokens",
        )
    if s.fragmentation is None and s.block_size and s.running and s.total_blocks:
        internal = s.running * s.block_size / 2  # the last block of a request is half full on average
        share_pool = internal / (s.total_blocks * s.block_size)
        held = (s.usage or 0.0) * s.total_blocks * s.block_size
        of_held = f", ~{units.share(min(1.0, internal / held))} of the blocks in use" if held > 0 else ""
        out.measure(
            "internal_waste_estimate",
            share_pool,
            f"estimate: paging's internal waste ~{internal:.0f} token slots = half a {s.block_size}-token "
            f"block per running request ({s.running:.0f}): ~{units.share(share_pool)} of the pool{of_held}",
            estimate=True,
        )


_RULES = (
    _rule_fragmentation,
    _rule_free_blocks,
    _rule_alloc_latency,
    _rule_preemptions,
    _rule_reservation,
    _rule_capped,
    _rule_prefix_cache,
)


def diagnose_windows(
    windows: Sequence[Window], thresholds: Thresholds, source: str = "", notes: Sequence[str] = ()
) -> Diagnosis:
    """The rules over each engine instance's scrapes."""
    findings, skipped, measured = [], [], []
    for window in windows:
        out = _Out(window)
        _measure_state(window, out)
        for rule in _RULES:
            rule(window, thresholds, out)
        findings += out.findings
        skipped += out.skipped
        measured += out.measured
    all_notes = list(notes) + invalid_notes(windows)
    if any(w.last.family == "kvbench" for w in windows):
        all_notes.append(
            "reservation vs internal needs hindsight: live, reservation + internal is read from fragmentation"
        )
    return Diagnosis(source, thresholds, sorted_findings(findings), len(windows), all_notes, skipped, measured)


def invalid_notes(windows: Sequence[Window]) -> list[str]:
    """One note per engine instance and quantity it reported outside its meaning: set aside, never judged."""
    notes = []
    for window in windows:
        seen: dict[str, tuple[str, int]] = {}
        for _, state in window.samples:
            for field, why in state.invalid.items():
                first, count = seen.get(field, (why, 0))
                seen[field] = (first, count + 1)
        for first, count in seen.values():
            times = (
                f" (in {count} of {len(window.samples)} scrapes; the first shown)" if len(window.samples) > 1 else ""
            )
            notes.append(f"invalid value set aside, not used: {window.last.source}: {first}{times}")
    return notes


def diagnose_states(states: Sequence[ServerState], thresholds: Thresholds, source: str = "") -> Diagnosis:
    """The rules over one scrape."""
    return diagnose_windows([Window([(0.0, state)]) for state in states], thresholds, source)


def diagnose_url(url: str, thresholds: Thresholds) -> Diagnosis:
    return diagnose_states(read_states(scrape(url), url), thresholds, url)
