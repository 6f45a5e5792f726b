"""A deployment as vLLM sets one up: what each GPU holds under tensor and pipeline parallelism, and its KV budget.

Tensor parallelism (TP) splits every layer across the GPUs of a stage: attention by heads, the MLP and the
experts by width, the embeddings by vocabulary; norms and routers are copied. The KV cache follows the KV
heads: each GPU keeps ``num_kv_heads / TP`` of them, and once TP exceeds the KV heads each GPU keeps one whole
head, so every head is stored ``TP / num_kv_heads`` times (vLLM replicates them the same way). Latent attention
(MLA) caches one latent per token that every head reads: each GPU keeps all of it.

Pipeline parallelism (PP) gives each stage a run of layers (vLLM's partition: equal runs, the remainder to the
stages before the last), the embeddings to the first stage and the LM head to the last. Every GPU sizes its KV
pool from its own free memory, and the engine takes the smallest count: the stage with the least room per token
decides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.errors import KvbenchError
from kvbench.models.gpus import GpuSpec, activation_reserve_bytes
from kvbench.models.shapes import ModelShape
from kvbench.models.weights import TP_SPLIT, WeightGroup

DEFAULT_BATCHED_TOKENS = 2048  # tokens one forward may carry (vLLM's max_num_batched_tokens), for activations


@dataclass(frozen=True)
class Parallelism:
    tensor: int = 1
    pipeline: int = 1

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline


def _divisors(value: int) -> list[int]:
    small = [d for d in range(1, math.isqrt(value) + 1) if value % d == 0]
    return sorted(set(small + [value // d for d in small]))


def check_parallelism(shape: ModelShape, parallel: Parallelism) -> None:
    """vLLM's start-up rules: TP divides the attention heads, and the KV heads divide (or are divided by) TP;
    PP has at least one layer per stage. One line naming the numbers when they do not hold."""
    tp, pp = parallel.tensor, parallel.pipeline
    for what, value in (("tensor parallel size", tp), ("pipeline parallel size", pp)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise KvbenchError(f"{what} must be a positive integer, got {value!r}")
    if shape.num_heads % tp:
        choices = ", ".join(map(str, _divisors(shape.num_heads)))
        raise KvbenchError(
            f"tensor parallel size {tp} does not divide the {shape.num_heads} attention heads of "
            f"{shape.name}: choose one of {choices}"
        )
    kv = shape.num_kv_heads
    if shape.mla is None and (kv % tp if tp < kv else tp % kv):
        raise KvbenchError(
            f"tensor parallel size {tp} and the {kv} KV heads of {shape.name} do not divide one "
            "another: the heads cannot be split or replicated evenly"
        )
    if pp > shape.num_layers:
        raise KvbenchError(f"pipeline parallel size {pp} exceeds the {shape.num_layers} layers of {shape.name}")


def pipeline_stages(num_layers: int, pipeline: int) -> list[range]:
    """The layers of each stage: ``num_layers // PP`` each, the remainder one by one to the stages before the
    last (vLLM's ``get_pp_indices``, which keeps the last stage, with the LM head, lighter)."""
    sizes = [num_layers // pipeline] * pipeline
    for index in range(num_layers % pipeline):
        sizes[-2 - index if pipeline > 1 else 0] += 1
    stages, start = [], 0
    for size in sizes:
        stages.append(range(start, start + size))
        start += size
    return stages


def kv_heads_per_gpu(shape: ModelShape, tensor: int) -> int:
    """KV heads one GPU caches (MLA: 1, the shared latent)."""
    if shape.mla is not None:
        return 1
    return max(1, shape.num_kv_heads // tensor)


def kv_replication(shape: ModelShape, tensor: int) -> int:
    """How many GPUs of a stage hold a copy of each KV head (1: no replication)."""
    if shape.mla is not None:
        return tensor
    return max(1, tensor // shape.num_kv_heads)


def kv_bytes_per_token_layer(shape: ModelShape, tensor: int) -> int:
    """One GPU's KV bytes for one token in one of its layers."""
    if shape.mla is not None:
        return shape.kv_values_per_layer * shape.kv_dtype_bytes
    return 2 * kv_heads_per_gpu(shape, tensor) * shape.head_dim * shape.kv_dtype_bytes


def group_bytes_per_gpu(shape: ModelShape, group: WeightGroup, tensor: int) -> int:
    """Bytes of ``group`` that one GPU holds under tensor parallelism ``tensor``."""
    total = shape.group_bytes(group)
    split = TP_SPLIT[group.role]
    if split == "tp":
        return -(-total // tensor)
    if split == "kv":
        return -(-total * kv_heads_per_gpu(shape, tensor) // shape.num_kv_heads)
    return total


@dataclass(frozen=True)
class StageShare:
    """What one GPU of a pipeline stage holds (the GPUs of a stage hold equal shares)."""

    stage: int
    layers: range
    weight_bytes: int
    activation_bytes: int
    full_layers: int
    window_layers: int
    window: int | None
    layer_token_bytes: int  # KV bytes of one token in one of its layers

    @property
    def bytes_per_token(self) -> int:
        """KV bytes per token with every layer growing (windowed ones counted in full)."""
        return (self.full_layers + self.window_layers) * self.layer_token_bytes

    def kv_bytes(self, full_tokens: int, window_tokens: int) -> int:
        """KV bytes of one request holding ``full_tokens`` slots in each full layer and ``window_tokens`` in each
        windowed one."""
        return (self.full_layers * full_tokens + self.window_layers * window_tokens) * self.layer_token_bytes

    def to_dict(self) -> dict:
        return {
            "stage": self.stage,
            "layers": [self.layers.start, self.layers.stop],
            "weight_bytes": self.weight_bytes,
            "activation_bytes": self.activation_bytes,
            "full_attention_layers": self.full_layers,
            "sliding_window_layers": self.window_layers,
            "kv_bytes_per_token": self.bytes_per_token,
        }


def stage_shares(
    shape: ModelShape, parallel: Parallelism, max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS
) -> list[StageShare]:
    """One :class:`StageShare` per pipeline stage; the parallelism is checked first."""
    check_parallelism(shape, parallel)
    tp, pp = parallel.tensor, parallel.pipeline
    per_layer = {
        moe: sum(group_bytes_per_gpu(shape, g, tp) for g in shape.layer_weights(index))
        for moe, index in ((False, shape.representative_layer(False)), (True, shape.representative_layer(True)))
        if index is not None
    }
    moe_layers = set(shape.moe_layer_indices())
    windowed = set(shape.sliding_layers)
    token_bytes = kv_bytes_per_token_layer(shape, tp)
    shares = []
    stages = pipeline_stages(shape.num_layers, pp)
    for index, layers in enumerate(stages):
        first, last = index == 0, index == pp - 1
        weights = sum(per_layer[i in moe_layers] for i in layers)
        for group, place in shape.outer_weights():
            if (place == "first" and first) or (place == "last" and last):
                weights += group_bytes_per_gpu(shape, group, tp)
        if shape.tie_word_embeddings and last and not first:  # the last stage keeps its own copy as LM head
            weights += group_bytes_per_gpu(shape, WeightGroup("lm_head", shape.vocab_size, shape.hidden_size), tp)
        window_layers = sum(1 for i in layers if i in windowed)
        shares.append(
            StageShare(
                stage=index,
                layers=layers,
                weight_bytes=weights,
                activation_bytes=activation_reserve_bytes(shape, max_num_batched_tokens, tp, logits=last),
                full_layers=len(layers) - window_layers,
                window_layers=window_layers,
                window=shape.sliding_window,
                layer_token_bytes=token_bytes,
            )
        )
    return shares


@dataclass(frozen=True)
class StageBudget:
    share: StageShare
    device_bytes: int
    usable_bytes: int
    kv_bytes: int  # negative when weights and activations do not fit

    @property
    def fits(self) -> bool:
        return self.kv_bytes > 0


@dataclass(frozen=True)
class DeploymentBudget:
    """Every stage's budget on one GPU model; the binding stage has the fewest KV token slots."""

    gpu: GpuSpec
    parallel: Parallelism
    utilization: float
    kv_cache_memory: int | None  # KV bytes per GPU set directly (vLLM's kv_cache_memory_bytes); None: derived
    stages: list[StageBudget]

    @property
    def weights_fit(self) -> bool:
        return all(stage.fits for stage in self.stages)

    @property
    def binding(self) -> StageBudget:
        """The stage with the fewest token slots (with weights that do not fit: the one shortest of memory)."""
        if not self.weights_fit:
            return min(self.stages, key=lambda s: s.kv_bytes)
        return min(self.stages, key=lambda s: s.kv_bytes // max(s.share.bytes_per_token, 1))

    @property
    def token_slots(self) -> int:
        """Token slots of the smallest pool with every layer growing (what a uniform simulator pool holds)."""
        if not self.weights_fit:
            return 0
        return min(s.kv_bytes // max(s.share.bytes_per_token, 1) for s in self.stages)


def deployment_budget(
    shape: ModelShape,
    gpu: GpuSpec,
    parallel: Parallelism,
    utilization: float = 0.9,
    kv_cache_memory: int | None = None,
    max_num_batched_tokens: int = DEFAULT_BATCHED_TOKENS,
) -> DeploymentBudget:
    """Each stage's KV budget per GPU: utilization x memory - weights - activations (or ``kv_cache_memory``
    when given; the weights, activations and that cache must then fit in the GPU's whole memory)."""
    if not 0.0 < utilization <= 1.0:
        raise KvbenchError(f"GPU memory utilization must be in (0, 1], got {utilization}")
    budgets = []
    for share in stage_shares(shape, parallel, max_num_batched_tokens):
        if kv_cache_memory is None:
            usable = int(utilization * gpu.memory_bytes)
            kv = usable - share.weight_bytes - share.activation_bytes
        else:
            usable = gpu.memory_bytes
            room = usable - share.weight_bytes - share.activation_bytes
            kv = kv_cache_memory if room >= kv_cache_memory else room - kv_cache_memory  # < 0: the shortfall
        budgets.append(StageBudget(share, gpu.memory_bytes, usable, kv))
    return DeploymentBudget(gpu, parallel, utilization, kv_cache_memory, budgets)
