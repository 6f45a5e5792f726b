"""What a recorded point's judged fields can hold, so a summary that says otherwise is refused as unusable
input rather than compared as data: counts are whole and never negative, ``waste.*_pct`` lie in 0-100,
``fragmentation_mean`` in 0-1, every other judged metric (throughputs, latencies, bytes) is never negative,
and a status is one of the schema's."""

from __future__ import annotations

from typing import Any

from kvbench.results.schema import POINT_STATUSES
from kvbench.values import is_number

MAX_COUNT = 2**53  # past this a float no longer holds every whole number
COUNT_FIELDS = ("completed", "rejected", "preemptions", "peak_running", "max_concurrency")
FRACTION_FIELDS = ("fragmentation_mean",)


def metric_problem(name: str, value: float) -> str | None:
    """Why a finite ``value`` cannot be metric ``name``, or None when it can."""
    if name in COUNT_FIELDS:
        if value > MAX_COUNT:
            return "beyond any count a run keeps (2**53)"
        return None if value >= 0 and float(value).is_integer() else "not a whole number of at least 0"
    if name.endswith("_pct"):
        return None if 0 <= value <= 100 else "outside 0-100 (a percentage)"
    if name in FRACTION_FIELDS:
        return None if 0 <= value <= 1 else "outside 0-1 (a fraction)"
    return None if value >= 0 else "negative"


# What no run could produce (the largest serving fleets do millions of tokens a second; a latency of eleven days
# is a hang, not a measurement): a summary past these was not written by kvbench.
UPPER_BOUNDS = {
    "_throughput": 1e9,
    "_ms": 1e9,
    "_s": 1e9,
    "duration": 1e9,
    "_bytes": float(1 << 60),
}
CHECKED_PREFIXES = ("waste.",)
CHECKED_SUFFIXES = ("_throughput", "_ms", "_s", "duration", "_bytes", "_pct")


def bound_problem(name: str, value: float) -> str | None:
    """Why ``value`` is more than any run could record as ``name``, or None."""
    for suffix, bound in UPPER_BOUNDS.items():
        if name.endswith(suffix) and value > bound:
            return f"above {bound:g}, more than any run could record"
    return None


def point_problem(point: dict[str, Any]) -> str | None:
    """The first of a recorded point's figures that cannot be true (``name is value, why``), or None: counts,
    shares, fractions, throughputs, latencies and bytes, where present and not null."""
    fields: list[tuple[str, Any]] = list(point.items())
    waste = point.get("waste")
    if isinstance(waste, dict):
        fields += [(f"waste.{name}", value) for name, value in waste.items() if name.endswith("_pct")]
    for name, value in fields:
        judged = (
            name in COUNT_FIELDS or name in FRACTION_FIELDS or name.startswith(CHECKED_PREFIXES)
        ) or name.endswith(CHECKED_SUFFIXES)
        if not judged or value is None or isinstance(value, dict):  # a dict is a group of figures (waste_peak_pct)
            continue
        if not is_number(value, finite=True):
            return f"metric {name} is {_shown(value)}, not a number"
        problem = metric_problem(name, value) or bound_problem(name, value)
        if problem:
            return f"metric {name} is {_shown(value)}, {problem}"
    return None


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def status_problem(status: Any) -> str | None:
    """Why ``status`` is not a point status (``ok``, ``oom``, ``error``), or None when it is."""
    if status in POINT_STATUSES:
        return None
    return f"not one of {', '.join(POINT_STATUSES)}"
