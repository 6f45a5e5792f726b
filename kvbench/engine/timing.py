"""Roofline step times for the simulator: a GPU preset's bandwidth and FLOPs, a model's bytes and FLOPs.

A decode step reads every weight once and every cached token's K/V once, or is bound by the matmul FLOPs
of its batch, whichever is slower. A prefill step is bound by its FLOPs (matmuls plus causal attention)
or by reading the weights.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.models.gpus import GpuSpec
from kvbench.models.shapes import ModelShape


@dataclass(frozen=True)
class RooflineTiming:
    weight_bytes: int
    bytes_per_token: int
    num_parameters: int
    attention_flops_per_pair: float  # FLOPs for one (query token, key token) pair over all layers
    bandwidth: float
    peak_flops: float

    @classmethod
    def for_model(cls, shape: ModelShape, gpu: GpuSpec) -> RooflineTiming:
        return cls(
            weight_bytes=shape.weight_bytes,
            bytes_per_token=shape.bytes_per_token,
            num_parameters=shape.num_parameters,
            attention_flops_per_pair=4.0 * shape.num_layers * shape.num_heads * shape.head_dim,
            bandwidth=gpu.bandwidth_bytes_per_s,
            peak_flops=gpu.peak_flops,
        )

    def decode_coefficients(self, num_running: int) -> tuple[float, float, float]:
        """(base_s, per_used_s, floor_s): step time = max(floor_s, base_s + per_used_s * kv tokens read)."""
        base = self.weight_bytes / self.bandwidth
        per_used = self.bytes_per_token / self.bandwidth
        floor = 2.0 * self.num_parameters * num_running / self.peak_flops
        return base, per_used, floor

    def prefill_seconds(self, prefill_lens: list[int]) -> float:
        tokens = sum(prefill_lens)
        flops = 2.0 * self.num_parameters * tokens
        flops += self.attention_flops_per_pair * sum(n * (n + 1) / 2 for n in prefill_lens)
        return max(flops / self.peak_flops, self.weight_bytes / self.bandwidth)


@dataclass(frozen=True)
class UniformTiming:
    """Every step takes the same time: shares become step-averaged (useful for hand-checkable traces)."""

    step_s: float = 1.0

    def decode_coefficients(self, num_running: int) -> tuple[float, float, float]:
        return self.step_s, 0.0, 0.0

    def prefill_seconds(self, prefill_lens: list[int]) -> float:
        return self.step_s
