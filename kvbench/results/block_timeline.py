"""A sweep point's KV blocks in use over time (``timeline-<engine>-c<concurrency>.json`` of a run directory), typed:
what blocks_over_time.png draws against the pool's size."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BlockTimeline:
    engine: str
    concurrency: int
    total_blocks: int  # the KV pool's size in blocks
    time_s_blocks: list[list[float]] = field(default_factory=list)  # (seconds since the start, blocks in use)

    @property
    def times(self) -> list[float]:
        return [t for t, _ in self.time_s_blocks]

    @property
    def blocks(self) -> list[float]:
        return [b for _, b in self.time_s_blocks]

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "concurrency": self.concurrency,
            "total_blocks": self.total_blocks,
            "time_s_blocks": self.time_s_blocks,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> BlockTimeline:
        return cls(
            engine=data.get("engine", ""),
            concurrency=data.get("concurrency", 0),
            total_blocks=data["total_blocks"],
            time_s_blocks=data["time_s_blocks"],
        )
