"""Dotted lookups into a point as JSON holds it (``waste.internal_pct``), written once."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvbench.errors import KvbenchError


def lookup(point: Mapping[str, Any], dotted: str, where: str | None = None) -> tuple[bool, Any]:
    """``(found, value)`` of a dotted field such as ``waste.internal_pct``.

    With ``where`` (a file and point, for the message), a part of the path that is not an object is an error
    rather than "not found": the reader is judging the file, and a corrupted one must not pass quietly.
    """
    value: Any = point
    parts = dotted.split(".")
    for depth, part in enumerate(parts):
        if not isinstance(value, Mapping):
            if where is None or depth == 0:
                return False, None
            raise KvbenchError(f"{where}: '{'.'.join(parts[:depth])}' is {value!r}, not an object")
        if part not in value:
            return False, None
        value = value[part]
    return True, value


def value_at(point: Mapping[str, Any], dotted: str) -> Any:
    """The value of a dotted field, or None when it is absent."""
    return lookup(point, dotted)[1]
