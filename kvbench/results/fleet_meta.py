"""A fleet run's metadata (``summary.json``'s ``meta``), typed: what every run records (:class:`RunMeta`) and the
fleet's own settings: the instances or servers, the arrivals, the autoscaler's settings, the rate chosen and the
simulator's check. The parts the fleet writes into it (:class:`FleetAutoscale`, :class:`RateChosen`,
:class:`FleetServer`) have their ``to_json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvbench.results.run_meta import RunMeta, run_fields
from kvbench.results.simulator_check import SimulatorCheck


@dataclass(frozen=True)
class FleetAutoscale:
    """The autoscaler's settings as the run recorded them (a field an older run lacks reads None)."""

    scale_up: float | None = None  # add an instance above this share of the fleet's blocks in use
    scale_down: float | None = None  # drain one below this share
    window_s: float | None = None
    min_instances: int | None = None
    max_instances: int | None = None
    startup_s: float | str | None = None  # seconds (a simulation's setting) or "measured"

    def to_json(self) -> dict[str, Any]:
        return {
            "scale_up": self.scale_up,
            "scale_down": self.scale_down,
            "window_s": self.window_s,
            "min_instances": self.min_instances,
            "max_instances": self.max_instances,
            "startup_s": self.startup_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FleetAutoscale:
        return cls(
            data.get("scale_up"),
            data.get("scale_down"),
            data.get("window_s"),
            data.get("min_instances"),
            data.get("max_instances"),
            data.get("startup_s"),
        )


@dataclass(frozen=True)
class RateChosen:
    """The arrival rate kvbench chose from the simulated fleet's capacity (no ``--rate``), and the load it aimed at."""

    usage: float | None = None  # the share of each pool's blocks it keeps in use
    running_per_instance: float | None = None  # requests in flight on each instance at that load

    def to_json(self) -> dict[str, Any]:
        return {"usage": self.usage, "running_per_instance": self.running_per_instance}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RateChosen:
        return cls(data.get("usage"), data.get("running_per_instance"))


@dataclass(frozen=True)
class FleetServer:
    """A server of a fleet over HTTP (``--target``)."""

    name: str | None = None
    url: str | None = None
    kv_events: str | None = None  # where it publishes its KV events (the precise-prefix policy), if it does

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "url": self.url, "kv_events": self.kv_events}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FleetServer:
        return cls(data.get("name"), data.get("url"), data.get("kv_events"))


@dataclass(frozen=True)
class FleetMeta(RunMeta):
    """A fleet run's metadata: what every run records (:class:`RunMeta`) and the fleet's own settings; what a run
    did not record reads None (or empty)."""

    instances: int | None = None  # kvbench's own instances at the start
    engine: str = "?"  # the KV engine of every instance
    arrivals: str | None = None  # where the arrival times came from
    autoscale: FleetAutoscale | None = None
    rate_chosen: RateChosen | None = None
    servers: list[FleetServer] = field(default_factory=list)  # a fleet of servers over HTTP
    simulator_check: SimulatorCheck | None = None  # servers only: the simulator against the real run

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FleetMeta:
        autoscale, rate, check = data.get("autoscale"), data.get("rate_chosen"), data.get("simulator_check")
        return cls(
            **run_fields(data),
            instances=data.get("instances"),
            engine=(data.get("engines") or ["?"])[0],
            arrivals=data.get("arrivals"),
            autoscale=FleetAutoscale.from_json(autoscale) if autoscale else None,
            rate_chosen=RateChosen.from_json(rate) if rate else None,
            servers=[FleetServer.from_json(server) for server in data.get("servers") or []],
            simulator_check=SimulatorCheck.from_json(check) if check else None,
        )
