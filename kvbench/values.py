"""Value helpers shared from layer 2 up: what counts as a number read from JSON or a config file, text from
outside made safe to print, a thread count as a user writes it and as a run chose it (:class:`ThreadChoice`,
torch-free so that the serve front end can read it). One copy of each, below everything that uses them (numbers
as text are in :mod:`kvbench.units`)."""

from __future__ import annotations

import math
import unicodedata
from dataclasses import dataclass
from typing import Any, TypeGuard

from kvbench.errors import KvbenchError

FLOAT_MAX_INT = int(1.7976931348623157e308)  # ints beyond this have no float: as unusable as infinity


def is_number(value: Any, *, finite: bool) -> TypeGuard[float]:
    """An int or float, never a bool (which Python counts as an int); with ``finite`` not NaN or infinity
    either. Every caller says which it needs: JSON has no NaN, but Python's json module reads one."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    if isinstance(value, int):  # every int is finite; one past float's range would overflow isfinite
        return not finite or abs(value) <= FLOAT_MAX_INT
    return math.isfinite(value) or not finite


def number(value: Any) -> float | None:
    """A figure as a reader judges it: a finite or infinite number as a float; None for anything else (a bool,
    NaN, text, null), so nothing is judged on a guess."""
    return float(value) if is_number(value, finite=False) and not math.isnan(value) else None


def int_or_none(value: Any) -> int | None:
    """A count or size read from JSON: a finite number as an int (a fraction cut toward zero); None for anything
    else (a bool, NaN, infinity, text, null)."""
    return int(value) if is_number(value, finite=True) else None


def text_or_none(value: Any) -> str | None:
    """A recorded name or setting as text: None where it was not recorded (null) or recorded empty."""
    return str(value) if value not in (None, "") else None


def is_positive(value: Any) -> TypeGuard[float]:
    """A finite number above zero (a measured throughput, size or duration that can divide)."""
    return is_number(value, finite=True) and value > 0


def printable(text: str, limit: int | None = None) -> str:
    """Text from outside (a server's label value, a file's field) as it may be shown on a terminal: control
    and format characters (an escape sequence's ESC, a carriage return, a bidirectional override) written as
    ``\\x1b``-style escapes, never sent to the terminal; cut to ``limit`` characters with ``...``."""
    out = "".join(
        char if unicodedata.category(char)[0] != "C" else char.encode("unicode_escape").decode("ascii")
        for char in str(text)
    )
    return out if limit is None or len(out) <= limit else out[:limit] + "..."


MAX_THREADS = 4096  # more than any machine's cores: a thread pool that large fails to start, not to run


@dataclass(frozen=True)
class ThreadChoice:
    """The CPU intra-op threads a run's matmuls use, and why (``kvbench.cpu.threads.choose_threads``)."""

    threads: int
    reason: str  # "set by the user", or the measured timings

    def as_dict(self) -> dict[str, Any]:
        """The JSON form a run's meta records: ``{"threads", "reason"}``."""
        return {"threads": self.threads, "reason": self.reason}


def parse_threads(text: str | int | None) -> int | None:
    """``auto`` (or None) -> None; a positive integer -> itself; anything else is a one-line error."""
    if text is None or text == "auto":
        return None
    try:
        threads = int(text)
    except (TypeError, ValueError):
        raise KvbenchError(f"threads must be a positive integer or auto, got {text!r}") from None
    if not 1 <= threads <= MAX_THREADS:
        raise KvbenchError(f"threads must be between 1 and {MAX_THREADS:,} or auto, got {threads}")
    return threads
