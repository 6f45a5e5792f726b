"""One strategy's point of the waste study, typed: the results schema's :class:`Point` and the fields the study adds
(the most requests the pool held, the model's bytes per token, the simulated time, the hindsight mark)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from kvbench.results.point import Point

_OMITTED_WHEN_UNSET = ("max_concurrency", "bytes_per_token", "simulated_seconds")  # written only when set


@dataclass
class StrategyPoint(Point):
    max_concurrency: int | None = None  # the most requests the pool held at once
    bytes_per_token: int | None = None  # KV bytes of one token of the model (every layer)
    simulated_seconds: float | None = None  # the run's length on the simulator's clock
    hindsight_bound: bool = False  # the oracle with answers ending at EOS: a bound, not a runnable engine

    @classmethod
    def of(
        cls,
        point: Point,
        *,
        max_concurrency: int,
        bytes_per_token: int,
        simulated_seconds: float,
        hindsight_bound: bool = False,
    ) -> StrategyPoint:
        """The study's point from the point its simulated run gave."""
        common = {f.name: getattr(point, f.name) for f in fields(Point)}
        return cls(
            **common,
            max_concurrency=max_concurrency,
            bytes_per_token=bytes_per_token,
            simulated_seconds=simulated_seconds,
            hindsight_bound=hindsight_bound,
        )

    def to_json(self) -> dict[str, Any]:
        """The point's JSON form, the study's fields last; the hindsight mark written only when set."""
        out = super().to_json()
        for name in _OMITTED_WHEN_UNSET:
            if out[name] is None:
                del out[name]
        if not self.hindsight_bound:
            del out["hindsight_bound"]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StrategyPoint:
        point = super().from_json(data)
        assert isinstance(point, StrategyPoint)
        point.hindsight_bound = bool(point.hindsight_bound)
        return point
