"""The vdpbf16ps linear kernel against a float64 product, within a bfloat16 rounding of float32's error bound, on
every instruction-set variant that has it; narrower variants say why they lack it; what it takes and refuses."""

from __future__ import annotations

import pytest
import torch
from isa_variants import runnable_variants

from kvbench.cpu import cpu_linear
from kvbench.kernels import cpu_bf16_dot, cpu_native

UNIT_F32, UNIT_BF16 = 2.0**-24, 2.0**-8  # unit roundoffs


@pytest.fixture(params=runnable_variants())
def variant(request, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(cpu_native, "_state", {})
    monkeypatch.setenv(cpu_native.ISA_ENV, request.param)
    if not cpu_native.available():
        pytest.skip(f"the C kernels are unavailable here: {cpu_native.unavailable_reason()}")
    if not cpu_bf16_dot.available():
        # the avx512 and avx2 variants never have it; native has it only where the CPU does (not on a Zen 1-3)
        assert "built without AVX-512 BF16" in cpu_bf16_dot.unavailable_reason()
        pytest.skip(f"the {request.param} variant has no vdpbf16ps on this CPU")
    return request.param


def bf16(*shape: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator).bfloat16()


def assert_within_bound(result: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias=None) -> None:
    """|result - exact| <= u16 |exact| + (1 + u16) (k + 1) u32 (sum|x w| + |bias|) elementwise: float32 sums of
    k + 1 terms, rounded once to bfloat16."""
    exact = x.double() @ weight.double().T
    magnitude = x.double().abs() @ weight.double().abs().T
    if bias is not None:
        exact, magnitude = exact + bias.double(), magnitude + bias.double().abs()
    bound = UNIT_BF16 * exact.abs() + (1 + UNIT_BF16) * (x.shape[1] + 1) * UNIT_F32 * magnitude
    excess = (result.double() - exact).abs() - bound
    assert excess.max().item() <= 0.0, f"error exceeds the bound by {excess.max().item():.3g}"


@pytest.mark.parametrize("rows", [1, 3, 12, 13, 16, 50, 300])
@pytest.mark.parametrize(
    ("n", "k"), [(32, 32), (100, 33), (200, 600), (40, 1025)]
)  # n padded to a strip, an odd k, k in 3 chunks of pairs, and 2 whole chunks then the odd value alone
def test_linear_is_a_rounded_float32_product(variant, rows: int, n: int, k: int) -> None:
    weight, x = bf16(n, k, seed=n + k), bf16(rows, k, seed=rows)
    result = cpu_bf16_dot.linear(x, cpu_bf16_dot.pack(weight))
    assert result.shape == (rows, n) and result.dtype == torch.bfloat16
    assert_within_bound(result, x, weight)


@pytest.mark.parametrize(("k", "rows"), [(8192, 100), (32, 800)])
def test_long_steps_go_in_blocks_of_rows_and_each_row_is_its_own(variant, k: int, rows: int) -> None:
    """k = 8192: blocks of 48 rows (by the activations' bytes), 100 rows in 3, the last short; k = 32: blocks of 384
    (the most whose partial sums the kernel keeps), 800 rows in 3."""
    weight, x = bf16(64, k, seed=9), bf16(rows, k, seed=1)
    packed = cpu_bf16_dot.pack(weight)
    result = cpu_bf16_dot.linear(x, packed)
    assert_within_bound(result, x, weight)
    for row in (37, rows - 1):
        assert torch.equal(cpu_bf16_dot.linear(x[row : row + 1], packed)[0], result[row])  # its sum alone


@pytest.mark.parametrize(("rows", "k"), [(1, 600), (13, 1025), (16, 576), (50, 2048), (300, 96), (800, 32)])
def test_streaming_the_weight_changes_no_bit(variant, rows: int, k: int) -> None:
    """Streamed, the tiles only prefetch the next chunk besides: the same sums in the same order, whatever the
    number of tiles per block (1, 2, 5, blocks of 384) or chunks (an odd k, k in 3 or 8 chunks of pairs)."""
    weight, x, bias = bf16(200, k, seed=k), bf16(rows, k, seed=rows), bf16(200, seed=3)
    plain, streamed = cpu_bf16_dot.pack(weight), cpu_bf16_dot.pack(weight, stream=True)
    assert streamed.stream and not plain.stream
    result = cpu_bf16_dot.linear(x, streamed, bias)
    assert torch.equal(result, cpu_bf16_dot.linear(x, plain, bias))
    assert_within_bound(result, x, weight, bias)


def test_threads_share_the_columns_without_changing_a_bit(variant) -> None:
    packed = cpu_bf16_dot.pack(bf16(1000, 256, seed=3))
    x = bf16(40, 256, seed=4)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = cpu_bf16_dot.linear(x, packed)
        torch.set_num_threads(3)
        shared = cpu_bf16_dot.linear(x, packed)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(alone, shared)


def test_bias_strided_input_empty_steps_and_wrong_inputs(variant) -> None:
    weight = bf16(70, 96, seed=1)  # 70 columns: the bias of the second, partial strip too
    packed = cpu_bf16_dot.pack(weight)
    x = bf16(9, 200, seed=2)[:, 10:106]  # rows 200 apart: the kernel reads the stride it is given
    bias = bf16(70, seed=5) * 8
    assert_within_bound(cpu_bf16_dot.linear(x, packed, bias), x, weight, bias)
    assert_within_bound(cpu_bf16_dot.linear(x, packed, bias.float()), x, weight, bias)  # a float32 bias
    assert cpu_bf16_dot.linear(bf16(0, 96, seed=0), packed).shape == (0, 70)
    with pytest.raises(ValueError, match="bfloat16"):
        cpu_bf16_dot.linear(bf16(3, 95, seed=0), packed)
    with pytest.raises(ValueError, match="bfloat16"):
        cpu_bf16_dot.linear(torch.randn(3, 96), packed)


def test_it_agrees_with_onednn_within_one_rounding(variant) -> None:
    """Both sum in float32 and round once to bfloat16: at most one bfloat16 step apart (their sums' orders differ)."""
    weight, x = bf16(576, 576, seed=11), bf16(16, 576, seed=12)
    ours = cpu_bf16_dot.linear(x, cpu_bf16_dot.pack(weight)).double()
    theirs = torch.nn.functional.linear(x, weight).double()
    step = torch.maximum(ours.abs(), theirs.abs()) * 2.0**-7
    assert ((ours - theirs).abs() <= step).all()
    assert (ours == theirs).float().mean().item() > 0.9  # mostly the same bits


def test_takes_only_large_bf16_weights(monkeypatch: pytest.MonkeyPatch) -> None:
    if not cpu_bf16_dot.available():
        pytest.skip(f"the kernel is unavailable here: {cpu_bf16_dot.unavailable_reason()}")
    weight = bf16(512, 256, seed=0)
    assert cpu_bf16_dot.takes(weight)
    assert not cpu_bf16_dot.takes(weight.float())  # a float32 run has its own kernels
    assert not cpu_bf16_dot.takes(weight[:8, :8].clone())  # too small to pay off
    assert cpu_bf16_dot.packed_bytes(torch.empty(100, 33)) == 128 * 34 * 2
    assert {cpu_linear.BF16DOT, cpu_linear.BF16DOT_STREAM} <= set(cpu_linear.candidate_paths(weight))
    monkeypatch.setenv(cpu_bf16_dot.ENV, "0")
    assert not cpu_bf16_dot.takes(weight) and "KVBENCH_BF16_DOT=0" in cpu_bf16_dot.unavailable_reason()
    assert not {cpu_linear.BF16DOT, cpu_linear.BF16DOT_STREAM} & set(cpu_linear.candidate_paths(weight))


def test_routed_bf16_weights_take_the_kernel_and_others_fall_back_to_onednn() -> None:
    if not cpu_bf16_dot.available():
        pytest.skip(f"the kernel is unavailable here: {cpu_bf16_dot.unavailable_reason()}")
    weight = bf16(512, 256, seed=6)
    routed = cpu_linear.pack_for(torch.nn.Module(), weight, ((0, 64, cpu_linear.BF16DOT), (64, 1 << 62, "plain")))
    assert cpu_linear.path_at(routed, 16) == cpu_linear.BF16DOT and cpu_linear.path_at(routed, 64) == "plain"
    x = bf16(16, 256, seed=7)
    assert torch.equal(cpu_linear.linear(x, routed), cpu_bf16_dot.linear(x, cpu_bf16_dot.pack(weight)))
    assert cpu_linear.path_at(routed.copies[cpu_linear.BF16DOT], 1) == cpu_linear.BF16DOT
    model = torch.nn.Linear(256, 512, dtype=torch.bfloat16)
    assert cpu_linear.packed_copy_bytes(model, [((512, 256), cpu_linear.BF16DOT, 3)]) == 3 * 512 * 256 * 2
    as_float = cpu_linear.pack_for(torch.nn.Module(), weight.float(), ((0, 1 << 62, cpu_linear.BF16DOT),))
    assert set(as_float.copies) == {cpu_linear.ONEDNN}  # a float32 weight is never given to the bfloat16 kernel
