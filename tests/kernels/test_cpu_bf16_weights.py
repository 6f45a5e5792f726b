"""The bfloat16-weight linear kernel against a float64 product, within float32's error bound, on every
instruction-set variant this CPU runs; what it takes and what it refuses."""

from __future__ import annotations

import pytest
import torch
from isa_variants import runnable_variants

from kvbench.kernels import cpu_bf16_weights, cpu_native

UNIT = 2.0**-24  # float32's unit roundoff


@pytest.fixture(params=runnable_variants())
def variant(request, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(cpu_native, "_state", {})
    monkeypatch.setenv(cpu_native.ISA_ENV, request.param)
    if not cpu_bf16_weights.available():
        pytest.skip(f"the kernel is unavailable here: {cpu_bf16_weights.unavailable_reason()}")
    return request.param


def bf16_weight(n: int, k: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=generator) / k**0.5).bfloat16().float()


def assert_within_float32_bound(result: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """|result - exact| <= k u sum|x w| elementwise: float32's worst case for a k-term dot product."""
    exact = x.double() @ weight.double().T
    bound = x.shape[1] * UNIT * (x.double().abs() @ weight.double().abs().T)
    excess = (result.double() - exact).abs() - bound
    assert excess.max().item() <= 0.0, f"error exceeds the float32 bound by {excess.max().item():.3g}"


@pytest.mark.parametrize("rows", [1, 3, 16, 17, 50, 300])
@pytest.mark.parametrize(("n", "k"), [(32, 32), (100, 70), (200, 600)])  # k past one 256-deep chunk, n padded
def test_linear_is_a_float32_product(variant, rows: int, n: int, k: int) -> None:
    weight = bf16_weight(n, k, seed=n + k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    result = cpu_bf16_weights.linear(x, cpu_bf16_weights.pack(weight))
    assert result.shape == (rows, n) and result.dtype == torch.float32
    assert_within_float32_bound(result, x, weight)


def test_long_steps_go_in_blocks_of_rows(variant) -> None:
    weight = bf16_weight(64, 2048, seed=9)  # k = 2048: blocks of 32 rows; 100 rows is 4 blocks, the last short
    x = torch.randn(100, 2048)
    result = cpu_bf16_weights.linear(x, cpu_bf16_weights.pack(weight))
    assert_within_float32_bound(result, x, weight)
    assert torch.equal(cpu_bf16_weights.linear(x[37:38], cpu_bf16_weights.pack(weight))[0], result[37])  # rows alone


@pytest.mark.parametrize(("rows", "k"), [(1, 600), (13, 1025), (16, 576), (50, 2048), (300, 96), (100, 70)])
def test_streaming_the_weight_changes_no_bit(variant, rows: int, k: int) -> None:
    """Streamed, the tiles only prefetch the next chunk besides: the same sums in the same order, whatever the
    number of tiles per block (1, 2, 5, several blocks) or chunks (k in 3 or 8 chunks, a short last one)."""
    weight = bf16_weight(200, k, seed=k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    plain, streamed = cpu_bf16_weights.pack(weight), cpu_bf16_weights.pack(weight, stream=True)
    assert streamed.stream and not plain.stream
    result = cpu_bf16_weights.linear(x, streamed)
    assert torch.equal(result, cpu_bf16_weights.linear(x, plain))
    assert_within_float32_bound(result, x, weight)


def test_the_copy_pairs_column_c_with_column_c_plus_16() -> None:
    """The layout the kernel widens with one shift and one mask: strip s, row p, pair c holds columns 32s + c (low
    half) and 32s + 16 + c (high half), zero past the last column."""
    weight = bf16_weight(40, 5, seed=2)
    packed = cpu_bf16_weights.pack(weight).packed
    assert packed.shape == (2, 5, 16, 2) and packed.dtype == torch.bfloat16
    for strip, p, c, half in [(0, 0, 0, 0), (0, 4, 3, 1), (1, 2, 7, 0), (0, 1, 15, 1)]:
        assert packed[strip, p, c, half] == weight[32 * strip + 16 * half + c, p]
    assert not packed[1, :, 8:, :].any() and not packed[1, :, :, 1].any()  # columns 40-63 do not exist


def test_threads_share_the_columns_without_changing_a_bit(variant) -> None:
    packed = cpu_bf16_weights.pack(bf16_weight(1000, 256, seed=3))
    x = torch.randn(40, 256)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = cpu_bf16_weights.linear(x, packed)
        torch.set_num_threads(3)
        shared = cpu_bf16_weights.linear(x, packed)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(alone, shared)


def test_bias_strided_input_empty_steps_and_wrong_shapes(variant) -> None:
    weight = bf16_weight(64, 96, seed=1)
    packed = cpu_bf16_weights.pack(weight)
    x = torch.randn(9, 200)[:, 10:106]  # rows 200 apart: the kernel reads the stride it is given
    bias = torch.randn(64)
    assert_within_float32_bound(cpu_bf16_weights.linear(x, packed, bias) - bias, x, weight)
    assert cpu_bf16_weights.linear(torch.empty(0, 96), packed).shape == (0, 64)
    with pytest.raises(ValueError, match="float32"):
        cpu_bf16_weights.linear(torch.randn(3, 95), packed)
    with pytest.raises(ValueError, match="float32"):
        cpu_bf16_weights.linear(torch.randn(3, 96).bfloat16(), packed)


def test_takes_only_large_weights_that_are_exactly_bf16(monkeypatch: pytest.MonkeyPatch) -> None:
    if not cpu_bf16_weights.available():
        pytest.skip(f"the kernel is unavailable here: {cpu_bf16_weights.unavailable_reason()}")
    exact = bf16_weight(512, 256, seed=0)
    assert cpu_bf16_weights.takes(exact)
    assert not cpu_bf16_weights.takes(exact + 1e-6)  # float32 values off the bfloat16 grid
    assert not cpu_bf16_weights.takes(exact[:8, :8].clone())  # too small to pay off
    assert not cpu_bf16_weights.takes(exact.bfloat16())  # a bfloat16 model multiplies in bfloat16
    assert cpu_bf16_weights.packed_bytes(torch.empty(100, 70)) == 128 * 70 * 2
    monkeypatch.setenv(cpu_bf16_weights.ENV, "0")
    assert not cpu_bf16_weights.takes(exact) and "KVBENCH_BF16_WEIGHTS=0" in cpu_bf16_weights.unavailable_reason()
