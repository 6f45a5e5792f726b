"""What a recorded point's judged fields can hold, so a summary that says otherwise is refused as unusable
input rather than compared as data: counts are whole and never negative, ``waste.*_pct`` lie in 0-100,
``fragmentation_mean`` in 0-1, every other judged metric (throughputs, latencies, bytes) is never negative,
and a status is one of the schema's."""

from __future__ import annotations

from typing import Any

from kvbench.results.schema import POINT_STATUSES

COUNT_FIELDS = ("completed", "rejected", "preemptions", "peak_running", "max_concurrency")
FRACTION_FIELDS = ("fragmentation_mean",)


def metric_problem(name: str, value: float) -> str | None:
    """Why a finite ``value`` cannot be metric ``name``, or None when it can."""
    if name in COUNT_FIELDS:
        return None if value >= 0 and float(value).is_integer() else "not a whole number of at least 0"
    if name.startswith("waste.") and name.endswith("_pct"):
        return None if 0 <= value <= 100 else "outside 0-100 (a percentage)"
    if name in FRACTION_FIELDS:
        return None if 0 <= value <= 1 else "outside 0-1 (a fraction)"
    return None if value >= 0 else "negative"


def status_problem(status: Any) -> str | None:
    """Why ``status`` is not a point status (``ok``, ``oom``, ``error``), or None when it is."""
    if status in POINT_STATUSES:
        return None
    return f"not one of {', '.join(POINT_STATUSES)}"
