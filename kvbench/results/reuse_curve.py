"""The reuse study's result, typed: the prefix hit rate a trace gets at each KV size (the curve's points), the
deployments marked on it, the memory each share of the never-evicting rate needs, and the reuse distances that
explain it. ``summary.json`` keeps it key for key as :meth:`ReuseCurve.to_json` writes it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvbench.results.run_meta import RunMeta, summary_document

KIND = "reuse"  # summary.json's kind


@dataclass(frozen=True)
class ReuseTrace:
    """The requests the study ran: what was kept of the trace once requests longer than the context were left out."""

    source: str  # where the trace came from, in words
    requests: int  # kept (fit the context)
    duration_s: float  # first to last arrival
    trace_block_size: int  # prompt tokens per hash id
    prompt_tokens: int
    output_tokens: int
    context_tokens: int | None = None  # the context a request had to fit (None: not recorded)
    over_context: int = 0  # requests left out as longer than the context
    over_context_prompt_tokens: int = 0  # their prompt tokens

    def to_json(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "requests": self.requests,
            "duration_s": self.duration_s,
            "trace_block_size": self.trace_block_size,
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": self.output_tokens,
            "context_tokens": self.context_tokens,
            "over_context": self.over_context,
            "over_context_prompt_tokens": self.over_context_prompt_tokens,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReuseTrace:
        return cls(
            data["source"],
            data["requests"],
            data["duration_s"],
            data["trace_block_size"],
            data["prompt_tokens"],
            data["output_tokens"],
            data.get("context_tokens"),
            data.get("over_context", 0),
            data.get("over_context_prompt_tokens", 0),
        )


@dataclass(frozen=True)
class ReuseSetup:
    """The deployment the trace ran on: the model, the GPU, the KV block and the scheduler's limit."""

    model_name: str
    gpu: str
    block_size: int  # tokens per KV block
    kv_block_bytes: int  # one KV block of the whole model
    kv_bytes_per_token: int
    max_num_seqs: int
    offload_bytes: int = 0  # the CPU tier behind the GPU cache (0: none)

    def to_json(self) -> dict[str, Any]:
        return {
            "model_name": self.model_name,
            "gpu": self.gpu,
            "block_size": self.block_size,
            "kv_block_bytes": self.kv_block_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "max_num_seqs": self.max_num_seqs,
            "offload_bytes": self.offload_bytes,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReuseSetup:
        return cls(
            data["model_name"],
            data["gpu"],
            data["block_size"],
            data["kv_block_bytes"],
            data["kv_bytes_per_token"],
            data["max_num_seqs"],
            data.get("offload_bytes") or 0,
        )


@dataclass(frozen=True)
class NeverEvicting:
    """A cache that holds every block it ever saw: the most reuse the trace allows."""

    hit_rate_pct: float  # of prompt tokens
    kv_blocks_peak: int  # blocks it held at its peak
    prefill_s_saved: float

    def to_json(self) -> dict[str, Any]:
        return {
            "hit_rate_pct": self.hit_rate_pct,
            "kv_blocks_peak": self.kv_blocks_peak,
            "prefill_s_saved": self.prefill_s_saved,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NeverEvicting:
        return cls(data["hit_rate_pct"], data["kv_blocks_peak"], data["prefill_s_saved"])


@dataclass(frozen=True)
class DeploymentMark:
    """A deployment marked on the curve: the one asked for, or a larger one (more GPUs under tensor parallelism)."""

    gpus: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    kv_blocks: int
    kv_bytes: int
    hit_rate_pct: float
    total_hit_rate_pct: float | None = None  # with the CPU tier (None: no tier)

    def to_json(self) -> dict[str, Any]:
        return {
            "gpus": self.gpus,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "kv_blocks": self.kv_blocks,
            "kv_bytes": self.kv_bytes,
            "hit_rate_pct": self.hit_rate_pct,
            "total_hit_rate_pct": self.total_hit_rate_pct,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DeploymentMark:
        return cls(
            data["gpus"],
            data["tensor_parallel_size"],
            data["pipeline_parallel_size"],
            data["kv_blocks"],
            data["kv_bytes"],
            data["hit_rate_pct"],
            data.get("total_hit_rate_pct"),
        )


@dataclass(frozen=True)
class ShareTarget:
    """The KV memory where the curve reaches a share of the never-evicting hit rate."""

    share_pct: int  # of the never-evicting hit rate
    hit_rate_pct: float  # the hit rate that share is
    kv_bytes: int | None  # None: beyond the largest size simulated

    def to_json(self) -> dict[str, Any]:
        return {"share_pct": self.share_pct, "hit_rate_pct": self.hit_rate_pct, "kv_bytes": self.kv_bytes}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ShareTarget:
        return cls(data["share_pct"], data["hit_rate_pct"], data.get("kv_bytes"))


@dataclass(frozen=True)
class LogHistogram:
    """Reused blocks counted over log-spaced bins."""

    edges: list[float]  # one more than the bins
    blocks: list[float]  # reused blocks per bin

    def to_json(self) -> dict[str, list[float]]:
        return {"edges": self.edges, "blocks": self.blocks}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LogHistogram:
        return cls(list(data["edges"]), list(data["blocks"]))


@dataclass(frozen=True)
class ReuseDistance:
    """How long reused blocks wait before they are needed again, and how much new KV is written meanwhile:
    quantiles weighted by the blocks each reuse covers. A trace with no reuse has only ``reuses`` (0)."""

    reuses: int
    reused_blocks: int = 0
    seconds_p50: float = 0.0  # since the block's last use
    seconds_p90: float = 0.0
    seconds_p99: float = 0.0
    new_kv_bytes_p50: float = 0.0  # new KV written in between
    new_kv_bytes_p90: float = 0.0
    new_kv_bytes_p99: float = 0.0
    seconds_histogram: LogHistogram | None = None
    new_kv_bytes_histogram: LogHistogram | None = None

    def to_json(self) -> dict[str, Any]:
        if not self.reuses:
            return {"reuses": self.reuses}
        return {
            "reuses": self.reuses,
            "reused_blocks": self.reused_blocks,
            "seconds_p50": self.seconds_p50,
            "seconds_p90": self.seconds_p90,
            "seconds_p99": self.seconds_p99,
            "new_kv_bytes_p50": self.new_kv_bytes_p50,
            "new_kv_bytes_p90": self.new_kv_bytes_p90,
            "new_kv_bytes_p99": self.new_kv_bytes_p99,
            "seconds_histogram": self.seconds_histogram.to_json() if self.seconds_histogram else None,
            "new_kv_bytes_histogram": self.new_kv_bytes_histogram.to_json() if self.new_kv_bytes_histogram else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReuseDistance:
        reuses = data.get("reuses") or 0
        if not reuses:
            return cls(reuses)
        seconds, written = data.get("seconds_histogram"), data.get("new_kv_bytes_histogram")
        return cls(
            reuses,
            data["reused_blocks"],
            data["seconds_p50"],
            data["seconds_p90"],
            data["seconds_p99"],
            data["new_kv_bytes_p50"],
            data["new_kv_bytes_p90"],
            data["new_kv_bytes_p99"],
            LogHistogram.from_json(seconds) if seconds is not None else None,
            LogHistogram.from_json(written) if written is not None else None,
        )


@dataclass(frozen=True)
class TierFigures:
    """What a CPU tier behind the GPU cache adds at one KV size."""

    offload_bytes: int
    offload_hit_rate_pct: float  # prompt tokens served from the CPU tier
    total_hit_rate_pct: float  # from either tier


@dataclass(frozen=True)
class CurvePoint:
    """One KV size on the curve: the hit rate there, the prefill it saves, and how loaded the cache was. A point
    of the results schema: (engine, concurrency) names it, concurrency 0 as the trace's own arrivals."""

    engine: str  # kv-<blocks>-blocks
    label: str  # the deployment at this size ("1 x h100-80g"), or ""
    kv_blocks: int
    kv_bytes: int
    hit_rate_pct: float  # prompt tokens served from the GPU's prefix cache
    share_of_unbounded_pct: float | None  # of the never-evicting hit rate (None: it is 0)
    hit_tokens: int
    prompt_tokens: int
    prefill_tokens_saved: int  # from either tier
    prefill_s_saved: float
    prefill_time_saved_pct: float
    pinned_blocks_peak: int  # held by running requests
    pinned_blocks_mean: float
    pinned_peak_pct: float  # of the KV blocks
    evicted_blocks: int
    requests: int
    refused: int  # too long for this size
    queue_wait_mean_s: float  # waiting for KV memory
    concurrency: int = 0
    tier: TierFigures | None = None  # with a CPU tier

    @property
    def total_hit_rate_pct(self) -> float | None:
        """The hit rate with the CPU tier (None: no tier)."""
        return self.tier.total_hit_rate_pct if self.tier else None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "engine": self.engine,
            "concurrency": self.concurrency,
            "label": self.label,
            "kv_blocks": self.kv_blocks,
            "kv_bytes": self.kv_bytes,
            "hit_rate_pct": self.hit_rate_pct,
            "share_of_unbounded_pct": self.share_of_unbounded_pct,
            "hit_tokens": self.hit_tokens,
            "prompt_tokens": self.prompt_tokens,
            "prefill_tokens_saved": self.prefill_tokens_saved,
            "prefill_s_saved": self.prefill_s_saved,
            "prefill_time_saved_pct": self.prefill_time_saved_pct,
            "pinned_blocks_peak": self.pinned_blocks_peak,
            "pinned_blocks_mean": self.pinned_blocks_mean,
            "pinned_peak_pct": self.pinned_peak_pct,
            "evicted_blocks": self.evicted_blocks,
            "requests": self.requests,
            "refused": self.refused,
            "queue_wait_mean_s": self.queue_wait_mean_s,
        }
        if self.tier is not None:
            out["offload_bytes"] = self.tier.offload_bytes
            out["offload_hit_rate_pct"] = self.tier.offload_hit_rate_pct
            out["total_hit_rate_pct"] = self.tier.total_hit_rate_pct
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CurvePoint:
        tier = None
        if data.get("total_hit_rate_pct") is not None:
            tier = TierFigures(data["offload_bytes"], data["offload_hit_rate_pct"], data["total_hit_rate_pct"])
        return cls(
            data["engine"],
            data.get("label") or "",
            data["kv_blocks"],
            data["kv_bytes"],
            data["hit_rate_pct"],
            data.get("share_of_unbounded_pct"),
            data["hit_tokens"],
            data["prompt_tokens"],
            data["prefill_tokens_saved"],
            data["prefill_s_saved"],
            data["prefill_time_saved_pct"],
            data["pinned_blocks_peak"],
            data["pinned_blocks_mean"],
            data["pinned_peak_pct"],
            data["evicted_blocks"],
            data["requests"],
            data["refused"],
            data["queue_wait_mean_s"],
            data.get("concurrency", 0),
            tier,
        )


@dataclass(frozen=True)
class ReuseCurve:
    """A reuse run's summary: the trace, the deployment, the curve and what it says."""

    trace: ReuseTrace
    deployment: ReuseSetup
    unbounded: NeverEvicting
    deployments: list[DeploymentMark]  # the one asked for first, then larger ones
    targets: list[ShareTarget]  # 50%, 90% and 99% of the never-evicting hit rate
    reuse_distance: ReuseDistance
    points: list[CurvePoint]  # smallest KV size first
    findings: list[str] = field(default_factory=list)  # the curve in words
    meta: RunMeta = field(default_factory=RunMeta)  # the run's metadata

    @property
    def asked(self) -> DeploymentMark:
        """The deployment asked for."""
        return self.deployments[0]

    @property
    def offload(self) -> bool:
        """Whether the run had a CPU tier."""
        return bool(self.deployment.offload_bytes)

    def point_at(self, kv_blocks: int) -> CurvePoint:
        return next(p for p in self.points if p.kv_blocks == kv_blocks)

    def to_json(self) -> dict[str, Any]:
        """``summary.json``: the results schema's envelope around the study's fields, the points last."""
        return summary_document(
            KIND,
            self.meta.to_json(),
            [p.to_json() for p in self.points],
            trace=self.trace.to_json(),
            deployment=self.deployment.to_json(),
            unbounded=self.unbounded.to_json(),
            deployments=[d.to_json() for d in self.deployments],
            targets=[t.to_json() for t in self.targets],
            reuse_distance=self.reuse_distance.to_json(),
            findings=list(self.findings),
        )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReuseCurve:
        return cls(
            ReuseTrace.from_json(data["trace"]),
            ReuseSetup.from_json(data["deployment"]),
            NeverEvicting.from_json(data["unbounded"]),
            [DeploymentMark.from_json(d) for d in data["deployments"]],
            [ShareTarget.from_json(t) for t in data.get("targets") or []],
            ReuseDistance.from_json(data["reuse_distance"]),
            [CurvePoint.from_json(p) for p in data["points"]],
            list(data["findings"]),
            RunMeta.from_json(data.get("meta") or {}),
        )
