"""Numbers as kvbench writes them, in one place: bytes, milliseconds, seconds, throughput, percentages and ratios,
with their unit and thousands separated. A value that is missing or not a number is written ``missing``: an en dash
(``MISSING``, report.html's mark) unless the caller passes its output's, "-" on the console and in Markdown, which
``human_bytes`` and ``ms_text`` (written mostly there) take by default."""

from __future__ import annotations

from typing import Any

from kvbench.values import is_number

_BYTE_UNITS = ("B", "KiB", "MiB", "GiB", "TiB")
MISSING = "–"  # report.html's mark for no value


def _value(value: Any) -> float | None:
    return float(value) if is_number(value, finite=True) else None


def _text(value: Any, spec: str, missing: str, scale: float = 1.0, prefix: str = "", suffix: str = "") -> str:
    v = _value(value)
    return missing if v is None else f"{prefix}{scale * v:{spec}}{suffix}"


def num(value: Any, digits: int = 1, *, missing: str = MISSING) -> str:
    """A plain number, for a column whose header names the unit."""
    return _text(value, f",.{digits}f", missing)


def count(value: Any, *, missing: str = MISSING) -> str:
    """A whole number: requests, blocks, preemptions."""
    return _text(value, ",.0f", missing)


def ms(value: Any, *, missing: str = MISSING) -> str:
    """A latency with its unit, whole milliseconds from 100 up."""
    return ms_number(value, missing=missing) + ("" if _value(value) is None else " ms")


def ms_number(value: Any, *, missing: str = MISSING) -> str:
    """A latency in a column whose header says ms."""
    v = _value(value)
    return _text(v, ",.0f" if v is not None and abs(v) >= 100 else ",.1f", missing)


def seconds(value: Any, *, missing: str = MISSING) -> str:
    """A duration with its unit: 12.5 -> "12.50 s"."""
    return _text(value, ",.2f", missing, suffix=" s")


def tok_s(value: Any, digits: int = 1, *, missing: str = MISSING) -> str:
    """A throughput in a sentence, so the reader needs no header: 1234.5 -> "1,234.5 tok/s"."""
    return _text(value, f",.{digits}f", missing, suffix=" tok/s")


def pct(value: Any, digits: int = 1, *, missing: str = MISSING) -> str:
    """A percentage already in percent (37.2 -> "37.2%")."""
    return _text(value, f",.{digits}f", missing, suffix="%")


def share(value: Any, digits: int = 1, *, missing: str = MISSING) -> str:
    """A share in [0, 1] as a percentage (0.372 -> "37.2%")."""
    return _text(value, f",.{digits}f", missing, scale=100, suffix="%")


def share_number(value: Any, digits: int = 1, *, missing: str = MISSING) -> str:
    """A share in [0, 1] in a column whose header says % (0.372 -> "37.2")."""
    return _text(value, f",.{digits}f", missing, scale=100)


def times(value: Any, *, missing: str = MISSING) -> str:
    """A ratio: 1.37 -> "×1.37"."""
    return _text(value, ",.2f", missing, prefix="×")


def sort_key(value: Any) -> float | None:
    """What a sortable column orders by: the number itself (None sorts last)."""
    return _value(value)


def human_bytes(value: Any, unit: str | None = None, *, missing: str = "-") -> str:
    """``1536`` -> ``1.50 KiB``; ``unit`` fixes the unit (``"GiB"``: figures a message adds up read in one unit)."""
    v = _value(value)
    if v is None:
        return missing
    if unit is not None:
        scaled = v / 1024 ** _BYTE_UNITS.index(unit)
        return f"{scaled:,.0f} B" if unit == "B" else f"{scaled:,.2f} {unit}"
    for name in _BYTE_UNITS:
        if abs(v) < 1024 or name == "TiB":
            return f"{v:,.0f} {name}" if name == "B" else f"{v:,.2f} {name}"
        v /= 1024
    return f"{v:.2f} TiB"


def ms_text(value: Any, *, missing: str = "-") -> str:
    """Milliseconds with three significant digits, so sub-millisecond CPU figures keep their precision:
    0.412, 4.12, 41.2, 412, 4,120."""
    v = _value(value)
    if v is None:
        return missing
    if v < 10:
        return f"{v:.3f}" if v < 1 else f"{v:.2f}"
    return f"{v:.1f}" if v < 100 else f"{v:,.0f}"


def recorded(value: str | None, missing: str = "") -> str:
    """A recorded name (model, device, scenario) as a title shows it; ``missing`` where the run did not record it."""
    return missing if value is None else value
