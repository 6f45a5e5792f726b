"""One measured point of the results schema, typed, and how it is built from a run.

A :class:`Point` is what a study produces for one (engine, concurrency, scenario); ``to_json`` gives the
public schema (``summary.json``'s points, one line of ``results.jsonl``), in which the latency statistics
are top-level fields (``p99_ttft_ms``) as in vLLM's benchmark output. Reports render that JSON form, so a
point measured now and one read back from a run directory look the same to them.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from kvbench.engine.result import RunResult
from kvbench.results.fields import value_at
from kvbench.results.length_histogram import LengthHistogram
from kvbench.results.schema import LATENCY_FIELDS, MEMORY_FIELDS
from kvbench.results.waste_shares import WasteShares
from kvbench.values import is_number

# headline metrics whose spread is reported (std, 95% CI, per-repeat samples) with --repeat
REPEATED_FIELDS = ("output_throughput", "total_token_throughput", "request_throughput", *LATENCY_FIELDS)
HISTOGRAM_BINS = 20
_PEAK_FIELDS = ("peak_running", "kv_peak_allocated_bytes", "kv_peak_used_bytes", "output_len_max")  # max over repeats
_OPTIONAL = ("status_reason", "error", "traceback")  # written only when set


@dataclass
class Point:
    engine: str
    concurrency: int
    scenario: str
    status: str = "ok"  # ok | oom | error
    completed: int = 0
    rejected: int = 0
    rejected_oom: int = 0
    preemptions: int | None = 0  # None: a server that does not expose it
    output_throughput: float = 0.0
    total_token_throughput: float = 0.0
    request_throughput: float = 0.0
    duration: float = 0.0  # seconds, as vLLM's benchmark names it (the same as elapsed_s)
    total_input_tokens: int | None = 0  # prompt tokens of the completed requests (None: a server did not say)
    total_output_tokens: int = 0  # output tokens of the completed requests
    latencies: dict[str, float | None] = field(default_factory=lambda: dict.fromkeys(LATENCY_FIELDS))
    # None where unknown: a server measured over HTTP exposes no KV bytes, and maybe no running count
    peak_running: int | None = 0
    mean_running: float | None = 0.0
    kv_pool_bytes: int | None = 0
    kv_peak_allocated_bytes: int | None = 0
    kv_mean_allocated_bytes: float | None = 0.0
    kv_mean_used_bytes: float | None = 0.0
    kv_peak_used_bytes: int | None = 0
    waste: dict[str, float] = field(default_factory=dict)  # time-averaged shares of the pool, %
    waste_peak_pct: dict[str, float | None] = field(default_factory=dict)  # each part's own peak, % of the pool
    effective_usage_pct: float | None = 0.0
    fragmentation_mean: float | None = 0.0
    elapsed_s: float = 0.0
    cpu_time_s: float | None = None  # process CPU seconds of the run's steps (CPU devices): the engine's work alone
    # throughput while the closed loop held all its requests in flight (ramp-up and draining tail left out);
    # None when it never did (fewer requests than the concurrency)
    steady_output_throughput: float | None = None
    steady_window_s: float | None = None
    steady_window_pct: float | None = None  # the window's share of the run
    # the output lengths that occurred (EOS-decided or drawn) over completed requests
    output_len_mean: float | None = None
    output_len_p50: float | None = None
    output_len_p90: float | None = None
    output_len_max: int | None = None
    stopped_at_eos: int = 0
    output_len_hist: dict[str, list] | None = None  # {"edges": [...], "counts": [...]}
    memory: dict[str, int | None] = field(
        default_factory=lambda: dict.fromkeys((*MEMORY_FIELDS, "nvml_process_peak_bytes"))
    )
    status_reason: str | None = None
    error: str | None = None
    traceback: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # what a study adds (metrics, waterfall, repeats, ...)

    def to_json(self) -> dict[str, Any]:
        """The results-schema form: latencies flattened into top-level fields, unset optional fields left out,
        the study's extra fields last."""
        out: dict[str, Any] = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "latencies":
                out.update(value)
            elif f.name == "extra":
                out.update(value)
            elif f.name in _OPTIONAL and value is None:
                continue
            else:
                out[f.name] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Point:
        """A point as ``summary.json`` or ``results.jsonl`` holds it: the top-level latency statistics back into
        ``latencies``, the fields a study added into ``extra``; a field an older run did not write keeps its
        empty value."""
        own = {f.name for f in fields(cls)} - {"latencies", "extra"}
        known = {name: data[name] for name in own if name in data}
        known.setdefault("scenario", "")  # hand-made points (tests, other tools) may leave it out
        latencies = {name: data.get(name) for name in LATENCY_FIELDS}
        extra = {key: value for key, value in data.items() if key not in own and key not in latencies}
        return cls(**known, latencies=latencies, extra=extra)

    @property
    def shares(self) -> WasteShares:
        """Its ``waste`` block, typed (every share None where the point has none)."""
        return WasteShares.from_json(self.waste)

    @property
    def output_histogram(self) -> LengthHistogram | None:
        """Its ``output_len_hist``, typed (None where it measured no output length)."""
        return LengthHistogram.from_json(self.output_len_hist) if self.output_len_hist else None

    def value(self, dotted: str) -> Any:
        """A field of the JSON form by its dotted name (``waste.internal_pct``, ``p99_ttft_ms``), None if absent."""
        return value_at(self.to_json(), dotted)

    def ci95(self, name: str) -> float | None:
        """With --repeat: the 95% confidence interval's half-width of a headline figure (None for a single run)."""
        value = self.extra.get(f"{name}_ci95")
        return float(value) if is_number(value, finite=True) else None

    @classmethod
    def failed(cls, engine: str, concurrency: int, scenario: str, error: str, traceback: str | None = None) -> Point:
        """A point that measured nothing: its figures stay at their empty values, the error says why."""
        return cls(engine, concurrency, scenario, status="error", error=error, traceback=traceback)


def shows_figures(point: Mapping[str, Any]) -> bool:
    """Whether a point's throughput, latency and steady figures are shown as figures: only an ok point's.

    An OOM point served only the requests its KV memory admitted and rejected the rest, so its figures describe
    another, lighter workload (a few requests, fast). Every table, plot and console line therefore marks it
    (:func:`oom_text`) instead of printing or drawing those figures as a normal point; its memory is shown, marked.
    """
    return point.get("status") == "ok"


LOAD_FIGURES = (*REPEATED_FIELDS, "steady_output_throughput", "duration", "cpu_time_s")  # what the load's speed was


def with_figures_hidden(point: Mapping[str, Any]) -> dict[str, Any]:
    """The point as a table row shows it: a point that did not run its whole load (:func:`shows_figures`) keeps
    its keys, status and memory, and its speed and latency figures (and their spread) are blanked."""
    row = dict(point)
    if not shows_figures(point):
        for name in LOAD_FIGURES:
            for variant in (name, f"{name}_std", f"{name}_ci95"):
                if variant in row:
                    row[variant] = None
        row.pop("samples", None)
    return row


def oom_text(point: Mapping[str, Any]) -> str:
    """The mark of an OOM point: how many of its requests were turned away."""
    rejected, completed = point.get("rejected") or 0, point.get("completed") or 0
    return f"OOM: {rejected:,} of {rejected + completed:,} requests rejected"


def point_from_result(
    result: RunResult,
    engine: str,
    concurrency: int,
    scenario: str,
    bytes_per_token: int,
    memory: dict[str, Any] | None = None,
) -> Point:
    acct = result.accountant
    mean = acct.mean_slots()
    rejected = result.rejected
    oom = [r for r in rejected if r.reject_kind in ("oom", "pool")]  # no memory now, or never enough
    counts: dict[str, Any] = {**result.throughput(), **result.totals()}  # figures named as Point's fields
    point = Point(
        engine=engine,
        concurrency=concurrency,
        scenario=scenario,
        status="oom" if oom else "ok",
        completed=len(result.completed),
        rejected=len(rejected),
        rejected_oom=len(oom),
        preemptions=result.num_preemptions,
        **counts,
        latencies=result.latencies(),
        peak_running=result.peak_running,
        mean_running=acct.mean_running(),
        kv_pool_bytes=result.pool_slots * bytes_per_token,
        kv_peak_allocated_bytes=acct.peak_allocated * bytes_per_token,
        kv_mean_allocated_bytes=(mean.used + mean.reserved + mean.internal) * bytes_per_token,
        kv_mean_used_bytes=mean.used * bytes_per_token,
        kv_peak_used_bytes=acct.peak.used * bytes_per_token,
        waste=acct.waste_pct(),
        waste_peak_pct={
            part: 100.0 * slots / result.pool_slots if result.pool_slots else None
            for part, slots in acct.peak.as_dict().items()
        },
        effective_usage_pct=100 * acct.effective_usage(),
        fragmentation_mean=acct.fragmentation_mean(),
        elapsed_s=acct.elapsed_s,
        cpu_time_s=result.cpu_time_s,
        memory={name: (memory or {}).get(name) for name in (*MEMORY_FIELDS, "nvml_process_peak_bytes")},
        **_steady_fields(result),
        **_output_length_fields(result),
    )
    point.extra.update(result.extras.get("point", {}))  # fields a backend adds (an external engine's details)
    if engine.startswith("contiguous"):  # what slabs of exactly each real length would have held: a bound
        point.extra["kv_hindsight_oracle_peak_bytes"] = acct.peak_needed * bytes_per_token
        point.extra["kv_hindsight_oracle_mean_bytes"] = (mean.used + mean.reserved) * bytes_per_token
    if oom:
        point.status_reason = f"{len(oom)} request(s) rejected: {oom[0].reject_reason}"
    elif not result.completed:  # a point with nothing done has no figures to show: say why, never "ok"
        point.status = "error"
        reason = f"{len(rejected)} request(s) rejected: {rejected[0].reject_reason}" if rejected else "no request ran"
        point.error = f"no request completed ({reason})"
    return point


def _steady_fields(result: RunResult) -> dict[str, Any]:
    steady = result.steady
    if steady is None:
        return {}
    return {
        "steady_output_throughput": steady.output_throughput,
        "steady_window_s": steady.seconds,
        "steady_window_pct": 100.0 * steady.share,
    }


def _output_length_fields(result: RunResult) -> dict[str, Any]:
    import numpy as np  # loads only where a run's lengths are summed up

    lengths = np.asarray(result.output_lengths(), dtype=float)
    if lengths.size == 0:
        return {}
    top = int(lengths.max())
    edges = np.linspace(0, max(top, 1), HISTOGRAM_BINS + 1)
    counts, _ = np.histogram(lengths, bins=edges)
    return {
        "output_len_mean": float(lengths.mean()),
        "output_len_p50": float(np.percentile(lengths, 50)),
        "output_len_p90": float(np.percentile(lengths, 90)),
        "output_len_max": top,
        "stopped_at_eos": sum(1 for r in result.completed if r.stop_reason in ("eos", "stop")),
        "output_len_hist": {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]},
    }


def timeline_of(result: RunResult, max_points: int = 400) -> list[list[float]]:
    """(time s, blocks in use) pairs, thinned to at most ``max_points``."""
    line = result.accountant.timeline
    stride = max(1, len(line) // max_points)
    thinned = [[t, blocks] for t, blocks, _ in line[::stride]]
    if line:
        thinned.append([result.accountant.elapsed_s, line[-1][1]])
    return thinned


def aggregate_repeats(points: list[Point]) -> Point:
    """One point from K repeats: means (with std, 95% CI and samples for the headline metrics), peaks as the
    maximum, waste shares averaged, memory peaks maximised, and the worst status with its reason."""
    if len(points) == 1:
        return points[0]
    runs = [p.to_json() for p in points]
    last = points[-1]
    merged = replace(last, latencies=dict(last.latencies), extra=dict(last.extra))
    merged.extra["repeats"] = len(points)
    samples: dict[str, list[float]] = {}
    for status in ("error", "oom"):
        worst = next((p for p in points if p.status == status), None)
        if worst is not None:
            merged.status, merged.status_reason, merged.error = status, worst.status_reason, worst.error
            break
    for name in (
        "completed",
        "rejected",
        "rejected_oom",
        "preemptions",
        "duration",
        "total_input_tokens",
        "total_output_tokens",
        "mean_running",
        "kv_pool_bytes",
        "kv_mean_allocated_bytes",
        "kv_mean_used_bytes",
        "effective_usage_pct",
        "fragmentation_mean",
        "elapsed_s",
        "cpu_time_s",
        "steady_output_throughput",
        "steady_window_s",
        "steady_window_pct",
        "output_len_mean",
        "output_len_p50",
        "output_len_p90",
        "stopped_at_eos",
    ):
        values = _numbers(runs, name)
        if values:  # equal counts stay integers
            setattr(merged, name, values[0] if len(set(values)) == 1 else statistics.fmean(values))
    for name in _PEAK_FIELDS:
        if _numbers(runs, name):
            setattr(merged, name, max(_numbers(runs, name)))
    merged.waste = _combine([p.waste for p in points], statistics.fmean)
    merged.waste_peak_pct = _combine([p.waste_peak_pct for p in points], max)
    merged.memory = _combine([p.memory for p in points], max)
    for name in REPEATED_FIELDS:
        values = _numbers(runs, name)
        if not values:
            continue
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        mean = statistics.fmean(values)
        if name in LATENCY_FIELDS:
            merged.latencies[name] = mean
        else:
            setattr(merged, name, mean)
        merged.extra[f"{name}_std"] = std
        merged.extra[f"{name}_ci95"] = t95(len(values)) * std / math.sqrt(len(values)) if len(values) > 1 else 0.0
        samples[name] = values
    merged.extra["samples"] = samples
    return merged


def t95(n: int) -> float:
    """Two-sided 95% Student t quantile for n - 1 degrees of freedom (n samples)."""
    from scipy import stats  # loads only where a spread is computed: readers of a point never pay for it

    return float(stats.t.ppf(0.975, n - 1))


def _combine(groups: list[dict[str, Any]], combine) -> dict[str, Any]:
    keys = list(groups[-1])
    return {
        key: (combine(values) if (values := [g[key] for g in groups if is_number(g.get(key), finite=True)]) else None)
        for key in keys
    }


def _numbers(points: list[dict[str, Any]], name: str) -> list[float]:
    return [p[name] for p in points if is_number(p.get(name), finite=True)]
