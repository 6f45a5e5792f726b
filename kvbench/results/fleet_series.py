"""What a fleet's plots draw for one policy (``fleet-<policy>.json``): each instance's block usage over time, the
TTFT distribution, the instances over time, the scaling events and where each request went."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FleetSeries:
    policy: str
    usage: dict[str, list[list[float]]] = field(default_factory=dict)  # instance -> [time s, share of blocks used]
    ttft_cdf: list[list[float]] = field(default_factory=list)  # [TTFT s, share of requests at most that]
    instances: list[list[float]] = field(default_factory=list)  # [time s, serving, starting]
    events: list[list[Any]] = field(default_factory=list)  # [time s, "up" | "down" | ..., instance]
    placement: list[int | None] = field(default_factory=list)  # the instance of each request, in arrival order
    names: dict[str, str] = field(default_factory=dict)  # instance -> a server's label

    def label(self, instance: str) -> str:
        """An instance as a legend names it: its number, and a server's name where it has one."""
        name = self.names.get(instance)
        return f"instance {instance} ({name})" if name else f"instance {instance}"

    def to_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "usage": self.usage,
            "ttft_cdf": self.ttft_cdf,
            "instances": self.instances,
            "events": self.events,
            "placement": self.placement,
            "names": self.names,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FleetSeries:
        """A series file; one without placements or server names reads them empty."""
        return cls(
            policy=data["policy"],
            usage=dict(data.get("usage") or {}),
            ttft_cdf=list(data.get("ttft_cdf") or []),
            instances=list(data.get("instances") or []),
            events=list(data.get("events") or []),
            placement=list(data.get("placement") or []),
            names=dict(data.get("names") or {}),
        )
