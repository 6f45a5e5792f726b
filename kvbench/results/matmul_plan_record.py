"""The CPU's measured matmul plan as a run records it (``meta.cpu_matmuls``): each weight's path by row count and
the timings that chose it, typed for the page's table; ``to_json`` is the record as the run wrote it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class MatmulChoiceRecord:
    """One weight: the path its matmul takes at each row count."""

    shape: list[int] = field(default_factory=list)  # [out, in]
    rows: list[int] = field(default_factory=list)  # the row counts measured, ascending
    paths: list[str] = field(default_factory=list)  # the path chosen at each of ``rows``
    timings_us: dict[str, dict[str, float]] = field(default_factory=dict)  # rows -> path -> µs per call

    def to_json(self) -> dict[str, Any]:
        return {"shape": self.shape, "rows": self.rows, "paths": self.paths, "timings_us": self.timings_us}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MatmulChoiceRecord:
        timings = data.get("timings_us") or {}
        return cls(
            shape=list(data.get("shape") or []),
            rows=list(data.get("rows") or []),
            paths=list(data.get("paths") or []),
            timings_us={str(rows): dict(by_path) for rows, by_path in timings.items() if isinstance(by_path, Mapping)},
        )


@dataclass(frozen=True)
class MatmulPlanRecord:
    """Every weight's choice, for one model at one thread count."""

    threads: int | None  # as recorded
    dtype: str | None
    source: str | None  # how it came to be: measured now / cached / forced
    weights: dict[str, MatmulChoiceRecord] = field(default_factory=dict)  # by weight role

    def to_json(self) -> dict[str, Any]:
        return {
            "threads": self.threads,
            "dtype": self.dtype,
            "source": self.source,
            "weights": {role: choice.to_json() for role, choice in self.weights.items()},
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> MatmulPlanRecord:
        weights = data.get("weights") or {}
        return cls(
            threads=data.get("threads"),
            dtype=data.get("dtype"),
            source=data.get("source"),
            weights={
                str(role): MatmulChoiceRecord.from_json(choice)
                for role, choice in weights.items()
                if isinstance(choice, Mapping)
            },
        )

    @classmethod
    def recorded(cls, value: Any) -> MatmulPlanRecord | None:
        """The plan a run recorded, or None where it recorded none (not a CPU run) or something else."""
        if not isinstance(value, Mapping) or not isinstance(value.get("weights"), Mapping):
            return None
        return cls.from_json(value)
