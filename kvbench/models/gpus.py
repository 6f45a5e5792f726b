"""GPU presets and the KV budget a deployment leaves after weights (vLLM's ``gpu_memory_utilization`` rule).

Memory is the capacity a GPU is sold with, taken in GiB as ``nvidia-smi`` / ``rocm-smi`` count it (HBM stacks and
GDDR chips come in powers of two); the driver keeps a little of it, so give ``--gpu-memory`` the figure your tool
reports when it matters. Bandwidth and FLOP/s (dense fp16/bf16 tensor throughput, no sparsity) are the vendors'
datasheet figures; they only set the simulator's step times.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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
    # the GPUs deployments use today (NVIDIA, AMD and Intel datasheets)
    "h100-sxm-80g": GpuSpec("h100-sxm-80g", 80 * GIB, 3350e9, 989e12),
    "h100-pcie-80g": GpuSpec("h100-pcie-80g", 80 * GIB, 2000e9, 756e12),
    "b200-180g": GpuSpec("b200-180g", 180 * GIB, 8000e9, 2250e12),  # HGX/DGX B200
    "gb200-186g": GpuSpec("gb200-186g", 186 * GIB, 8000e9, 2500e12),  # one Blackwell GPU of a GB200 NVL72
    "l40s-48g": GpuSpec("l40s-48g", 48 * GIB, 864e9, 362e12),
    "rtx4090-24g": GpuSpec("rtx4090-24g", 24 * GIB, 1008e9, 165e12),  # fp16 tensor with fp32 accumulate
    "rtx5090-32g": GpuSpec("rtx5090-32g", 32 * GIB, 1792e9, 209.5e12),
    "mi300x-192g": GpuSpec("mi300x-192g", 192 * GIB, 5300e9, 1307e12),
    "mi325x-256g": GpuSpec("mi325x-256g", 256 * GIB, 6000e9, 1307e12),
    "gaudi3-128g": GpuSpec("gaudi3-128g", 128 * GIB, 3700e9, 1835e12),
}


CUSTOM = "custom"  # a GPU known by its memory alone (its step times borrow the A100-80GB's speeds)


def resolve_gpu(name: str, memory_bytes: int | None = None) -> GpuSpec:
    """A preset by name; ``memory_bytes`` replaces its memory (what ``nvidia-smi`` shows), keeping its bandwidth
    and FLOP/s for step times. ``custom`` with a memory size is a GPU not listed."""
    if memory_bytes is not None and (not isinstance(memory_bytes, int) or memory_bytes <= 0):
        raise KvbenchError(f"GPU memory must be a positive number of bytes, got {memory_bytes!r}")
    if name == CUSTOM:
        if memory_bytes is None:
            raise KvbenchError("a custom GPU needs its memory size")
        return replace(GPU_PRESETS["a100-80g"], name=f"GPU of {memory_bytes / GIB:g} GiB", memory_bytes=memory_bytes)
    try:
        gpu = GPU_PRESETS[name]
    except KeyError:
        raise KvbenchError(f"unknown GPU {name!r}; known: {', '.join(GPU_PRESETS)}") from None
    if memory_bytes is None:
        return gpu
    return replace(gpu, name=f"{name}, {memory_bytes / GIB:g} GiB", memory_bytes=memory_bytes)


def mlp_width_per_token(shape: ModelShape) -> int:
    """The widest MLP intermediate one token computes: a dense MLP's, or its top-k experts' plus a shared one."""
    moe = shape.moe
    if moe is None:
        return shape.intermediate_size
    routed = moe.experts_per_token * moe.expert_intermediate_size + moe.shared_expert_intermediate_size
    return routed if moe.num_moe_layers == shape.num_layers else max(routed, shape.intermediate_size)


def activation_reserve_bytes(
    shape: ModelShape, max_num_batched_tokens: int = 2048, tensor_parallel: int = 1, logits: bool = True
) -> int:
    """Peak activation memory of one forward over a batch of tokens (vLLM profiles this; we estimate it).

    Dominated by the MLP intermediate (gate, up and their product) and the logits of the batch; tensor
    parallelism splits both (each GPU computes its share of the MLP width and of the vocabulary). A pipeline
    stage before the last computes no logits.
    """
    width = -(-mlp_width_per_token(shape) // tensor_parallel)
    per_token = (3 * width + 4 * shape.hidden_size) * shape.dtype_bytes
    vocab = -(-shape.vocab_size // tensor_parallel)
    logit_bytes = 4 * vocab * min(max_num_batched_tokens, 256) if logits else 0
    return max_num_batched_tokens * per_token + logit_bytes


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
