"""Compare two runs point by point and give each compared metric a verdict (issue 8).

Points match by (engine, concurrency, scenario). Besides the points themselves, every
(concurrency, scenario) holding a paged and a contiguous engine (both ``ok``) yields a ratio point,
engine ``paged/contiguous``, whose metrics are ``paged_over_contiguous_<metric>``. Which metrics are
judged, and with what tolerance, is ``compare_policy``'s business. A noisy metric with at least
``MIN_SAMPLES`` repeat samples on both sides is only called changed when Mann-Whitney U finds the
change significant at ``alpha`` *and* it passes the threshold; when the samples are too few for the
test ever to reach ``alpha`` (3 vs 3 cannot: its smallest p is 0.1), the threshold alone decides.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from kvbench.errors import KvbenchError
from kvbench.report.compare_policy import (
    DIRECTIONS,
    RATIO_DENOMINATOR_PREFIX,
    RATIO_METRICS,
    RATIO_NUMERATOR_PREFIX,
    MetricPolicy,
    Rule,
    metric_policy,
    ratio_metric_name,
    threshold_for,
)
from kvbench.report.mannwhitney import mann_whitney_u, min_two_sided_p
from kvbench.report.summary_load import PointKey, Summary

DEFAULT_ALPHA = 0.05
MIN_SAMPLES = 3
POINT_METRIC = "(point)"  # the metric name of a missing/new point's row
STATUS_METRIC = "status"
STATUS_RANK = {"ok": 2, "oom": 1, "error": 0}  # higher is better; unknown statuses rank as error
META_FIELDS_TO_MATCH = (
    "model", "model_name", "scenario", "device", "gpu", "simulated", "seed", "requests", "block_size",
    "kv_pool_slots", "pool_slots", "max_len", "repeat", "reserve", "admission",
)


class Verdict(str, Enum):
    REGRESSED = "regressed"
    MISSING = "missing"
    IMPROVED = "improved"
    NEW = "new"
    UNCHANGED = "unchanged"

    @property
    def fails(self) -> bool:
        return self in (Verdict.REGRESSED, Verdict.MISSING)


@dataclass(frozen=True)
class Observation:
    value: float | None  # the headline value (the mean over repeats); None when not measurable
    samples: tuple[float, ...] = ()  # per-repeat values, when the run was repeated


@dataclass(frozen=True)
class Measured:
    """One point's status and metrics, as compare sees them."""

    status: str | None
    metrics: Mapping[str, Observation]


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
        if _is_number(self.base) and _is_number(self.head):
            return self.head - self.base  # type: ignore[operator]
        return None

    @property
    def relative_change(self) -> float | None:
        delta = self.delta
        if delta is None or self.base == 0:
            return None
        return delta / abs(self.base)  # type: ignore[arg-type]


@dataclass(frozen=True)
class Comparison:
    base: Summary
    head: Summary
    rows: tuple[Row, ...]
    alpha: float
    notes: tuple[str, ...] = field(default=())

    @property
    def counts(self) -> dict[str, int]:
        return {v.value: sum(row.verdict is v for row in self.rows) for v in Verdict}

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
) -> Comparison:
    """Judge ``head`` against ``base``. Raises KvbenchError when they cannot be compared."""
    if not 0 < alpha < 1:
        raise KvbenchError(f"--alpha must be between 0 and 1, got {alpha}")
    if base.kind != head.kind:
        raise KvbenchError(
            f"cannot compare a {base.kind!r} run ({base.path}) with a {head.kind!r} run ({head.path})"
        )
    base_points, head_points = measured_points(base), measured_points(head)
    _check_rules_match(rules, base_points, head_points)

    def wanted(metric: str) -> bool:
        policy = metric_policy(metric)
        return policy is not None and (policy.by_default or absolute or any(r.matches(metric) for r in rules))

    rows: list[Row] = []
    for key in {**base_points, **head_points}:
        if key not in head_points:
            rows.append(Row(key, POINT_METRIC, Verdict.MISSING, note="point absent from head"))
        elif key not in base_points:
            rows.append(Row(key, POINT_METRIC, Verdict.NEW, note="point absent from base"))
        else:
            rows.extend(_compare_point(key, base_points[key], head_points[key], wanted, rules, alpha))
    return Comparison(base, head, tuple(rows), alpha, _meta_notes(base, head))


def measured_points(summary: Summary) -> dict[PointKey, Measured]:
    """The summary's points, then its paged-over-contiguous ratio points."""
    points = {key: _measure(point) for key, point in summary.points.items()}
    return {**points, **_ratio_points(points)}


def _measure(point: Mapping[str, Any]) -> Measured:
    samples = point.get("samples") if isinstance(point.get("samples"), dict) else {}
    metrics: dict[str, Observation] = {}
    for name in DIRECTIONS:
        found, value = _lookup(point, name)
        if found:
            metrics[name] = Observation(value if _is_number(value) else None, _samples(samples.get(name)))
    status = point.get("status")
    return Measured(status if isinstance(status, str) else None, metrics)


def _ratio_points(points: Mapping[PointKey, Measured]) -> dict[PointKey, Measured]:
    ratios: dict[PointKey, Measured] = {}
    for num_key, num in points.items():
        if not num_key.engine.startswith(RATIO_NUMERATOR_PREFIX) or not _usable(num.status):
            continue
        for den_key, den in points.items():
            same_place = (den_key.concurrency, den_key.scenario) == (num_key.concurrency, num_key.scenario)
            if (
                not same_place
                or not den_key.engine.startswith(RATIO_DENOMINATOR_PREFIX)
                or not _usable(den.status)
            ):
                continue
            metrics = {
                ratio_metric_name(num_key.engine, den_key.engine, metric): ratio
                for metric in RATIO_METRICS
                if (ratio := _ratio(num.metrics.get(metric), den.metrics.get(metric))) is not None
            }
            if metrics:
                key = PointKey(f"{num_key.engine}/{den_key.engine}", num_key.concurrency, num_key.scenario)
                ratios[key] = Measured(None, metrics)
    return ratios


def _ratio(num: Observation | None, den: Observation | None) -> Observation | None:
    if num is None or den is None or num.value is None or den.value is None or den.value == 0:
        return None
    paired = len(num.samples) == len(den.samples) and 0 not in den.samples
    samples = tuple(a / b for a, b in zip(num.samples, den.samples, strict=True)) if paired else ()
    return Observation(num.value / den.value, samples)


def _compare_point(
    key: PointKey,
    base: Measured,
    head: Measured,
    wanted: Callable[[str], bool],
    rules: tuple[Rule, ...],
    alpha: float,
) -> list[Row]:
    rows: list[Row] = []
    if base.status is not None or head.status is not None:
        rows.append(_status_row(key, base.status or "ok", head.status or "ok"))
        if not (_usable(base.status) and _usable(head.status)):
            return rows  # the metrics of a failed point mean nothing; its status row says it all
    names = [name for name in {**base.metrics, **head.metrics} if wanted(name)]
    names.sort(key=lambda name: not metric_policy(name).by_default)  # type: ignore[union-attr]
    for name in names:
        old, new = base.metrics.get(name), head.metrics.get(name)
        old_value = old.value if old else None
        new_value = new.value if new else None
        if old_value is None and new_value is None:
            continue
        if new_value is None:
            rows.append(Row(key, name, Verdict.MISSING, base=old_value, note="metric absent from head"))
        elif old_value is None:
            rows.append(Row(key, name, Verdict.NEW, head=new_value, note="metric absent from base"))
        else:
            rows.append(_judge(key, name, old, new, rules, alpha))  # type: ignore[arg-type]
    return rows


def _status_row(key: PointKey, base: str, head: str) -> Row:
    old, new = STATUS_RANK.get(base, 0), STATUS_RANK.get(head, 0)
    verdict = Verdict.REGRESSED if new < old else Verdict.IMPROVED if new > old else Verdict.UNCHANGED
    return Row(key, STATUS_METRIC, verdict, base=base, head=head, threshold="ok > oom > error")


def _judge(
    key: PointKey, name: str, base: Observation, head: Observation, rules: tuple[Rule, ...], alpha: float
) -> Row:
    policy: MetricPolicy = metric_policy(name)  # type: ignore[assignment]
    threshold = threshold_for(name, policy, rules)
    old, new = float(base.value), float(head.value)  # type: ignore[arg-type]
    worse = -policy.direction * (new - old)
    significant, p_value, note = _significance(policy, base.samples, head.samples, alpha)
    if significant is False:
        verdict = Verdict.UNCHANGED
    elif threshold.exceeded_by(worse, old):
        verdict = Verdict.REGRESSED
    elif threshold.exceeded_by(-worse, old):
        verdict = Verdict.IMPROVED
    else:
        verdict = Verdict.UNCHANGED
    return Row(key, name, verdict, base.value, head.value, str(threshold), p_value, note)


def _significance(
    policy: MetricPolicy, base: tuple[float, ...], head: tuple[float, ...], alpha: float
) -> tuple[bool | None, float | None, str]:
    """(significant, p-value, note); significant is None when the threshold alone must decide."""
    if not policy.noisy or len(base) < MIN_SAMPLES or len(head) < MIN_SAMPLES:
        return None, None, ""
    if min_two_sided_p(len(base), len(head)) >= alpha:
        return None, None, f"{len(base)} vs {len(head)} samples cannot reach p<{alpha:g}; threshold rule"
    p_value = mann_whitney_u(base, head).p_value
    significant = p_value < alpha
    return (
        significant,
        p_value,
        f"Mann-Whitney p={p_value:.3g}" + ("" if significant else ", not significant"),
    )


def _check_rules_match(
    rules: tuple[Rule, ...], base: Mapping[PointKey, Measured], head: Mapping[PointKey, Measured]
) -> None:
    names = {name for points in (base, head) for point in points.values() for name in point.metrics}
    for rule in rules:
        if not any(rule.matches(name) for name in names):
            raise KvbenchError(f"--fail-on {rule.pattern!r} matches no metric of these runs")


def _meta_notes(base: Summary, head: Summary) -> tuple[str, ...]:
    differing = [
        name
        for name in META_FIELDS_TO_MATCH
        if name in base.meta and name in head.meta and base.meta[name] != head.meta[name]
    ]
    return (f"base and head differ in meta: {', '.join(differing)}",) if differing else ()


def _lookup(point: Mapping[str, Any], dotted: str) -> tuple[bool, Any]:
    value: Any = point
    for part in dotted.split("."):
        if not isinstance(value, Mapping) or part not in value:
            return False, None
        value = value[part]
    return True, value


def _samples(raw: Any) -> tuple[float, ...]:
    if isinstance(raw, list) and all(_is_number(v) for v in raw):
        return tuple(float(v) for v in raw)
    return ()


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _usable(status: str | None) -> bool:
    return status is None or status == "ok"
