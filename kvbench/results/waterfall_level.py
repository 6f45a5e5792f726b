"""One level of a point's memory waterfall, typed: its peak size (None where it could not be measured, with the
reason) and the named gap to the next level. A point keeps its levels in ``summary.json`` as ``waterfall``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class WaterfallLevel:
    level: str
    bytes: int | None  # the peak during the run; None: not measured (``reason`` says why)
    source: str  # the point's field it was read from, dotted
    reason: str | None = None
    gap_name: str | None = None  # what the gap to the next level holds
    gap_bytes: int | None = None  # negative where the two peaks fell at different instants
    gap_note: str | None = None
    inactive_split_bytes: int | None = None  # torch reserved: the part no allocation can reuse

    def to_json(self) -> dict[str, Any]:
        """The form ``summary.json`` keeps, key for key; ``inactive_split_bytes`` only where measured."""
        out = {
            "level": self.level,
            "bytes": self.bytes,
            "source": self.source,
            "reason": self.reason,
            "gap_name": self.gap_name,
            "gap_bytes": self.gap_bytes,
            "gap_note": self.gap_note,
        }
        if self.inactive_split_bytes is not None:
            out["inactive_split_bytes"] = self.inactive_split_bytes
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WaterfallLevel:
        return cls(
            str(data.get("level", "")),
            data.get("bytes"),
            str(data.get("source", "")),
            data.get("reason"),
            data.get("gap_name"),
            data.get("gap_bytes"),
            data.get("gap_note"),
            data.get("inactive_split_bytes"),
        )
