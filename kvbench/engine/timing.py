"""Roofline step times for the simulator: a GPU preset's bandwidth and FLOPs, a model's bytes and FLOPs.

A decode step reads the weights its batch uses once and every cached token's K/V once, or is bound by the
matmul FLOPs of its batch, whichever is slower. A prefill step is bound by its FLOPs (matmuls plus causal
attention) or by reading the weights it uses.

FLOPs per token are ``2 x active parameters``: a mixture-of-experts token runs through the dense part and its
top-k experts only. The weights a step reads are the dense part plus the experts its tokens hit, estimated by
:func:`expected_distinct_experts`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.models.gpus import GpuSpec
from kvbench.models.shapes import ModelShape


def expected_distinct_experts(num_experts: int, experts_per_token: int, num_tokens: int) -> float:
    """Expected number of experts (of one MoE layer) that ``num_tokens`` tokens route to, at least one token each.

    Model: every token picks ``experts_per_token`` distinct experts uniformly at random, independently of the
    other tokens. An expert is then missed by one token with probability ``1 - k/E`` and by all of them with
    ``(1 - k/E)^T``, so ``E (1 - (1 - k/E)^T)`` experts are hit. Real routers are skewed towards some experts,
    which hits fewer: the estimate errs towards reading more bytes, i.e. slower steps.
    """
    if num_experts <= 0 or num_tokens <= 0:
        return 0.0
    miss = 1.0 - experts_per_token / num_experts
    return num_experts * (1.0 - miss**num_tokens)


@dataclass(frozen=True)
class RooflineTiming:
    weight_bytes: int  # every weight, all experts of a mixture of experts included
    bytes_per_token: int
    active_parameters: int  # parameters one token runs through (dense part + top-k experts)
    attention_flops_per_pair: float  # FLOPs for one (query token, key token) pair over all layers
    bandwidth: float
    peak_flops: float
    expert_bytes: int = 0  # one routed expert's weights summed over the MoE layers (0: dense model)
    num_experts: int = 0
    experts_per_token: int = 0

    @classmethod
    def for_model(cls, shape: ModelShape, gpu: GpuSpec) -> RooflineTiming:
        return cls(
            weight_bytes=shape.weight_bytes,
            bytes_per_token=shape.bytes_per_token,
            active_parameters=shape.active_parameters,
            attention_flops_per_pair=4.0 * shape.num_layers * shape.num_heads * shape.head_dim,
            bandwidth=gpu.bandwidth_bytes_per_s,
            peak_flops=gpu.peak_flops,
            expert_bytes=shape.routed_expert_bytes,
            num_experts=shape.moe.num_experts if shape.moe else 0,
            experts_per_token=shape.moe.experts_per_token if shape.moe else 0,
        )

    def weight_bytes_read(self, num_tokens: int) -> float:
        """Weight bytes a forward over ``num_tokens`` tokens reads: all but the experts none of them hits."""
        if not self.num_experts:
            return float(self.weight_bytes)
        missed = self.num_experts - expected_distinct_experts(self.num_experts, self.experts_per_token, num_tokens)
        return self.weight_bytes - missed * self.expert_bytes

    def decode_coefficients(self, num_running: int) -> tuple[float, float, float]:
        """(base_s, per_used_s, floor_s): step time = max(floor_s, base_s + per_used_s * kv tokens read)."""
        base = self.weight_bytes_read(num_running) / self.bandwidth
        per_used = self.bytes_per_token / self.bandwidth
        floor = 2.0 * self.active_parameters * num_running / self.peak_flops
        return base, per_used, floor

    def prefill_seconds(self, prefill_lens: list[int], cached: list[int] | None = None) -> float:
        """A prefill step over requests of ``prefill_lens`` tokens, of which ``cached`` (a prefix cache's
        hit) need no compute: only the suffix runs, attending to the cached context as well."""
        if cached is None:
            tokens = sum(prefill_lens)
            pairs = sum(n * (n + 1) / 2 for n in prefill_lens)
        else:
            tokens = sum(n - c for n, c in zip(prefill_lens, cached, strict=True))
            pairs = sum((n - c) * c + (n - c) * (n - c + 1) / 2 for n, c in zip(prefill_lens, cached, strict=True))
        flops = 2.0 * self.active_parameters * tokens + self.attention_flops_per_pair * pairs
        return max(flops / self.peak_flops, self.weight_bytes_read(tokens) / self.bandwidth)


@dataclass(frozen=True)
class UniformTiming:
    """Every step takes the same time: shares become step-averaged (useful for hand-checkable traces)."""

    step_s: float = 1.0

    def decode_coefficients(self, num_running: int) -> tuple[float, float, float]:
        return self.step_s, 0.0, 0.0

    def prefill_seconds(self, prefill_lens: list[int], cached: list[int] | None = None) -> float:
        return self.step_s


@dataclass(frozen=True)
class MeasuredTiming:
    """Step times fitted to a real server's requests: a decode step of ``decode_s`` plus ``decode_per_running_s``
    for each request in the batch, and a prefill of ``prefill_base_s`` plus ``prefill_per_token_s`` per token not
    served from the prefix cache."""

    decode_s: float
    prefill_base_s: float
    prefill_per_token_s: float
    decode_per_running_s: float = 0.0

    def decode_coefficients(self, num_running: int) -> tuple[float, float, float]:
        return self.decode_s + self.decode_per_running_s * num_running, 0.0, 0.0

    def prefill_seconds(self, prefill_lens: list[int], cached: list[int] | None = None) -> float:
        computed = sum(prefill_lens) - (sum(cached) if cached is not None else 0)
        return self.prefill_base_s + self.prefill_per_token_s * computed
