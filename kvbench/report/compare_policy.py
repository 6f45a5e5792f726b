"""Which metrics ``kvbench compare`` judges, in which direction, and how much change it tolerates.

CI machines are shared and noisy, so the default policy is:

- deterministic metrics are always compared, with small tolerances:
  counts (completed, rejected, preemptions, peak_running, max_concurrency) exactly;
  waste shares (``waste.*_pct``) within 0.5 percentage points; ``fragmentation_mean`` within 0.005;
  KV bytes (``kv_*_bytes``) within 1% (the tolerances absorb step-time weighting on real hardware);
- absolute throughputs, latencies and ``memory.*`` are machine-dependent: compared (within 10%) only
  with ``--absolute`` or when a ``--fail-on`` rule names them;
- in-run ratios, a paged engine over a contiguous one at the same (concurrency, scenario), e.g.
  ``paged_over_contiguous_output_throughput``, are stable across machines: compared within 5%.

A ``--fail-on METRIC:THRESHOLD`` rule overrides the tolerance: ``5%`` is relative to the base value,
a bare number is an absolute change in the metric's unit. METRIC may be an fnmatch pattern.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fnmatch import fnmatchcase

from kvbench.errors import KvbenchError
from kvbench.report.schema import LATENCY_FIELDS, LATENCY_KINDS, MEMORY_FIELDS, METRIC_DIRECTIONS

COUNT_METRICS = ("completed", "rejected", "preemptions", "peak_running", "max_concurrency")
THROUGHPUT_METRICS = ("output_throughput", "total_token_throughput", "request_throughput")
RATIO_METRICS = (*THROUGHPUT_METRICS, *(f"p99_{kind}_ms" for kind in LATENCY_KINDS))
RATIO_NUMERATOR_PREFIX = "paged"
RATIO_DENOMINATOR_PREFIX = "contiguous"

DIRECTIONS: dict[str, int] = {
    **METRIC_DIRECTIONS,
    "max_concurrency": +1,
    **{f"memory.{name}": -1 for name in MEMORY_FIELDS},
}
ABSOLUTE_METRICS = frozenset((*THROUGHPUT_METRICS, *LATENCY_FIELDS, *(f"memory.{m}" for m in MEMORY_FIELDS)))


@dataclass(frozen=True)
class Threshold:
    """How much worse a metric may get before it regresses (and better before it improves)."""

    value: float
    relative: bool  # value is a fraction of |base| (0.05 = 5%), else an absolute change

    def exceeded_by(self, worse: float, base: float) -> bool:
        """Whether a change making the metric ``worse`` (negative: better) goes past this threshold."""
        if self.relative:
            if base == 0:
                return worse > 0
            worse = worse / abs(base)
        return worse > self.value + 1e-9

    def __str__(self) -> str:
        return f"{self.value * 100:g}%" if self.relative else f"{self.value:g}"


RATIO_THRESHOLD = Threshold(0.05, relative=True)
ABSOLUTE_THRESHOLD = Threshold(0.10, relative=True)
COUNT_THRESHOLD = Threshold(0.0, relative=False)
WASTE_PCT_THRESHOLD = Threshold(0.5, relative=False)
FRAGMENTATION_THRESHOLD = Threshold(0.005, relative=False)
BYTES_THRESHOLD = Threshold(0.01, relative=True)


@dataclass(frozen=True)
class MetricPolicy:
    direction: int  # +1 higher is better, -1 lower is better
    threshold: Threshold
    noisy: bool  # timing-dependent: repeat samples and Mann-Whitney apply
    by_default: bool  # compared without --absolute or a rule naming it


def ratio_metric_name(numerator: str, denominator: str, metric: str) -> str:
    return f"{numerator}_over_{denominator}_{metric}"


def metric_policy(name: str) -> MetricPolicy | None:
    """The policy of a point metric or derived ratio, or None for a name kvbench does not judge."""
    if "_over_" in name:
        for metric in RATIO_METRICS:
            if name.endswith(f"_{metric}"):
                return MetricPolicy(DIRECTIONS[metric], RATIO_THRESHOLD, noisy=True, by_default=True)
    direction = DIRECTIONS.get(name)
    if direction is None:
        return None
    if name in ABSOLUTE_METRICS:
        return MetricPolicy(direction, ABSOLUTE_THRESHOLD, noisy=True, by_default=False)
    return MetricPolicy(direction, _deterministic_threshold(name), noisy=False, by_default=True)


def _deterministic_threshold(name: str) -> Threshold:
    if name in COUNT_METRICS:
        return COUNT_THRESHOLD
    if name.startswith("waste."):
        return WASTE_PCT_THRESHOLD
    if name.endswith("_bytes"):
        return BYTES_THRESHOLD
    if name == "fragmentation_mean":
        return FRAGMENTATION_THRESHOLD
    return COUNT_THRESHOLD


@dataclass(frozen=True)
class Rule:
    """A ``--fail-on METRIC:THRESHOLD`` rule."""

    pattern: str
    threshold: Threshold

    def matches(self, metric: str) -> bool:
        return fnmatchcase(metric, self.pattern)


def parse_rule(text: str) -> Rule:
    pattern, sep, raw = text.rpartition(":")
    pattern, raw = pattern.strip(), raw.strip()
    if not sep or not pattern or not raw:
        raise KvbenchError(
            f"--fail-on {text!r}: expected METRIC:THRESHOLD, e.g. paged_over_contiguous_output_throughput:5%"
        )
    relative = raw.endswith("%")
    try:
        value = float(raw[:-1] if relative else raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise KvbenchError(f"--fail-on {text!r}: threshold must be a non-negative number or percentage")
    return Rule(pattern, Threshold(value / 100 if relative else value, relative))


def threshold_for(metric: str, policy: MetricPolicy, rules: tuple[Rule, ...]) -> Threshold:
    """The last matching rule's threshold, else the policy's default."""
    for rule in reversed(rules):
        if rule.matches(metric):
            return rule.threshold
    return policy.threshold
