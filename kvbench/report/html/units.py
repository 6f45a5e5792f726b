"""Numbers as a report shows them: with their unit, thousands separated, and a dash where there is no value."""

from __future__ import annotations

import math
from typing import Any

from kvbench.values import human_bytes

MISSING = "–"


def _value(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def num(value: Any, digits: int = 1) -> str:
    v = _value(value)
    return MISSING if v is None else f"{v:,.{digits}f}"


def count(value: Any) -> str:
    v = _value(value)
    return MISSING if v is None else f"{v:,.0f}"


def tok_s(value: Any) -> str:
    v = _value(value)
    return MISSING if v is None else f"{v:,.1f} tok/s"


def ms(value: Any) -> str:
    v = _value(value)
    if v is None:
        return MISSING
    return f"{v:,.0f} ms" if abs(v) >= 100 else f"{v:,.1f} ms"


def ms_number(value: Any) -> str:
    """A latency in a column whose header says ms."""
    v = _value(value)
    if v is None:
        return MISSING
    return f"{v:,.0f}" if abs(v) >= 100 else f"{v:,.1f}"


def seconds(value: Any) -> str:
    v = _value(value)
    return MISSING if v is None else f"{v:,.2f} s"


def pct(value: Any, digits: int = 1) -> str:
    """A percentage already in percent (37.2 -> "37.2%")."""
    v = _value(value)
    return MISSING if v is None else f"{v:,.{digits}f}%"


def share(value: Any, digits: int = 1) -> str:
    """A share in [0, 1] as a percentage (0.372 -> "37.2%")."""
    v = _value(value)
    return MISSING if v is None else f"{100 * v:,.{digits}f}%"


def signed_pct(value: Any) -> str:
    """+37%, -4%; a change that rounds to zero is 0% (never -0%)."""
    v = _value(value)
    if v is None:
        return MISSING
    return "0%" if round(v) == 0 else f"{v:+,.0f}%"


def times(value: Any) -> str:
    """A ratio: 1.37 -> "×1.37"."""
    v = _value(value)
    return MISSING if v is None else f"×{v:,.2f}"


def nbytes(value: Any) -> str:
    v = _value(value)
    return MISSING if v is None else human_bytes(v)


def sort_key(value: Any) -> float | None:
    """What a sortable column orders by: the number itself (None sorts last)."""
    return _value(value)
