"""What ``kvbench share`` measured, typed: KV blocks with and without block sharing, per mode, at the run's width
and at width 1, and what sharing saved. ``summary.json`` keeps it as the ``kind: share`` document
(:meth:`ShareResult.to_json`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvbench.results.run_meta import RunMeta, run_fields
from kvbench.results.schema import SCHEMA_VERSION

_COST_MEAN, _COST_PEAK = "_cost_vs_width1_mean", "_cost_vs_width1_peak"  # a mode's cost keys: <mode><suffix>


@dataclass(frozen=True)
class ShareRow:
    """One mode at one width (a point of the document): the KV blocks in use, step-averaged and at peak."""

    mode: str  # paged-shared | paged-unshared (parallel) or paged-copy (beam) | contiguous; the point's engine
    width: int  # samples per prompt or beam width; the point's concurrency
    mean_blocks: float
    peak_blocks: int
    mean_bytes: float
    peak_bytes: int
    scenario: str = ""  # share-parallel | share-beam
    status: str = "ok"

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "width": self.width,
            "mean_blocks": self.mean_blocks,
            "peak_blocks": self.peak_blocks,
            "mean_bytes": self.mean_bytes,
            "peak_bytes": self.peak_bytes,
            "engine": self.mode,
            "concurrency": self.width,
            "scenario": self.scenario,
            "status": self.status,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShareRow:
        return cls(
            data.get("mode", data["engine"]),
            data.get("width", data["concurrency"]),
            data["mean_blocks"],
            data["peak_blocks"],
            data.get("mean_bytes", 0.0),
            data.get("peak_bytes", 0),
            data.get("scenario", ""),
            data.get("status", "ok"),
        )


@dataclass(frozen=True)
class WidthCost:
    """A mode's blocks at the run's width over its blocks at width 1."""

    mean: float  # step-averaged
    peak: float | None


@dataclass(frozen=True)
class ShareSavings:
    """Memory saved by sharing as the PagedAttention paper defines it (1 - shared / private blocks), in %, and
    each mode's cost of the run's width against width 1."""

    saved_pct_mean: float | None = None  # None: the private copies held no block
    saved_pct_peak: float | None = None
    costs: dict[str, WidthCost] = field(default_factory=dict)  # by mode, in the run's order

    def cost(self, mode: str) -> WidthCost | None:
        return self.costs.get(mode)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "saved_by_sharing_pct_mean": self.saved_pct_mean,
            "saved_by_sharing_pct_peak": self.saved_pct_peak,
        }
        for mode, cost in self.costs.items():
            out[f"{mode}{_COST_MEAN}"] = cost.mean
            out[f"{mode}{_COST_PEAK}"] = cost.peak
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShareSavings:
        modes = [key.removesuffix(_COST_MEAN) for key in data if key.endswith(_COST_MEAN)]
        return cls(
            data.get("saved_by_sharing_pct_mean"),
            data.get("saved_by_sharing_pct_peak"),
            {mode: WidthCost(data[f"{mode}{_COST_MEAN}"], data.get(f"{mode}{_COST_PEAK}")) for mode in modes},
        )


@dataclass(frozen=True)
class ShareMeta(RunMeta):
    """The run's metadata: what every run records (:class:`RunMeta`: command, versions, host, model, device, block
    size, stop, the dataset drawn) and what this one measured with. A setting an older or hand-made document lacks
    reads None."""

    kind: str | None = None  # parallel (n samples per prompt) | beam (beam width)
    width: int | None = None
    prompts: int | None = None
    prompt_len: int | None = None  # the asked mean prompt length (random prompts)
    output_len: int | None = None  # at most this many tokens per sample or beam
    anchors: str | None = None  # the article's and the paper's figures, for comparison
    outputs_identical: bool | None = None  # the same samples with and without sharing
    output_len_mean: float | None = None  # the answers' mean length, tokens
    prompt_len_mean: float | None = None  # the prompts' mean length, tokens

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShareMeta:
        return cls(
            **run_fields(data),
            kind=data.get("kind"),
            width=data.get("width"),
            prompts=data.get("prompts"),
            prompt_len=data.get("prompt_len"),
            output_len=data.get("output_len"),
            anchors=data.get("anchors"),
            outputs_identical=data.get("outputs_identical_with_and_without_sharing"),
            output_len_mean=data.get("output_len_mean"),
            prompt_len_mean=data.get("prompt_len_mean"),
        )


@dataclass(frozen=True)
class ShareResult:
    """The ``kind: share`` summary document."""

    meta: ShareMeta
    savings: ShareSavings
    points: list[ShareRow] = field(default_factory=list)  # the run's width in every mode, then width 1
    schema_version: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "kind": "share",
            "meta": self.meta.to_json(),
            "savings": self.savings.to_json(),
            "points": [p.to_json() for p in self.points],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShareResult:
        return cls(
            ShareMeta.from_json(data.get("meta") or {}),
            ShareSavings.from_json(data.get("savings") or {}),
            [ShareRow.from_json(p) for p in data.get("points") or ()],
            data.get("schema_version", SCHEMA_VERSION),
        )
