"""The capacity study: for a model on a deployment (GPU, tensor and pipeline parallelism, KV cache dtype), the
weights and KV budget per GPU and how many requests each KV strategy holds at once; or, when the model does not
fit, why, in numbers.

Every strategy is costed in bytes on each pipeline stage's GPU, so sliding-window layers (which keep at most
the window) and a stage's own share of the layers count exactly. A request of ``L`` tokens holds:

- ``contiguous-max``: a slab of max-len tokens; ``contiguous-pow2``: the next power of two of ``L`` (at most
  max-len); ``contiguous-oracle``: exactly ``L``; a windowed layer's slab is a ring of at most the window;
- ``paged-<B>``: ``ceil(L / B)`` blocks; a windowed layer at most ``ceil(W / B) + 1`` of them (the window rarely
  starts on a block boundary), as vLLM's sliding-window manager keeps them.

The pool of a paged strategy is first cut into whole blocks, as vLLM's is; its "KV cache size in tokens" and
"maximum concurrency for max-len tokens per request" are then vLLM's start-up figures.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvbench.errors import KvbenchError
from kvbench.kv.block_pool import blocks_for
from kvbench.kv.contiguous import next_pow2
from kvbench.models.deployment import (
    DEFAULT_BATCHED_TOKENS,
    DeploymentBudget,
    Parallelism,
    StageBudget,
    check_parallelism,
    deployment_budget,
    kv_heads_per_gpu,
    kv_replication,
)
from kvbench.models.gpus import resolve_gpu
from kvbench.models.resolve import resolve_model
from kvbench.models.shapes import KV_DTYPE_BYTES, ModelShape
from kvbench.preflight import check_context_length
from kvbench.results.capacity_result import CapacityResult, ModelRecord, NotFitting, StageRecord, StrategyRow
from kvbench.units import human_bytes

CONTIGUOUS = ("contiguous-max", "contiguous-pow2", "contiguous-oracle")
KV_CACHE_DTYPES = ("auto", *KV_DTYPE_BYTES)
MAX_TENSOR_PARALLEL = 64  # the largest tensor parallelism a suggestion considers


@dataclass(frozen=True)
class CapacitySettings:
    model: str = "llama-2-13b"
    gpu: str = "a100-80g"
    gpu_memory: int | None = None  # bytes; replaces the preset's memory
    utilization: float = 0.9
    kv_cache_memory: int | None = None  # KV bytes per GPU set directly (vLLM's kv_cache_memory_bytes)
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    max_len: int = 2048
    mean_len: int = 500
    block_sizes: tuple[int, ...] = (16,)
    max_num_seqs: int | None = None  # the scheduler's cap on running requests; None: KV memory alone
    concurrency: int = 1  # for the longest context every request can have at once
    max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS


@dataclass(frozen=True)
class Strategy:
    """A KV strategy's holding per request: ``contiguous-<policy>`` or ``paged-<block size>``."""

    name: str
    block_size: int = 0  # paged only

    @classmethod
    def all(cls, block_sizes: tuple[int, ...]) -> list[Strategy]:
        return [cls(name) for name in CONTIGUOUS] + [cls(f"paged-{size}", size) for size in block_sizes]

    def slots(self, length: int, max_len: int) -> int:
        """Token slots a request of ``length`` tokens holds in each full-attention layer."""
        if self.block_size:
            return blocks_for(length, self.block_size) * self.block_size
        if self.name == "contiguous-max":
            return max_len
        if self.name == "contiguous-pow2":
            return min(next_pow2(length), max_len)
        return length

    def window_slots(self, length: int, max_len: int, window: int | None) -> int:
        """Token slots in each sliding-window layer: a ring of at most the window, or the blocks that cover it."""
        if window is None:
            return 0
        if self.block_size:
            size = self.block_size
            return min(blocks_for(length, size), blocks_for(window, size) + 1) * size
        return min(self.slots(length, max_len), window)

    def request_bytes(self, stage: StageBudget, length: int, max_len: int) -> int:
        share = stage.share
        return share.kv_bytes(self.slots(length, max_len), self.window_slots(length, max_len, share.window))

    def pool_bytes(self, stage: StageBudget) -> int:
        """The stage's KV budget as this strategy can use it: cut into whole blocks when paged."""
        if not self.block_size:
            return max(stage.kv_bytes, 0)
        block = self.block_size * stage.share.bytes_per_token
        return max(stage.kv_bytes, 0) // block * block if block else 0


def concurrency_at(strategy: Strategy, stages: list[StageBudget], length: int, max_len: int) -> int:
    """Requests of ``length`` tokens that every stage's pool holds at once."""
    return min(strategy.pool_bytes(s) // max(strategy.request_bytes(s, length, max_len), 1) for s in stages)


def concurrency_ratio(strategy: Strategy, stages: list[StageBudget], max_len: int) -> float:
    """vLLM's "maximum concurrency for max-len tokens per request": pool over one max-len request, unrounded."""
    return min(strategy.pool_bytes(s) / max(strategy.request_bytes(s, max_len, max_len), 1) for s in stages)


def longest_context(strategy: Strategy, stages: list[StageBudget], concurrency: int, limit: int) -> int:
    """The longest length (at most ``limit``) of which ``concurrency`` requests fit at once, max-len set to it."""

    def fits(length: int) -> bool:
        return all(concurrency * strategy.request_bytes(s, length, length) <= strategy.pool_bytes(s) for s in stages)

    low, high = 0, limit
    while low < high:
        middle = (low + high + 1) // 2
        if fits(middle):
            low = middle
        else:
            high = middle - 1
    return low


def strategy_rows(stages: list[StageBudget], settings: CapacitySettings, context_limit: int) -> list[StrategyRow]:
    """One row per strategy: its holding and concurrency at the mean length, at max-len, and its longest context
    at the asked concurrency."""
    rows = []
    max_len, mean_len = settings.max_len, settings.mean_len
    binding = min(stages, key=lambda s: s.kv_bytes // max(s.share.bytes_per_token, 1))
    for strategy in Strategy.all(settings.block_sizes):
        at_mean = concurrency_at(strategy, stages, mean_len, max_len)
        at_max = concurrency_at(strategy, stages, max_len, max_len)
        useful = at_mean * binding.share.kv_bytes(mean_len, min(mean_len, binding.share.window or mean_len))
        pool = strategy.pool_bytes(binding)
        ratio = concurrency_ratio(strategy, stages, max_len)
        longest = longest_context(strategy, stages, settings.concurrency, context_limit)
        blocks = (
            min(strategy.pool_bytes(s) // (strategy.block_size * s.share.bytes_per_token) for s in stages)
            if strategy.block_size
            else None
        )
        rows.append(
            StrategyRow(
                strategy=strategy.name,
                slots_per_request=strategy.slots(mean_len, max_len),
                bytes_per_request=strategy.request_bytes(binding, mean_len, max_len),
                max_concurrency=_capped(at_mean, settings.max_num_seqs),
                kv_max_concurrency=at_mean,
                token_state_pct_at_capacity=100.0 * useful / pool if pool else 0.0,
                max_concurrency_at_max_len=_capped(at_max, settings.max_num_seqs),
                concurrency_ratio_at_max_len=ratio,
                longest_context=longest,
                limited_by="max_num_seqs"
                if settings.max_num_seqs is not None and at_mean > settings.max_num_seqs
                else "kv_cache",
                longest_context_limited_by="model" if longest >= context_limit else "kv_cache",
                block_size=strategy.block_size or None,
                kv_blocks=blocks,
                kv_cache_tokens=int(ratio * max_len) if strategy.block_size else None,
            )
        )
    return rows


def _capped(value: int, cap: int | None) -> int:
    return value if cap is None else min(value, cap)


def resolve_deployment(settings: CapacitySettings) -> tuple[ModelShape, DeploymentBudget]:
    """The model with its KV dtype and the per-GPU budgets of the deployment; bad settings are one line."""
    if settings.kv_cache_dtype not in KV_CACHE_DTYPES:
        raise KvbenchError(
            f"unknown KV cache dtype {settings.kv_cache_dtype!r}; choose one of {', '.join(KV_CACHE_DTYPES)}"
        )
    shape = resolve_model(settings.model, settings.dtype).with_kv_dtype(settings.kv_cache_dtype)
    check_context_length(shape, settings.max_len)
    gpu = resolve_gpu(settings.gpu, settings.gpu_memory)
    parallel = Parallelism(settings.tensor_parallel, settings.pipeline_parallel)
    budget = deployment_budget(
        shape, gpu, parallel, settings.utilization, settings.kv_cache_memory, settings.max_num_batched_tokens
    )
    return shape, budget


def _smallest_fitting_tensor_parallel(shape: ModelShape, settings: CapacitySettings) -> int | None:
    """The smallest tensor parallelism (above the one asked) with which the weights fit and one max-len request
    has room; None when none up to :data:`MAX_TENSOR_PARALLEL` does."""
    gpu = resolve_gpu(settings.gpu, settings.gpu_memory)
    for tensor in range(settings.tensor_parallel + 1, MAX_TENSOR_PARALLEL + 1):
        parallel = Parallelism(tensor, settings.pipeline_parallel)
        try:
            check_parallelism(shape, parallel)
        except KvbenchError:
            continue
        budget = deployment_budget(
            shape, gpu, parallel, settings.utilization, settings.kv_cache_memory, settings.max_num_batched_tokens
        )
        if budget.weights_fit and _fits_max_len(budget.stages, settings.max_len):
            return tensor
    return None


def _fits_max_len(stages: list[StageBudget], max_len: int) -> bool:
    return all(s.share.kv_bytes(max_len, min(max_len, s.share.window or max_len)) <= s.kv_bytes for s in stages)


def _where(stage: StageBudget, pipeline: int) -> str:
    layers = stage.share.layers
    return f" on pipeline stage {stage.share.stage} (layers {layers.start}-{layers.stop - 1})" if pipeline > 1 else ""


def not_fitting_reasons(shape: ModelShape, budget: DeploymentBudget, settings: CapacitySettings) -> list[NotFitting]:
    """Why the deployment cannot serve the model, each reason with its numbers; empty when it can."""
    reasons: list[NotFitting] = []
    pipeline = settings.pipeline_parallel
    if not budget.weights_fit:
        stage = budget.binding
        share = stage.share
        kv_part = f" + the KV cache of {human_bytes(settings.kv_cache_memory)}" if settings.kv_cache_memory else ""
        room = (
            f"the {human_bytes(stage.usable_bytes)} of the GPU"
            if settings.kv_cache_memory
            else f"the usable {human_bytes(stage.usable_bytes)} ({settings.utilization:g} x "
            f"{human_bytes(stage.device_bytes)})"
        )
        reasons.append(
            NotFitting(
                "weights",
                f"weights {human_bytes(share.weight_bytes)} + activations {human_bytes(share.activation_bytes)}"
                f"{kv_part} per GPU{_where(stage, pipeline)} exceed {room} by {human_bytes(-stage.kv_bytes)}",
                weight_bytes_per_gpu=share.weight_bytes,
                activation_bytes_per_gpu=share.activation_bytes,
                usable_bytes=stage.usable_bytes,
                short_bytes=-stage.kv_bytes,
            )
        )
    elif not _fits_max_len(budget.stages, settings.max_len):
        stage = min(
            budget.stages,
            key=lambda s: (
                s.kv_bytes
                - s.share.kv_bytes(settings.max_len, min(settings.max_len, s.share.window or settings.max_len))
            ),
        )
        oracle = Strategy("contiguous-oracle")
        need = oracle.request_bytes(stage, settings.max_len, settings.max_len)
        longest = longest_context(oracle, budget.stages, 1, settings.max_len)
        reasons.append(
            NotFitting(
                "max_len",
                f"the KV budget of {human_bytes(stage.kv_bytes)} per GPU{_where(stage, pipeline)} cannot hold "
                f"one request of max-len {settings.max_len:,} tokens ({human_bytes(need)}); the longest it "
                f"holds is {longest:,} tokens",
                kv_budget_bytes=stage.kv_bytes,
                request_bytes=need,
                longest_context=longest,
            )
        )
    if reasons:
        per_gpu = max(s.share.weight_bytes + s.share.activation_bytes for s in budget.stages)
        kv_need = max(
            s.share.kv_bytes(settings.max_len, min(settings.max_len, s.share.window or settings.max_len))
            for s in budget.stages
        )
        needed = (
            (per_gpu + (settings.kv_cache_memory or kv_need))
            if settings.kv_cache_memory
            else math.ceil((per_gpu + kv_need) / settings.utilization)
        )
        reasons[0] = replace(
            reasons[0],
            smallest_fitting_tensor_parallel_size=_smallest_fitting_tensor_parallel(shape, settings),
            gpu_memory_needed_bytes=needed,
        )
    return reasons


def run_capacity_study(settings: CapacitySettings) -> CapacityResult:
    """The capacity result (per-GPU budget, strategies, or the reasons it does not fit)."""
    if settings.mean_len > settings.max_len:
        raise KvbenchError(f"mean length ({settings.mean_len}) exceeds max-len ({settings.max_len})")
    if settings.concurrency < 1:
        raise KvbenchError(f"concurrency must be a positive integer, got {settings.concurrency}")
    shape, budget = resolve_deployment(settings)
    gpu, parallel = budget.gpu, budget.parallel
    binding = budget.binding
    reasons = not_fitting_reasons(shape, budget, settings)
    per_gpu_weights = max(s.share.weight_bytes for s in budget.stages)
    weights_fit = budget.weights_fit
    return CapacityResult(
        model=ModelRecord.of(shape),
        gpu=gpu.name,
        gpu_memory_bytes=gpu.memory_bytes,
        gpu_memory_utilization=settings.utilization,
        kv_cache_memory_bytes=settings.kv_cache_memory,
        tensor_parallel_size=parallel.tensor,
        pipeline_parallel_size=parallel.pipeline,
        gpus=parallel.gpus,
        kv_cache_dtype=settings.kv_cache_dtype,
        kv_dtype_bytes=shape.kv_dtype_bytes,
        kv_heads_per_gpu=kv_heads_per_gpu(shape, parallel.tensor),
        kv_head_replication=kv_replication(shape, parallel.tensor),
        usable_bytes=binding.usable_bytes,
        weight_bytes=shape.weight_bytes,
        weight_bytes_per_gpu=per_gpu_weights,
        activation_reserve_bytes=binding.share.activation_bytes,
        kv_budget_bytes=max(binding.kv_bytes, 0),
        bytes_per_token=shape.bytes_per_token,
        kv_bytes_per_token_per_gpu=binding.share.bytes_per_token,
        stages=[_stage_record(s) for s in budget.stages],
        max_len=settings.max_len,
        mean_len=settings.mean_len,
        max_num_seqs=settings.max_num_seqs,
        concurrency=settings.concurrency,
        context_length=shape.context_length,
        reasons=reasons,
        strategies=strategy_rows(budget.stages, settings, shape.context_length) if weights_fit else [],
        kv_token_slots=budget.token_slots if weights_fit else None,
        fits_one_max_len_request=_fits_max_len(budget.stages, settings.max_len) if weights_fit else None,
    )


def _stage_record(stage: StageBudget) -> StageRecord:
    share = stage.share
    return StageRecord(
        share.stage,
        (share.layers.start, share.layers.stop),
        share.weight_bytes,
        share.activation_bytes,
        share.full_layers,
        share.window_layers,
        share.bytes_per_token,
        stage.usable_bytes,
        stage.kv_bytes,
    )
