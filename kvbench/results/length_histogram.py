"""A histogram of token lengths, typed: bin edges and the requests in each bin. A dataset's profile holds one per
length kind, and a point one of the output lengths that occurred (its ``output_len_hist``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class LengthHistogram:
    edges: list[float]  # bin edges in tokens, one more than the counts
    counts: list[int]  # requests per bin

    def to_json(self) -> dict[str, list]:
        return {"edges": list(self.edges), "counts": list(self.counts)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LengthHistogram:
        return cls(list(data["edges"]), list(data["counts"]))
