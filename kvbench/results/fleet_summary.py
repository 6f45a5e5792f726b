"""A fleet run's ``summary.json``: the run's metadata and a point per routing policy, in the order they ran."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvbench.results.fleet_meta import FleetMeta
from kvbench.results.fleet_point import FleetPoint
from kvbench.results.run_meta import summary_document


@dataclass(frozen=True)
class FleetSummary:
    meta: FleetMeta
    points: list[FleetPoint] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return summary_document("fleet", self.meta.to_json(), [point.to_json() for point in self.points])

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FleetSummary:
        return cls(
            FleetMeta.from_json(data.get("meta") or {}),
            [FleetPoint.from_json(point) for point in data.get("points") or []],
        )
