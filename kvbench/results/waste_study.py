"""The waste study's document (``summary.json`` of ``kvbench waste``), typed: the run's metadata, the seed article's
analytic estimate and one :class:`StrategyPoint` per strategy; ``to_json`` writes it as it always was."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvbench.results.run_meta import summary_document
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
class WasteMeta:
    """What the waste study's table, summary and page show of the run's metadata; a field a run did not record
    reads None. The metadata itself (:func:`kvbench.results.run_meta.run_meta`: command line, versions, host, the
    model's whole shape) is kept as written, for ``to_json`` and the renderers every run kind shares."""

    written: Mapping[str, Any] = field(default_factory=dict, repr=False)  # the meta as summary.json holds it
    model_name: str | None = None
    model_dtype: str | None = None
    gpu: str | None = None  # the preset's name, "2 x <name>" with tensor or pipeline parallelism
    max_len: int | None = None
    workload: str | None = None  # where the lengths came from
    requests: int | None = None
    concurrency: int | None = None
    kv_budget_bytes: int | None = None
    pool_slots: int | None = None  # token slots every strategy shares
    stop: str = "length"  # length | eos
    dataset: Mapping[str, Any] | None = None  # the draw from a dataset (workload.dataset.DatasetSample.as_dict)

    def to_json(self) -> dict[str, Any]:
        return dict(self.written)

    @classmethod
    def from_json(cls, meta: Mapping[str, Any]) -> WasteMeta:
        model = meta.get("model") or {}
        return cls(
            written=meta,
            model_name=model.get("name"),
            model_dtype=model.get("dtype"),
            gpu=meta.get("gpu"),
            max_len=meta.get("max_len"),
            workload=meta.get("workload"),
            requests=meta.get("requests"),
            concurrency=meta.get("concurrency"),
            kv_budget_bytes=meta.get("kv_budget_bytes"),
            pool_slots=meta.get("pool_slots"),
            stop=meta.get("stop", "length"),
            dataset=meta.get("dataset") or None,
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
