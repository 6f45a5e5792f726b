"""What ``kvbench dataset`` found, typed: the token lengths of the requests a run of a dataset would draw, their
histograms, and the KV waste each strategy would show at their final lengths. ``summary.json`` keeps it as the
``kind: dataset`` document (:meth:`DatasetResult.to_json`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvbench.results.length_histogram import LengthHistogram
from kvbench.results.run_meta import RunMeta, run_fields
from kvbench.results.schema import SCHEMA_VERSION

LENGTHS = ("prompt", "output", "total")  # the lengths profiled, in the document's order


@dataclass(frozen=True)
class LengthStats:
    """One length's distribution over the requests, in tokens."""

    count: int
    mean: float
    p50: float
    p90: float
    p99: float
    min: int
    max: int

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "mean": self.mean,
            "p50": self.p50,
            "p90": self.p90,
            "p99": self.p99,
            "min": self.min,
            "max": self.max,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LengthStats:
        return cls(data["count"], data["mean"], data["p50"], data["p90"], data["p99"], data["min"], data["max"])


@dataclass(frozen=True)
class AnalyticWaste:
    """The article's estimate of a max-len reservation's waste, taken at the mean length."""

    formula: str
    mean_len: float  # mean final length (prompt + answer), tokens
    at_mean_len_pct: float | None  # (max_len - mean_len) / max_len, %

    def to_json(self) -> dict[str, Any]:
        return {"formula": self.formula, "mean_len": self.mean_len, "at_mean_len_pct": self.at_mean_len_pct}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AnalyticWaste:
        return cls(data.get("formula", ""), data.get("mean_len", 0), data.get("at_mean_len_pct"))


@dataclass(frozen=True)
class WasteEstimate:
    """One strategy's holding at every request's final length (a point of the document)."""

    engine: str  # the strategy: contiguous-max, contiguous-pow2, paged-<block size>
    held_tokens: float | None  # token slots held at the requests' ends, summed
    written_tokens: float | None  # token states written, summed
    waste_pct: float | None  # share of the held slots never written
    concurrency: int = 1
    scenario: str = "dataset"
    status: str = "ok"

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "concurrency": self.concurrency,
            "held_tokens": self.held_tokens,
            "written_tokens": self.written_tokens,
            "waste_pct": self.waste_pct,
            "scenario": self.scenario,
            "status": self.status,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WasteEstimate:
        return cls(
            data["engine"],
            data.get("held_tokens"),
            data.get("written_tokens"),
            data.get("waste_pct"),
            data.get("concurrency", 1),
            data.get("scenario", "dataset"),
            data.get("status", "ok"),
        )


@dataclass(frozen=True)
class DatasetMeta(RunMeta):
    """The run's metadata: what every run records (:class:`RunMeta`: command, versions, host, the dataset drawn,
    max-len, seed) and what this one read with."""

    model: str | None = None  # whose tokenizer counted the tokens
    note: str = ""  # one sentence: what was kept, skipped and dropped

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DatasetMeta:
        return cls(**run_fields(data), model=data.get("model"), note=data.get("note", ""))


@dataclass(frozen=True)
class DatasetResult:
    """The ``kind: dataset`` summary document."""

    meta: DatasetMeta
    lengths: dict[str, LengthStats]  # prompt, output and total
    histograms: dict[str, LengthHistogram]  # the same three
    analytic: AnalyticWaste | None
    points: list[WasteEstimate] = field(default_factory=list)  # one per strategy
    schema_version: int = SCHEMA_VERSION

    def point(self, engine: str) -> WasteEstimate | None:
        return next((p for p in self.points if p.engine == engine), None)

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": "dataset",
            "meta": self.meta.to_json(),
            "lengths": {name: stats.to_json() for name, stats in self.lengths.items()},
            "histograms": {name: hist.to_json() for name, hist in self.histograms.items()},
            "analytic": self.analytic.to_json() if self.analytic else None,
            "points": [p.to_json() for p in self.points],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DatasetResult:
        analytic = data.get("analytic")
        return cls(
            DatasetMeta.from_json(data["meta"]),
            {name: LengthStats.from_json(stats) for name, stats in data["lengths"].items()},
            {name: LengthHistogram.from_json(hist) for name, hist in (data.get("histograms") or {}).items()},
            AnalyticWaste.from_json(analytic) if analytic else None,
            [WasteEstimate.from_json(p) for p in data["points"]],
            data.get("schema_version", SCHEMA_VERSION),
        )
