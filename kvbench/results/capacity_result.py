"""What ``kvbench capacity`` found, typed: a model on a deployment, the weights and KV budget per GPU (per pipeline
stage), how many requests each KV strategy holds at once, or why the model does not fit, in numbers.
``kvbench capacity --json`` prints it (:meth:`CapacityResult.to_json`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvbench.models.shapes import ModelShape
from kvbench.results.model_shape_facts import ModelShapeFacts


@dataclass(frozen=True)
class ModelRecord:
    """The model's shape as :meth:`ModelShape.to_dict` records it (kept whole), and the facts the report shows."""

    record: dict[str, Any]  # ModelShape.to_dict(): written back as it is
    facts: ModelShapeFacts  # the record, typed

    @classmethod
    def of(cls, shape: ModelShape) -> ModelRecord:
        return cls.from_json(shape.to_dict())

    def to_json(self) -> dict[str, Any]:
        return dict(self.record)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ModelRecord:
        return cls(dict(data), ModelShapeFacts.from_json(data))


@dataclass(frozen=True)
class StageRecord:
    """What one GPU of a pipeline stage holds, and its KV budget."""

    stage: int
    layers: tuple[int, int]  # [first, last + 1)
    weight_bytes: int
    activation_bytes: int
    full_attention_layers: int
    sliding_window_layers: int
    kv_bytes_per_token: int  # with every layer growing
    usable_bytes: int
    kv_budget_bytes: int  # negative when the weights and activations do not fit

    def to_json(self) -> dict[str, Any]:
        return {
            "stage": self.stage,
            "layers": list(self.layers),
            "weight_bytes": self.weight_bytes,
            "activation_bytes": self.activation_bytes,
            "full_attention_layers": self.full_attention_layers,
            "sliding_window_layers": self.sliding_window_layers,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "usable_bytes": self.usable_bytes,
            "kv_budget_bytes": self.kv_budget_bytes,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageRecord:
        first, stop = data["layers"]
        return cls(
            data["stage"],
            (first, stop),
            data["weight_bytes"],
            data["activation_bytes"],
            data["full_attention_layers"],
            data["sliding_window_layers"],
            data["kv_bytes_per_token"],
            data["usable_bytes"],
            data["kv_budget_bytes"],
        )


@dataclass(frozen=True)
class StrategyRow:
    """One KV strategy: its holding and concurrency at the mean length and at max-len, and its longest context at
    the asked concurrency. The block fields are a paged strategy's only."""

    strategy: str  # contiguous-max | contiguous-pow2 | contiguous-oracle | paged-<block size>
    slots_per_request: int  # token slots a request of the mean length holds in a full layer
    bytes_per_request: int  # on the binding stage's GPU
    max_concurrency: int  # at the mean length, capped by max-num-seqs
    kv_max_concurrency: int  # at the mean length, KV memory alone
    token_state_pct_at_capacity: float  # share of the pool written at that concurrency
    max_concurrency_at_max_len: int  # whole max-len requests, capped by max-num-seqs
    concurrency_ratio_at_max_len: float  # vLLM's "maximum concurrency" figure, unrounded
    longest_context: int
    limited_by: str  # kv_cache | max_num_seqs
    longest_context_limited_by: str  # kv_cache | model
    block_size: int | None = None
    kv_blocks: int | None = None
    kv_cache_tokens: int | None = None  # vLLM's "KV cache size in tokens"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "strategy": self.strategy,
            "slots_per_request": self.slots_per_request,
            "bytes_per_request": self.bytes_per_request,
            "max_concurrency": self.max_concurrency,
            "kv_max_concurrency": self.kv_max_concurrency,
            "token_state_pct_at_capacity": self.token_state_pct_at_capacity,
            "max_concurrency_at_max_len": self.max_concurrency_at_max_len,
            "concurrency_ratio_at_max_len": self.concurrency_ratio_at_max_len,
            "longest_context": self.longest_context,
            "limited_by": self.limited_by,
        }
        if self.block_size is not None:
            out |= {"block_size": self.block_size, "kv_blocks": self.kv_blocks, "kv_cache_tokens": self.kv_cache_tokens}
        out["longest_context_limited_by"] = self.longest_context_limited_by
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StrategyRow:
        return cls(
            data["strategy"],
            data["slots_per_request"],
            data["bytes_per_request"],
            data["max_concurrency"],
            data["kv_max_concurrency"],
            data["token_state_pct_at_capacity"],
            data["max_concurrency_at_max_len"],
            data["concurrency_ratio_at_max_len"],
            data["longest_context"],
            data["limited_by"],
            data["longest_context_limited_by"],
            data.get("block_size"),
            data.get("kv_blocks"),
            data.get("kv_cache_tokens"),
        )


@dataclass(frozen=True)
class NotFitting:
    """Why the deployment cannot serve the model, with its numbers: the weights (``kind`` weights) or one
    max-len request (``kind`` max_len) do not fit. The first reason also says what would."""

    kind: str  # weights | max_len
    message: str
    # weights: per GPU of the binding stage, and by how much they exceed the usable memory
    weight_bytes_per_gpu: int | None = None
    activation_bytes_per_gpu: int | None = None
    usable_bytes: int | None = None
    short_bytes: int | None = None
    # max_len: the KV budget, what one max-len request needs, and the longest it holds
    kv_budget_bytes: int | None = None
    request_bytes: int | None = None
    longest_context: int | None = None
    # what would fit (the first reason only; set together)
    smallest_fitting_tensor_parallel_size: int | None = None  # None: none up to the largest considered
    gpu_memory_needed_bytes: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind, "message": self.message}
        numbers = {
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            "activation_bytes_per_gpu": self.activation_bytes_per_gpu,
            "usable_bytes": self.usable_bytes,
            "short_bytes": self.short_bytes,
            "kv_budget_bytes": self.kv_budget_bytes,
            "request_bytes": self.request_bytes,
            "longest_context": self.longest_context,
        }
        out |= {name: value for name, value in numbers.items() if value is not None}
        if self.gpu_memory_needed_bytes is not None:
            out["smallest_fitting_tensor_parallel_size"] = self.smallest_fitting_tensor_parallel_size
            out["gpu_memory_needed_bytes"] = self.gpu_memory_needed_bytes
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NotFitting:
        return cls(
            data["kind"],
            data["message"],
            data.get("weight_bytes_per_gpu"),
            data.get("activation_bytes_per_gpu"),
            data.get("usable_bytes"),
            data.get("short_bytes"),
            data.get("kv_budget_bytes"),
            data.get("request_bytes"),
            data.get("longest_context"),
            data.get("smallest_fitting_tensor_parallel_size"),
            data.get("gpu_memory_needed_bytes"),
        )


@dataclass(frozen=True)
class CapacityResult:
    """The capacity document. Where the weights do not fit, the strategies are empty and the figures that need a
    KV budget (``kv_token_slots``, ``fits_one_max_len_request``) are None and left out of the JSON."""

    model: ModelRecord
    gpu: str
    gpu_memory_bytes: int
    gpu_memory_utilization: float
    kv_cache_memory_bytes: int | None  # the KV bytes per GPU set directly; None: what the memory leaves
    tensor_parallel_size: int
    pipeline_parallel_size: int
    gpus: int
    kv_cache_dtype: str
    kv_dtype_bytes: int
    kv_heads_per_gpu: int
    kv_head_replication: int  # copies of each KV head (tensor parallelism above the KV heads)
    usable_bytes: int  # of the binding stage's GPU
    weight_bytes: int  # the whole model
    weight_bytes_per_gpu: int  # the largest stage's share
    activation_reserve_bytes: int
    kv_budget_bytes: int  # the binding stage's, at least 0
    bytes_per_token: int  # the whole model's KV bytes per token
    kv_bytes_per_token_per_gpu: int
    stages: list[StageRecord]
    max_len: int
    mean_len: int
    max_num_seqs: int | None
    concurrency: int  # for the longest context
    context_length: int  # the model's
    reasons: list[NotFitting] = field(default_factory=list)  # empty when it fits
    strategies: list[StrategyRow] = field(default_factory=list)
    kv_token_slots: int | None = None  # per GPU, with every layer growing
    fits_one_max_len_request: bool | None = None
    suggestions: list[str] | None = None  # what to change, in the command's options, when it does not fit

    @property
    def fits(self) -> bool:
        return not self.reasons

    @property
    def verdict(self) -> str | None:
        """One line saying why it does not fit; None when it does."""
        if not self.reasons:
            return None
        return f"{self.model.facts.name} does not fit on {self.gpus} x {self.gpu}: " + "; ".join(
            r.message for r in self.reasons
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "model": self.model.to_json(),
            "gpu": self.gpu,
            "gpu_memory_bytes": self.gpu_memory_bytes,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "tensor_parallel_size": self.tensor_parallel_size,
            "pipeline_parallel_size": self.pipeline_parallel_size,
            "gpus": self.gpus,
            "kv_cache_dtype": self.kv_cache_dtype,
            "kv_dtype_bytes": self.kv_dtype_bytes,
            "kv_heads_per_gpu": self.kv_heads_per_gpu,
            "kv_head_replication": self.kv_head_replication,
            "usable_bytes": self.usable_bytes,
            "weight_bytes": self.weight_bytes,
            "weight_bytes_per_gpu": self.weight_bytes_per_gpu,
            "activation_reserve_bytes": self.activation_reserve_bytes,
            "kv_budget_bytes": self.kv_budget_bytes,
            "bytes_per_token": self.bytes_per_token,
            "kv_bytes_per_token_per_gpu": self.kv_bytes_per_token_per_gpu,
            "stages": [s.to_json() for s in self.stages],
            "max_len": self.max_len,
            "mean_len": self.mean_len,
            "max_num_seqs": self.max_num_seqs,
            "concurrency": self.concurrency,
            "context_length": self.context_length,
            "fits": self.fits,
            "reasons": [r.to_json() for r in self.reasons],
            "strategies": [s.to_json() for s in self.strategies],
        }
        if self.kv_token_slots is not None:
            out["kv_token_slots"] = self.kv_token_slots
        if self.fits_one_max_len_request is not None:
            out["fits_one_max_len_request"] = self.fits_one_max_len_request
        if self.verdict is not None:
            out["verdict"] = self.verdict
        if self.suggestions is not None:
            out["suggestions"] = list(self.suggestions)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CapacityResult:
        suggestions = data.get("suggestions")
        return cls(
            ModelRecord.from_json(data["model"]),
            data["gpu"],
            data["gpu_memory_bytes"],
            data["gpu_memory_utilization"],
            data.get("kv_cache_memory_bytes"),
            data["tensor_parallel_size"],
            data["pipeline_parallel_size"],
            data["gpus"],
            data["kv_cache_dtype"],
            data["kv_dtype_bytes"],
            data["kv_heads_per_gpu"],
            data["kv_head_replication"],
            data["usable_bytes"],
            data["weight_bytes"],
            data["weight_bytes_per_gpu"],
            data["activation_reserve_bytes"],
            data["kv_budget_bytes"],
            data["bytes_per_token"],
            data["kv_bytes_per_token_per_gpu"],
            [StageRecord.from_json(s) for s in data["stages"]],
            data["max_len"],
            data["mean_len"],
            data.get("max_num_seqs"),
            data["concurrency"],
            data["context_length"],
            [NotFitting.from_json(r) for r in data.get("reasons") or ()],
            [StrategyRow.from_json(s) for s in data.get("strategies") or ()],
            data.get("kv_token_slots"),
            data.get("fits_one_max_len_request"),
            list(suggestions) if suggestions is not None else None,
        )
