"""Roofline step times: dense models read every weight; a mixture of experts reads the experts its batch hits."""

from __future__ import annotations

import pytest

from kvbench.engine.timing import RooflineTiming, expected_distinct_experts
from kvbench.models.gpus import resolve_gpu
from kvbench.models.resolve import resolve_model
from kvbench.models.shapes import ModelShape, MoeSpec

MIXTRAL = ModelShape(
    "mixtral-8x7b",
    32,
    4096,
    32,
    8,
    14336,
    32000,
    32768,
    rope_theta=1e6,
    moe=MoeSpec(num_experts=8, experts_per_token=2, expert_intermediate_size=14336, num_moe_layers=32),
)


def test_expected_distinct_experts_by_hand() -> None:
    assert expected_distinct_experts(8, 2, 0) == 0.0
    assert expected_distinct_experts(8, 2, 1) == pytest.approx(2.0)  # one token: exactly its top-k
    assert expected_distinct_experts(8, 2, 2) == pytest.approx(8 * (1 - 0.75**2))  # 3.5
    assert expected_distinct_experts(8, 2, 1000) == pytest.approx(8.0)  # a large batch hits all of them
    assert expected_distinct_experts(8, 8, 1) == pytest.approx(8.0)
    assert expected_distinct_experts(0, 0, 5) == 0.0


def test_dense_model_is_timed_as_before() -> None:
    shape, gpu = resolve_model("llama-2-13b"), resolve_gpu("a100-80g")
    timing = RooflineTiming.for_model(shape, gpu)
    base, per_used, floor = timing.decode_coefficients(10)
    assert base == shape.weight_bytes / gpu.bandwidth_bytes_per_s
    assert per_used == shape.bytes_per_token / gpu.bandwidth_bytes_per_s
    assert floor == 2.0 * shape.num_parameters * 10 / gpu.peak_flops
    assert timing.active_parameters == shape.num_parameters
    prefill = timing.prefill_seconds([1000, 24])
    flops = 2.0 * shape.num_parameters * 1024 + timing.attention_flops_per_pair * (1000 * 1001 / 2 + 24 * 25 / 2)
    assert prefill == max(flops / gpu.peak_flops, shape.weight_bytes / gpu.bandwidth_bytes_per_s)


def test_moe_decode_reads_the_experts_its_batch_hits() -> None:
    gpu = resolve_gpu("h200-141g")
    timing = RooflineTiming.for_model(MIXTRAL, gpu)
    expert = 32 * 3 * 4096 * 14336 * 2  # one expert's fp16 bytes over all 32 layers
    assert timing.expert_bytes == expert
    dense_part = MIXTRAL.weight_bytes - 8 * expert
    one, _, _ = timing.decode_coefficients(1)
    assert one == pytest.approx((dense_part + 2 * expert) / gpu.bandwidth_bytes_per_s)
    two, _, _ = timing.decode_coefficients(2)
    assert two == pytest.approx((dense_part + 3.5 * expert) / gpu.bandwidth_bytes_per_s)
    many, _, _ = timing.decode_coefficients(256)
    assert many == pytest.approx(MIXTRAL.weight_bytes / gpu.bandwidth_bytes_per_s)
    assert one < two < many


def test_moe_flops_use_active_parameters() -> None:
    gpu = resolve_gpu("h100-80g")
    timing = RooflineTiming.for_model(MIXTRAL, gpu)
    assert timing.active_parameters == MIXTRAL.active_parameters < MIXTRAL.num_parameters / 3
    _, _, floor = timing.decode_coefficients(64)
    assert floor == 2.0 * MIXTRAL.active_parameters * 64 / gpu.peak_flops
    long_prompt = timing.prefill_seconds([8192])
    flops = 2.0 * MIXTRAL.active_parameters * 8192 + timing.attention_flops_per_pair * 8192 * 8193 / 2
    assert long_prompt == pytest.approx(flops / gpu.peak_flops)  # compute-bound: FLOPs of 2 experts, not 8
