"""The waste study's document (``summary.json`` of ``kvbench waste``), typed: the run's metadata, the seed article's
analytic estimate and one :class:`StrategyPoint` per strategy; ``to_json`` writes the file key for key."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvbench.results.model_shape_facts import ModelShapeFacts
from kvbench.results.run_meta import RunMeta, run_fields, summary_document
from kvbench.results.strategy_point import StrategyPoint

KIND = "waste"


@dataclass(frozen=True)
class WasteAnalytic:
    """The seed article's estimate for a max-length reservation: (max_len - actual) / max_len, in %."""

    formula: str = "(max_len - actual_len) / max_len"
    at_mean_len_pct: float | None = None  # at the mean length (the one asked for, or a trace's or dataset's own)
    at_sampled_mean_pct: float | None = 0.0  # at the mean of the lengths drawn
    mean_len: int | None = None
    sampled_mean_len: float | None = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "formula": self.formula,
            "at_mean_len_pct": self.at_mean_len_pct,
            "at_sampled_mean_pct": self.at_sampled_mean_pct,
            "mean_len": self.mean_len,
            "sampled_mean_len": self.sampled_mean_len,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WasteAnalytic:
        return cls(
            data.get("formula", cls.formula),
            data.get("at_mean_len_pct"),
            data.get("at_sampled_mean_pct", 0),
            data.get("mean_len"),
            data.get("sampled_mean_len", 0),
        )


@dataclass(frozen=True)
class WasteMeta(RunMeta):
    """The waste study's metadata: what every run records (:class:`RunMeta`; its model is the shape record's) and
    the study's own settings. A setting the run did not record reads None."""

    model_dtype: str | None = None
    gpu: str | None = None  # the preset's name, "2 x <name>" with tensor or pipeline parallelism
    workload: str | None = None  # where the lengths came from
    concurrency: int | None = None
    kv_budget_bytes: int | None = None
    pool_slots: int | None = None  # token slots every strategy shares

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WasteMeta:
        model = data.get("model")
        return cls(
            **run_fields(data),
            model_dtype=ModelShapeFacts.from_json(model).dtype if isinstance(model, Mapping) else None,
            gpu=data.get("gpu"),
            workload=data.get("workload"),
            concurrency=data.get("concurrency"),
            kv_budget_bytes=data.get("kv_budget_bytes"),
            pool_slots=data.get("pool_slots"),
        )


@dataclass(frozen=True)
class WasteStudy:
    meta: WasteMeta
    analytic: WasteAnalytic | None  # None: a document without one (not one kvbench writes)
    points: list[StrategyPoint]  # one per strategy, in the order they ran

    def to_json(self) -> dict[str, Any]:
        points = [point.to_json() for point in self.points]
        if self.analytic is None:
            return summary_document(KIND, self.meta.to_json(), points)
        return summary_document(KIND, self.meta.to_json(), points, analytic=self.analytic.to_json())

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> WasteStudy:
        analytic = document.get("analytic")
        return cls(
            WasteMeta.from_json(document.get("meta") or {}),
            WasteAnalytic.from_json(analytic) if analytic else None,
            [StrategyPoint.from_json(point) for point in document.get("points") or []],
        )
