"""GPU presets and the KV budget a deployment leaves after weights (vLLM's ``gpu_memory_utilization`` rule)."""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import KvbenchError
from kvbench.models.shapes import ModelShape

GIB = 1024**3


@dataclass(frozen=True)
class GpuSpec:
    name: str
    memory_bytes: int
    bandwidth_bytes_per_s: float  # HBM/GDDR bandwidth, datasheet
    peak_flops: float  # dense fp16/bf16 tensor-core FLOP/s, datasheet (no sparsity)


GPU_PRESETS: dict[str, GpuSpec] = {
    "a10g-24g": GpuSpec("a10g-24g", 24 * GIB, 600e9, 125e12),  # AWS g5.2xlarge, the article's instance
    "l4-24g": GpuSpec("l4-24g", 24 * GIB, 300e9, 121e12),
    "a100-40g": GpuSpec("a100-40g", 40 * GIB, 1555e9, 312e12),
    "a100-80g": GpuSpec("a100-80g", 80 * GIB, 2039e9, 312e12),
    "h100-80g": GpuSpec("h100-80g", 80 * GIB, 3350e9, 989e12),
    "h200-141g": GpuSpec("h200-141g", 141 * GIB, 4800e9, 989e12),
}


def resolve_gpu(name: str) -> GpuSpec:
    try:
        return GPU_PRESETS[name]
    except KeyError:
        raise KvbenchError(f"unknown GPU {name!r}; known: {', '.join(GPU_PRESETS)}") from None


def mlp_width_per_token(shape: ModelShape) -> int:
    """The widest MLP intermediate one token computes: a dense MLP's, or its top-k experts' plus a shared one."""
    moe = shape.moe
    if moe is None:
        return shape.intermediate_size
    routed = moe.experts_per_token * moe.expert_intermediate_size + moe.shared_expert_intermediate_size
    return routed if moe.num_moe_layers == shape.num_layers else max(routed, shape.intermediate_size)


def activation_reserve_bytes(shape: ModelShape, max_num_batched_tokens: int = 2048) -> int:
    """Peak activation memory of one forward over a batch of tokens (vLLM profiles this; we estimate it).

    Dominated by the MLP intermediate (gate, up and their product) and the logits of the batch.
    """
    per_token = (3 * mlp_width_per_token(shape) + 4 * shape.hidden_size) * shape.dtype_bytes
    logits = 4 * shape.vocab_size * min(max_num_batched_tokens, 256)
    return max_num_batched_tokens * per_token + logits


@dataclass(frozen=True)
class KvBudget:
    device_bytes: int
    utilization: float
    weight_bytes: int
    activation_bytes: int

    @property
    def usable_bytes(self) -> int:
        return int(self.utilization * self.device_bytes)

    @property
    def kv_bytes(self) -> int:
        """What is left for the KV cache; negative when the model does not fit."""
        return self.usable_bytes - self.weight_bytes - self.activation_bytes

    @property
    def fits(self) -> bool:
        return self.kv_bytes > 0


def kv_budget(shape: ModelShape, gpu: GpuSpec, utilization: float = 0.9) -> KvBudget:
    if not 0.0 < utilization <= 1.0:
        raise KvbenchError(f"GPU memory utilization must be in (0, 1], got {utilization}")
    return KvBudget(gpu.memory_bytes, utilization, shape.weight_bytes, activation_reserve_bytes(shape))
