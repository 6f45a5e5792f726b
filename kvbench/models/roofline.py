"""The least work a workload needs and the least time any engine can take for it on a core of known peak rates.

A batch of ``requests`` prompts of ``prompt_len`` tokens, each answered with ``output_len`` greedy tokens, needs
at least:

- **arithmetic**: every prompt token and every output token but the last goes through every layer's matrices
  (2 floating-point operations per weight); the lm_head runs once per output token (a prompt's logits are needed
  at its last position only); attention multiplies each query by the keys and values before it, causally
  (4 x heads x head_dim per key, a windowed layer's keys stopping at its window). Norms, rotary and activations
  are left out, so the figure stays a lower bound.
- **memory reads**: the answer's tokens come one forward pass at a time, so there are at least ``output_len``
  passes (the first with the prompts), and each reads every matrix once and, while decoding, each request's cached
  K and V; of that, at most what every cache of the machine holds can be left from the pass before.

No engine finishes sooner than the larger of the arithmetic at the core's peak rate and the reads at its memory
rate (:mod:`kvbench.kernels.cpu_peak` measures both). Weights are counted at the fewest bytes that hold them
exactly: 2 where every weight is a bfloat16 number (as published checkpoints store them), even in a float32 run.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.errors import KvbenchError
from kvbench.models.shapes import DTYPE_BYTES, ModelShape

_NOT_MATMUL = frozenset({"embed", "position", "lm_head", "vision"})  # rows looked up or counted on their own


@dataclass(frozen=True)
class Work:
    """The least a workload costs: floating-point operations, bytes read from memory, forward passes."""

    flops: float
    memory_bytes: float
    passes: int

    def least_seconds(self, flops_per_second: float, read_bytes_per_second: float) -> float:
        """No engine takes less: the arithmetic and the reads may overlap, but neither can go faster."""
        return max(self.flops / flops_per_second, self.memory_bytes / read_bytes_per_second)


def matmul_parameters(shape: ModelShape) -> tuple[int, int]:
    """(weights in one token's pass through the decoder layers' matrices, weights of the lm_head)."""
    routed = shape.moe.experts_per_token if shape.moe else None
    layers = sum(
        group.parameters for group in shape.weight_groups(routed) if group.matrix and group.role not in _NOT_MATMUL
    )
    return layers, shape.vocab_size * shape.hidden_size  # a tied lm_head multiplies by the embedding all the same


def _attended_keys(shape: ModelShape, context: int) -> int:
    """Keys one query attends to summed over the layers, at a context of ``context`` tokens (itself included)."""
    windowed = min(context, shape.sliding_window) if shape.sliding_layers and shape.sliding_window else context
    return shape.full_attention_layers * context + len(shape.sliding_layers) * windowed


def work(
    shape: ModelShape,
    requests: int,
    prompt_len: int,
    output_len: int,
    *,
    dtype: str,
    weight_bytes_per_value: int | None = None,
    cache_bytes: int | None = None,
) -> Work:
    """The least work of ``requests`` x (``prompt_len`` + ``output_len``) in ``dtype``, weights held in
    ``weight_bytes_per_value`` bytes each (default: the dtype's), with ``cache_bytes`` of cache (None: no cache)."""
    if min(requests, prompt_len, output_len) < 1:
        raise KvbenchError("a roofline needs at least one request, one prompt token and one output token")
    if shape.mla is not None:
        raise KvbenchError(f"{shape.name}: the roofline counts per-head attention, not latent attention")
    if dtype not in DTYPE_BYTES:
        raise KvbenchError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
    shape = shape.with_dtype(dtype).with_kv_dtype("auto")
    layer_weights, head_weights = matmul_parameters(shape)
    through_layers = prompt_len + output_len - 1  # the last output token is never fed back
    attention_width = shape.num_heads * shape.head_dim
    attended = sum(_attended_keys(shape, context) for context in range(1, through_layers + 1))
    flops = requests * (
        2 * layer_weights * through_layers + 2 * head_weights * output_len + 4 * attention_width * attended
    )
    weight_bytes = (layer_weights + head_weights) * (weight_bytes_per_value or DTYPE_BYTES[dtype])
    kept = cache_bytes or 0
    memory = max(0, weight_bytes - kept)  # the pass over the prompts: its K and V can stay in the cache
    for step in range(1, output_len):  # decode pass `step` reads the K and V of prompt_len + step - 1 tokens
        memory += max(0, weight_bytes + requests * shape.kv_bytes(prompt_len + step - 1) - kept)
    return Work(float(flops), float(memory), output_len)
