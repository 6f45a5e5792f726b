"""Numbers as kvbench writes them, in one place: bytes, milliseconds, seconds, throughput, percentages and ratios,
with their unit and thousands separated. A missing value is a dash: "-" on the console and in Markdown (``human_bytes``,
``ms_text``), an en dash on report.html (the rest)."""

from __future__ import annotations

import math
from typing import Any

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
MISSING = "–"  # report.html's mark for no value


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


def human_bytes(count: float | None, unit: str | None = None) -> str:
    """``1536`` -> ``1.50 KiB``; None -> ``-``; ``unit`` fixes the unit (``"GiB"``: figures a message adds up
    read in one unit)."""
    if count is None:
        return "-"
    if unit is not None:
        scaled = count / 1024 ** _BYTE_UNITS.index(unit)
        return f"{scaled:,.0f} B" if unit == "B" else f"{scaled:,.2f} {unit}"
    for name in _BYTE_UNITS:
        if abs(count) < 1024 or name == "TiB":
            return f"{count:,.0f} {name}" if name == "B" else f"{count:,.2f} {name}"
        count /= 1024
    return f"{count:.2f} TiB"


def ms_text(value: float | None) -> str:
    """Milliseconds with three significant digits, so sub-millisecond CPU figures keep their precision:
    0.412, 4.12, 41.2, 412, 4,120; "-" when there is none."""
    if value is None:
        return "-"
    if value < 10:
        return f"{value:.3f}" if value < 1 else f"{value:.2f}"
    return f"{value:.1f}" if value < 100 else f"{value:,.0f}"


def recorded(value: str | None, missing: str = "") -> str:
    """A recorded name (model, device, scenario) as a title shows it; ``missing`` where the run did not record it."""
    return missing if value is None else value
