"""Which metrics ``kvbench compare`` judges, in which direction, and how much change it tolerates.

The policy follows what each metric depends on (tolerances were sized on repeated identical CPU sweeps,
see the README's compare paragraph for the figures):

- **Deterministic in every run** (same seed and settings give the same value): the scheduler
  advances by engine steps, not by wall-clock time, so the counts (``completed``, ``rejected``, ``preemptions``,
  ``peak_running``, ``max_concurrency``) and the peak and pool bytes (``kv_peak_allocated_bytes``,
  ``kv_peak_used_bytes``, ``kv_pool_bytes``) repeat exactly, and so do ``kvbench share``'s
  step-averaged blocks (``mean_blocks``, ``peak_blocks``, ``mean_bytes``, ``peak_bytes``). Judged
  exactly (to 1e-9 relative: the last bits of a float may differ across numpy versions).
  ``kv_pool_bytes`` is a setting: any change fails.
- **Timing-dependent**: the time-weighted means (``waste.*_pct``, ``kv_mean_used_bytes``,
  ``kv_mean_allocated_bytes``, ``fragmentation_mean``, ``mean_running``: each step counts by its
  duration), every throughput and latency, and the in-run ratios of a paged engine over a contiguous
  one at the same (concurrency, scenario), e.g. ``paged_over_contiguous_output_throughput``.

  - In a *simulated* run (``meta.simulated``: roofline step times) they are deterministic too, and
    judged exactly like the counts, absolute throughput and latencies included.
  - In a *measured* run (the tensor engine on this machine) they are noisy: step times vary with
    the machine's load, so do the step weights, throughputs and latencies. Defaults, with margin over
    the spread of identical CPU sweeps (README, "compare"):

    - time-weighted means: within x1.6 (``waste.*_pct`` ignoring changes under 0.1 points);
    - throughput ratios: within x2.5 from single runs; with repeats, a change must be significant
      (Mann-Whitney U at ``--alpha``: 4 vs 4 samples reach 0.05, 3 vs 3 cannot) *and* beyond x1.35
      (a 30% drop is x1.43);
    - p99 latency ratios: reported, not gated, from single runs; with repeats, significant and beyond x8;
    - absolute throughput and latency (``--absolute``): reported, never gated by default (identical
      sweeps minutes apart differed x3 in throughput with p=0.03): gate them with ``--fail-on``.
- ``memory.*`` (process and device peaks) depends on the machine: judged within 10% only with
  ``--absolute`` or a ``--fail-on`` rule naming it.

A ``--fail-on METRIC:THRESHOLD`` rule replaces the tolerance (and gates a reported-only metric):
``5%`` is relative to the base value, a bare number an absolute change in the metric's unit.
METRIC may be an fnmatch pattern.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum
from fnmatch import fnmatchcase

from kvbench.errors import KvbenchError
from kvbench.results.schema import LATENCY_KINDS, MEMORY_FIELDS, METRIC_DIRECTIONS

COUNT_METRICS = ("completed", "rejected", "preemptions", "peak_running", "max_concurrency")
PEAK_BYTES_METRICS = ("kv_peak_allocated_bytes", "kv_peak_used_bytes", "kv_pool_bytes")
SHARE_METRICS = ("mean_blocks", "peak_blocks", "mean_bytes", "peak_bytes")  # step-averaged: deterministic
TIME_WEIGHTED_METRICS = (
    "waste.token_state_pct",
    "waste.reservation_pct",
    "waste.internal_pct",
    "waste.external_pct",
    "kv_mean_used_bytes",
    "kv_mean_allocated_bytes",
    "fragmentation_mean",
    "mean_running",
)
THROUGHPUT_METRICS = ("output_throughput", "total_token_throughput", "request_throughput")
TAIL_RATIO_METRICS = tuple(f"p99_{kind}_ms" for kind in LATENCY_KINDS)
RATIO_METRICS = (*THROUGHPUT_METRICS, *TAIL_RATIO_METRICS)
MEMORY_METRICS = tuple(f"memory.{name}" for name in MEMORY_FIELDS)
RATIO_NUMERATOR_PREFIX = "paged"
RATIO_DENOMINATOR_PREFIX = "contiguous"

SETTING = 0  # direction of a metric that is a setting: any change beyond the tolerance fails
DIRECTIONS: dict[str, int] = {
    **METRIC_DIRECTIONS,
    "max_concurrency": +1,
    "kv_peak_used_bytes": -1,
    "kv_pool_bytes": SETTING,
    "kv_mean_allocated_bytes": -1,
    "mean_running": +1,
    **dict.fromkeys(SHARE_METRICS, -1),
    **dict.fromkeys(MEMORY_METRICS, -1),
}


class Mode(str, Enum):
    RELATIVE = "relative"  # value is a fraction of |base| (0.05 = 5%)
    ABSOLUTE = "absolute"  # value is a change in the metric's unit
    FACTOR = "factor"  # value is a ratio head/base (or base/head) > 1


@dataclass(frozen=True)
class Threshold:
    """How much worse a metric may get before it regresses (and better before it improves)."""

    value: float
    mode: Mode
    floor: float = 0.0  # a change of at most this much (in the metric's unit) never counts
    label: str = ""  # how the report shows it, when not by its value

    def judge(self, base: float, head: float, direction: int) -> int:
        """-1 when ``head`` is worse than ``base`` beyond this threshold, +1 when better beyond it, else 0."""
        change = head - base
        if abs(change) <= self.floor or change == 0:
            return 0
        if self.mode is Mode.FACTOR:
            beyond = _factor_beyond(base, head, self.value)
        else:
            limit = self.value * abs(base) if self.mode is Mode.RELATIVE else self.value
            beyond = abs(change) > limit * (1 + 1e-9)
        if not beyond:
            return 0
        if direction == SETTING:
            return -1
        return 1 if change * direction > 0 else -1

    def __str__(self) -> str:
        if self.label:
            return self.label
        if self.mode is Mode.FACTOR:
            text = f"x{self.value:g}"
        elif self.mode is Mode.RELATIVE:
            text = f"{self.value * 100:g}%"
        else:
            text = f"{self.value:g}"
        return f"{text} (min {self.floor:g})" if self.floor else text


def _factor_beyond(base: float, head: float, factor: float) -> bool:
    if base <= 0 or head <= 0:  # from or to zero is beyond any factor
        return True
    return max(head / base, base / head) > factor * (1 + 1e-9)


# exact, but float results may differ in their last bits (summation order across numpy versions)
EXACT = Threshold(1e-9, Mode.RELATIVE, floor=1e-12, label="exact")
MEMORY_THRESHOLD = Threshold(0.10, Mode.RELATIVE)
# Measured runs: sized on identical CPU sweeps (README, "compare"), with margin. A time-weighted mean varied
# up to x1.39 between single runs; a single run's paged/contiguous throughput ratio up to x1.74. With 4
# repeats a side, identical sweeps run minutes apart still differed "significantly" (the machine's load
# shifts between runs, which no test on the repeats can tell from a change): throughput ratios by up to
# x1.28, p99 ratios x4.2, absolute throughput x3.1 and latencies x9.2 (these last are never gated).
TIME_WEIGHTED_THRESHOLDS = {
    "waste.": Threshold(1.6, Mode.FACTOR, floor=0.1),  # floor in percentage points of the pool
    "fragmentation_mean": Threshold(1.6, Mode.FACTOR, floor=0.001),
    "mean_running": Threshold(1.6, Mode.FACTOR, floor=0.1),
    "kv_mean_": Threshold(1.6, Mode.FACTOR),
}
RATIO_SINGLE = Threshold(2.5, Mode.FACTOR)
RATIO_SAMPLED = Threshold(1.35, Mode.FACTOR)  # a 30% drop is x1.43
# One run of engines stepped in turn (interleaved): both see the same load, so their ratio holds where each
# engine's own throughput does not (docs/REPORT.md gives the spread measured).
RATIO_INTERLEAVED = Threshold(1.35, Mode.FACTOR)
TAIL_RATIO_SAMPLED = Threshold(8.0, Mode.FACTOR)
SINGLE_RUN_NOTE = "single run: too noisy to gate (repeat each point 4+ times, or gate it with an explicit rule)"
ABSOLUTE_TIMING_NOTE = "absolute timing of a measured run: too noisy to gate (only an explicit rule gates it)"


@dataclass(frozen=True)
class MetricPolicy:
    direction: int  # +1 higher is better, -1 lower is better, SETTING: must not change
    single: Threshold | None  # tolerance without a usable significance test; None: reported, not gated
    sampled: Threshold | None = None  # tolerance once Mann-Whitney U finds a change; None: reported
    single_interleaved: Threshold | None = None  # a single run's tolerance for engines stepped in turn
    noisy: bool = False  # timing-dependent: repeat samples are tested
    by_default: bool = True  # judged without --absolute or a rule naming it
    ungated_note: str = SINGLE_RUN_NOTE  # why a metric without a threshold is only reported
    timed: bool = False  # depends on step times: too short a point cannot judge it


def ratio_metric_name(numerator: str, denominator: str, metric: str) -> str:
    return f"{numerator}_over_{denominator}_{metric}"


def metric_policy(name: str, *, simulated: bool) -> MetricPolicy | None:
    """The policy of a point metric or derived ratio, or None for a name kvbench does not judge."""
    ratio_of = _ratio_base(name)
    direction = DIRECTIONS.get(ratio_of or name)
    if direction is None:
        return None
    if name in MEMORY_METRICS:
        return MetricPolicy(direction, MEMORY_THRESHOLD, by_default=False)
    if simulated or name in (*COUNT_METRICS, *PEAK_BYTES_METRICS, *SHARE_METRICS):
        return MetricPolicy(direction, EXACT)
    if name in TIME_WEIGHTED_METRICS:
        return MetricPolicy(direction, _time_weighted_threshold(name), timed=True)
    if ratio_of in THROUGHPUT_METRICS:
        return MetricPolicy(direction, RATIO_SINGLE, RATIO_SAMPLED, RATIO_INTERLEAVED, noisy=True, timed=True)
    if ratio_of is not None:  # a tail-latency ratio
        return MetricPolicy(direction, None, TAIL_RATIO_SAMPLED, noisy=True, timed=True)
    return MetricPolicy(
        direction, None, None, noisy=True, by_default=False, ungated_note=ABSOLUTE_TIMING_NOTE, timed=True
    )


def _ratio_base(name: str) -> str | None:
    if "_over_" not in name:
        return None
    return next((metric for metric in RATIO_METRICS if name.endswith(f"_{metric}")), None)


def _time_weighted_threshold(name: str) -> Threshold:
    return next(threshold for prefix, threshold in TIME_WEIGHTED_THRESHOLDS.items() if name.startswith(prefix))


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
        raise KvbenchError(f"rule {text!r}: expected METRIC:THRESHOLD, e.g. paged_over_contiguous_output_throughput:5%")
    relative = raw.endswith("%")
    try:
        value = float(raw[:-1] if relative else raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        raise KvbenchError(f"rule {text!r}: the threshold must be a non-negative number or percentage")
    return Rule(pattern, Threshold(value / 100, Mode.RELATIVE) if relative else Threshold(value, Mode.ABSOLUTE))


def matching_rule(metric: str, rules: tuple[Rule, ...]) -> Threshold | None:
    """The last matching rule's threshold, if any."""
    for rule in reversed(rules):
        if rule.matches(metric):
            return rule.threshold
    return None
