"""Compare two runs point by point and give each compared metric a verdict.

Points match by (engine, concurrency, scenario). Besides the points themselves, every
(concurrency, scenario) holding a paged and a contiguous engine (both ``ok``) yields a ratio point,
engine ``paged/contiguous``, whose metrics are ``paged_over_contiguous_<metric>``. Which metrics are
judged, and with what tolerance, is ``compare_policy``'s business. A noisy metric with at least
``MIN_SAMPLES`` repeat samples on both sides, enough for Mann-Whitney U to reach ``alpha`` (3 vs 3
cannot: its smallest two-sided p is 0.1), is only called changed when the test finds the change
significant *and* it passes the threshold; otherwise its single-run tolerance applies to the means.

A measured point shorter than ``min_duration_s`` on either side is too short to time on a shared machine (a few
scheduler stalls decide its throughput): its timing-dependent metrics are reported, not gated, and say so.
Two runs whose engines had a core for very different shares of their steps' time were made on machines loaded
differently, which the comparison notes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from scipy.stats import mannwhitneyu

from kvbench.errors import KvbenchError
from kvbench.report.compare_policy import (
    DIRECTIONS,
    RATIO_DENOMINATOR_PREFIX,
    RATIO_METRICS,
    RATIO_NUMERATOR_PREFIX,
    MetricPolicy,
    Rule,
    matching_rule,
    metric_policy,
    ratio_metric_name,
)
from kvbench.results.fields import lookup
from kvbench.results.point import Point
from kvbench.results.point_check import metric_problem, status_problem
from kvbench.results.run_meta import RunMeta
from kvbench.results.summary_load import PointKey, Summary
from kvbench.values import is_number

DEFAULT_ALPHA = 0.05
DEFAULT_MIN_DURATION_S = 2.0  # a measured point shorter than this is too short to time on a shared machine
BUSY_CORE_SHARE = 0.8  # engines that had a core for less of their steps' time than this ran on a busy machine
LOAD_GAP = 0.2  # core shares further apart than this: the two machines were loaded differently
MIN_SAMPLES = 3
EXACT_TEST_MAX_SIZE = 20  # exact Mann-Whitney p-values for untied samples up to this size
POINT_METRIC = "(point)"  # the metric name of a missing/new point's row
STATUS_METRIC = "status"
STATUS_RANK = {"ok": 2, "oom": 1, "error": 0}  # higher is better (another status is refused on reading)
META_FIELDS_TO_MATCH = (
    "model",
    "model_name",
    "scenario",
    "device",
    "gpu",
    "seed",
    "requests",
    "block_size",
    "kv_pool_slots",
    "pool_slots",
    "max_len",
    "repeat",
    "reserve",
    "admission",
)


class Verdict(str, Enum):
    REGRESSED = "regressed"
    MISSING = "missing"
    IMPROVED = "improved"
    NEW = "new"
    INFO = "info"  # reported, not gated: too noisy to judge from these runs
    UNCHANGED = "unchanged"

    @property
    def fails(self) -> bool:
        return self in (Verdict.REGRESSED, Verdict.MISSING)


@dataclass(frozen=True)
class Observation:
    value: float | None  # the headline value (the mean over repeats); None when the run has no value
    samples: tuple[float, ...] = ()  # per-repeat values, when the run was repeated


@dataclass(frozen=True)
class Measured:
    """One point's status and metrics, as compare sees them."""

    status: str | None
    metrics: Mapping[str, Observation]
    duration_s: float | None = None  # how long it ran (a ratio point: its shorter side); None: not recorded
    interleaved_with: tuple[str, ...] = ()  # the engines it ran step for step with (a ratio point: both sides')


@dataclass(frozen=True)
class Row:
    point: PointKey
    metric: str
    verdict: Verdict
    base: float | str | None = None
    head: float | str | None = None
    threshold: str = ""
    p_value: float | None = None
    note: str = ""

    @property
    def delta(self) -> float | None:
        if is_number(self.base, finite=True) and is_number(self.head, finite=True):
            return self.head - self.base
        return None

    @property
    def relative_change(self) -> float | None:
        delta = self.delta
        # a delta comes with a number base
        if delta is None or not is_number(self.base, finite=True) or self.base == 0:
            return None
        return delta / abs(self.base)


@dataclass(frozen=True)
class Comparison:
    base: Summary
    head: Summary
    rows: tuple[Row, ...]
    alpha: float
    simulated: bool = False  # both runs simulated: every metric judged as deterministic
    notes: tuple[str, ...] = field(default=())

    @property
    def counts(self) -> dict[str, int]:
        """How many rows got each verdict, by the verdict's name (every verdict, 0 where none got it)."""
        return {v.value: self.count(v) for v in Verdict}

    def count(self, verdict: Verdict) -> int:
        """How many rows got ``verdict``."""
        return sum(row.verdict is verdict for row in self.rows)

    @property
    def failed(self) -> bool:
        return any(row.verdict.fails for row in self.rows)


def compare(
    base: Summary,
    head: Summary,
    rules: tuple[Rule, ...] = (),
    *,
    absolute: bool = False,
    alpha: float = DEFAULT_ALPHA,
    min_duration_s: float = DEFAULT_MIN_DURATION_S,
) -> Comparison:
    """Judge ``head`` against ``base``. Raises KvbenchError when they cannot be compared."""
    if not 0 < alpha < 1:
        raise KvbenchError(f"the significance level alpha must be between 0 and 1, got {alpha}")
    if not is_number(min_duration_s, finite=True) or min_duration_s < 0:
        raise KvbenchError(f"the minimum duration must be a non-negative number of seconds, got {min_duration_s}")
    if base.kind != head.kind:
        raise KvbenchError(f"cannot compare a {base.kind!r} run ({base.path}) with a {head.kind!r} run ({head.path})")
    simulated = _simulated(base, head)

    def policy_of(metric: str) -> MetricPolicy | None:
        policy = metric_policy(metric, simulated=simulated)
        if policy is None or policy.by_default or absolute or any(r.matches(metric) for r in rules):
            return policy
        return None

    base_points, head_points = measured_points(base, policy_of), measured_points(head, policy_of)
    _check_rules_match(rules, base_points, head_points)
    rows: list[Row] = []
    for key in {**base_points, **head_points}:
        if key not in head_points:
            rows.append(Row(key, POINT_METRIC, Verdict.MISSING, note="point absent from head"))
        elif key not in base_points:
            rows.append(Row(key, POINT_METRIC, Verdict.NEW, note="point absent from base"))
        else:
            short = None if simulated else _too_short(base_points[key], head_points[key], min_duration_s)
            rows.extend(_compare_point(key, base_points[key], head_points[key], policy_of, rules, alpha, short))
    notes = _meta_notes(base, head) + (() if simulated else _load_notes(base, head))
    return Comparison(base, head, tuple(rows), alpha, simulated, notes)


def _too_short(base: Measured, head: Measured, min_duration_s: float) -> str | None:
    """Why a point's timing cannot be judged (it ran too briefly on either side), or None."""
    durations = [m.duration_s for m in (base, head) if m.duration_s is not None]
    if not durations or min(durations) >= min_duration_s:
        return None
    ran = " and ".join(f"{d:.2g} s" for d in (base.duration_s, head.duration_s) if d is not None)
    return (
        f"too short to judge on this machine: the point ran {ran} (under {min_duration_s:g} s); "
        "send more requests per point"
    )


def _core_share(summary: Summary) -> float | None:
    """The share of their steps' wall time the run's engines had a core for (CPU runs that record it)."""
    cpu = wall = 0.0
    for point in map(Point.from_json, summary.points.values()):
        used, took = point.cpu_time_s, point.duration
        if point.status == "ok" and is_number(used, finite=True) and is_number(took, finite=True) and took > 0:
            cpu, wall = cpu + used, wall + took
    count = RunMeta.from_json(summary.meta).threads
    per_core = count if count is not None and count >= 1 else 1
    return min(1.0, cpu / wall / per_core) if wall > 0 else None


def _load_notes(base: Summary, head: Summary) -> tuple[str, ...]:
    old, new = _core_share(base), _core_share(head)
    if old is None or new is None:
        return ()
    shares = f"base's engines had a core for {old:.0%} of their steps' time, head's for {new:.0%}"
    if abs(old - new) > LOAD_GAP:
        return (
            f"the machines were loaded differently: {shares} (a busy machine slows both engines of a point, "
            "unevenly); timing differences may be the machine's",
        )
    if min(old, new) < BUSY_CORE_SHARE:
        return (f"a busy machine: {shares}; timing is noisier than on a quiet one",)
    return ()


def _simulated(base: Summary, head: Summary) -> bool:
    for summary in (base, head):  # the record as written: RunMeta reads any value as a truth
        value = summary.meta.get("simulated", False)
        if not isinstance(value, bool) and value is not None:
            raise KvbenchError(f"{summary.path}: meta.simulated must be true or false, got {value!r}")
    flags = [RunMeta.from_json(summary.meta).simulated for summary in (base, head)]
    if flags[0] != flags[1]:
        simulated, measured = (base, head) if flags[0] else (head, base)
        raise KvbenchError(f"cannot compare a simulated run ({simulated.path}) with a measured run ({measured.path})")
    return flags[0]


# --- reading points ---------------------------------------------------------------------------------


Judged = Callable[[str], "MetricPolicy | None"]


def measured_points(summary: Summary, judged: Judged) -> dict[PointKey, Measured]:
    """The summary's points (their judged metrics, checked), then the paged-over-contiguous ratio points."""
    points = {key: _measure(summary, key, point, judged) for key, point in summary.points.items()}
    return {**points, **_ratio_points(points)}


def _measure(summary: Summary, key: PointKey, point: Mapping[str, Any], judged: Judged) -> Measured:
    where = f"{summary.path}: point {key.label}"
    samples = point.get("samples", {})
    if not isinstance(samples, Mapping):
        raise KvbenchError(f"{where}: 'samples' is {_shown(samples)}, not an object")
    metrics: dict[str, Observation] = {}
    for name in DIRECTIONS:
        if judged(name) is None and name not in RATIO_METRICS:  # ratio inputs are always judged
            continue
        found, value = lookup(point, name, where)
        if not found:
            continue
        if value is not None and not is_number(value, finite=True):
            raise KvbenchError(f"{where}: metric {name} is {_shown(value)}, not a number")
        observed = Observation(value, _samples(samples.get(name), f"{where}: samples of {name}"))
        for number in (value, *observed.samples):
            if number is not None and (problem := metric_problem(name, number)):
                raise KvbenchError(f"{where}: metric {name} is {_shown(number)}, {problem}")
        metrics[name] = observed
    status = point.get("status")
    if status is not None and (problem := status_problem(status)):
        raise KvbenchError(f"{where}: status is {_shown(status)}, {problem}")
    duration = point.get("duration")
    partners = point.get("interleaved_with")
    interleaved = tuple(str(e) for e in partners) if isinstance(partners, list) else ()
    return Measured(status, metrics, float(duration) if is_number(duration, finite=True) else None, interleaved)


def _samples(raw: Any, where: str) -> tuple[float, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list) or not all(is_number(v, finite=True) for v in raw):
        raise KvbenchError(f"{where} are {_shown(raw)}, not a list of numbers")
    return tuple(float(v) for v in raw)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _ratio_points(points: Mapping[PointKey, Measured]) -> dict[PointKey, Measured]:
    ratios: dict[PointKey, Measured] = {}
    for num_key, num in points.items():
        if not num_key.engine.startswith(RATIO_NUMERATOR_PREFIX) or not _usable(num.status):
            continue
        for den_key, den in points.items():
            same_place = (den_key.concurrency, den_key.scenario) == (num_key.concurrency, num_key.scenario)
            if not same_place or not den_key.engine.startswith(RATIO_DENOMINATOR_PREFIX) or not _usable(den.status):
                continue
            metrics = {
                ratio_metric_name(num_key.engine, den_key.engine, metric): _ratio(
                    num.metrics[metric], den.metrics[metric]
                )
                for metric in RATIO_METRICS
                if metric in num.metrics and metric in den.metrics
            }
            if metrics:
                key = PointKey(f"{num_key.engine}/{den_key.engine}", num_key.concurrency, num_key.scenario)
                durations = [d for d in (num.duration_s, den.duration_s) if d is not None]
                together = den_key.engine in num.interleaved_with and num_key.engine in den.interleaved_with
                partners = (num_key.engine, den_key.engine) if together else ()
                ratios[key] = Measured(None, metrics, min(durations) if durations else None, partners)
    return ratios


def _ratio(num: Observation, den: Observation) -> Observation:
    """num / den; no value (None) when either has none or den is 0, so a lost value cannot pass as new."""
    if num.value is None or den.value is None or den.value == 0:
        return Observation(None)
    paired = len(num.samples) == len(den.samples) and 0 not in den.samples
    samples = tuple(a / b for a, b in zip(num.samples, den.samples, strict=True)) if paired else ()
    return Observation(num.value / den.value, samples)


# --- verdicts ---------------------------------------------------------------------------------------


def _compare_point(
    key: PointKey,
    base: Measured,
    head: Measured,
    judged: Judged,
    rules: tuple[Rule, ...],
    alpha: float,
    too_short: str | None = None,
) -> list[Row]:
    rows: list[Row] = []
    if base.status is not None or head.status is not None:
        rows.append(_status_row(key, base.status or "ok", head.status or "ok"))
        if not (_usable(base.status) and _usable(head.status)):
            return rows  # the metrics of a failed point mean nothing; its status row says it all
    policies = {name: policy for name in {**base.metrics, **head.metrics} if (policy := judged(name)) is not None}
    names = sorted(policies, key=lambda name: not policies[name].by_default)
    for name in names:
        old, new = base.metrics.get(name), head.metrics.get(name)
        if (old is None or old.value is None) and (new is None or new.value is None):
            continue  # no value on either side: nothing to judge
        row = _unjudgeable_row(key, name, old, new)
        if row is None:
            assert old is not None and new is not None  # else _unjudgeable_row has a row for it
            both = bool(base.interleaved_with) and bool(head.interleaved_with)
            row = _judge(key, name, policies[name], old, new, rules, alpha, too_short, both)
        rows.append(row)
    return rows


def _unjudgeable_row(key: PointKey, name: str, old: Observation | None, new: Observation | None) -> Row | None:
    """The row of a metric absent from a side or without a value there; None when both sides have values."""
    if new is None:
        assert old is not None  # the caller skips a metric absent from both sides
        return Row(key, name, Verdict.MISSING, base=old.value, note="metric absent from head")
    if old is None:
        return Row(key, name, Verdict.NEW, head=new.value, note="metric absent from base")
    if new.value is None:
        return Row(key, name, Verdict.MISSING, base=old.value, note="head has no value (null)")
    if old.value is None:
        return Row(key, name, Verdict.MISSING, head=new.value, note="base has no value (null)")
    return None


def _status_row(key: PointKey, base: str, head: str) -> Row:
    old, new = STATUS_RANK.get(base, 0), STATUS_RANK.get(head, 0)
    verdict = Verdict.REGRESSED if new < old else Verdict.IMPROVED if new > old else Verdict.UNCHANGED
    return Row(key, STATUS_METRIC, verdict, base=base, head=head, threshold="ok > oom > error")


def _judge(
    key: PointKey,
    name: str,
    policy: MetricPolicy,
    base: Observation,
    head: Observation,
    rules: tuple[Rule, ...],
    alpha: float,
    too_short: str | None = None,
    interleaved: bool = False,
) -> Row:
    """The metric's verdict. A ratio of engines that ran step for step in both runs (``interleaved``) shared the
    machine's load within each run, so its single-run tolerance is the tighter one."""
    assert base.value is not None and head.value is not None  # see _unjudgeable_row
    old, new = float(base.value), float(head.value)
    rule = matching_rule(name, rules)
    if too_short is not None and rule is None and policy.timed:
        return Row(key, name, Verdict.INFO, old, new, "not gated", None, too_short)
    p_value, note = _significance(policy, base.samples, head.samples, alpha)
    single = policy.single_interleaved if interleaved and policy.single_interleaved else policy.single
    threshold = rule or (single if p_value is None else policy.sampled)
    if threshold is None:
        note = "; ".join(part for part in (policy.ungated_note, note) if part)
        return Row(key, name, Verdict.INFO, old, new, "not gated", p_value, note)
    if p_value is not None and p_value >= alpha:
        return Row(key, name, Verdict.UNCHANGED, old, new, str(threshold), p_value, note)
    outcome = threshold.judge(old, new, policy.direction)
    verdict = {-1: Verdict.REGRESSED, 1: Verdict.IMPROVED}.get(outcome, Verdict.UNCHANGED)
    return Row(key, name, verdict, old, new, str(threshold), p_value, note)


def _significance(
    policy: MetricPolicy, base: tuple[float, ...], head: tuple[float, ...], alpha: float
) -> tuple[float | None, str]:
    """(p-value, note); the p-value is None when no test applies and the single-run tolerance decides."""
    if not policy.noisy or not base or not head:
        return None, ""
    if min(len(base), len(head)) < MIN_SAMPLES or min_two_sided_p(len(base), len(head)) >= alpha:
        return None, f"{len(base)} vs {len(head)} samples cannot reach p<{alpha:g}"
    p_value = mann_whitney_p(base, head)
    return p_value, f"Mann-Whitney p={p_value:.3g}" + ("" if p_value < alpha else ", not significant")


def mann_whitney_p(x: tuple[float, ...], y: tuple[float, ...]) -> float:
    """Two-sided Mann-Whitney U p-value: exact for small untied samples, else the normal approximation."""
    pooled = (*x, *y)
    exact = len(set(pooled)) == len(pooled) and max(len(x), len(y)) <= EXACT_TEST_MAX_SIZE
    p_value = float(mannwhitneyu(x, y, alternative="two-sided", method="exact" if exact else "asymptotic").pvalue)
    return 1.0 if math.isnan(p_value) else min(1.0, p_value)


def min_two_sided_p(n: int, m: int) -> float:
    """The smallest two-sided p-value n vs m samples can reach: every value of one above the other's."""
    return min(1.0, 2 / math.comb(n + m, n))


def _check_rules_match(
    rules: tuple[Rule, ...], base: Mapping[PointKey, Measured], head: Mapping[PointKey, Measured]
) -> None:
    names = {name for points in (base, head) for point in points.values() for name in point.metrics}
    for rule in rules:
        if not any(rule.matches(name) for name in names):
            raise KvbenchError(f"the rule for {rule.pattern!r} matches no metric of these runs")


def _meta_notes(base: Summary, head: Summary) -> tuple[str, ...]:
    differing = [
        name
        for name in META_FIELDS_TO_MATCH
        if name in base.meta and name in head.meta and base.meta[name] != head.meta[name]
    ]
    return (f"base and head differ in meta: {', '.join(differing)}",) if differing else ()


def _usable(status: str | None) -> bool:
    return status is None or status == "ok"
