"""What a fleet run's metadata (``summary.json``'s ``meta``) says about the fleet, typed for its report: the
instances or servers, the arrivals, the autoscaler's settings, the rate chosen and the simulator's check.

The metadata itself is the run's (:func:`kvbench.results.run_meta.run_meta`): command line, versions, host and
every setting; :class:`FleetMeta` reads the part the fleet's table, page and verdict show. The parts the fleet
writes into it (:class:`FleetAutoscale`, :class:`RateChosen`, :class:`FleetServer`) have their ``to_json``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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
class FleetMeta:
    """The fleet's part of a run's metadata; what a run did not record reads None (or empty, or False)."""

    simulated: bool = False
    interrupted: bool = False  # Ctrl-C: the summary of the policies that finished
    instances: int | None = None  # kvbench's own instances at the start
    model_name: str | None = None
    engine: str = "?"  # the KV engine of every instance
    requests: int | None = None
    arrivals: str | None = None  # where the arrival times came from
    budget_source: str | None = None  # how each instance's KV pool was sized
    autoscale: FleetAutoscale | None = None
    rate_chosen: RateChosen | None = None
    servers: list[FleetServer] = field(default_factory=list)  # a fleet of servers over HTTP
    simulator_check: SimulatorCheck | None = None  # servers only: the simulator against the real run

    @classmethod
    def from_json(cls, meta: Mapping[str, Any]) -> FleetMeta:
        autoscale, rate, check = meta.get("autoscale"), meta.get("rate_chosen"), meta.get("simulator_check")
        return cls(
            simulated=bool(meta.get("simulated")),
            interrupted=bool(meta.get("interrupted")),
            instances=meta.get("instances"),
            model_name=meta.get("model_name"),
            engine=(meta.get("engines") or ["?"])[0],
            requests=meta.get("requests"),
            arrivals=meta.get("arrivals"),
            budget_source=meta.get("budget_source"),
            autoscale=FleetAutoscale.from_json(autoscale) if autoscale else None,
            rate_chosen=RateChosen.from_json(rate) if rate else None,
            servers=[FleetServer.from_json(server) for server in meta.get("servers") or []],
            simulator_check=SimulatorCheck.from_json(check) if check else None,
        )
