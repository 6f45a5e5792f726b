"""What a run drew from a dataset file, as its ``meta.dataset`` records it: the records read, kept and left out,
and how their lengths were counted."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class DatasetDraw:
    path: str  # the file, or a shipped dataset's path
    format: str = ""  # sharegpt | jsonl
    records: int = 0  # records in the file
    usable: int = 0  # records left after the unreadable and the ones that do not fit
    requests: int = 0  # requests drawn
    with_replacement: bool = False  # more requests asked than usable records
    skipped_records: dict[str, int] = field(default_factory=dict)  # unreadable, per reason
    dropped_records: dict[str, int] = field(default_factory=dict)  # too short or too long, per reason
    counted_by: str = ""  # the tokenizer, or words and punctuation marks

    def to_json(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "format": self.format,
            "records": self.records,
            "usable": self.usable,
            "requests": self.requests,
            "with_replacement": self.with_replacement,
            "skipped_records": dict(self.skipped_records),
            "dropped_records": dict(self.dropped_records),
            "counted_by": self.counted_by,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DatasetDraw:
        return cls(
            data["path"],
            data.get("format", ""),
            data.get("records", 0),
            data.get("usable", 0),
            data.get("requests", 0),
            data.get("with_replacement", False),
            dict(data.get("skipped_records") or {}),
            dict(data.get("dropped_records") or {}),
            data.get("counted_by", ""),
        )
