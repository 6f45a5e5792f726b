"""The AMX linear kernel against a float64 product, with float32's error bound; when it is used and when not."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import cpu_amx

UNIT = 2.0**-24  # float32's unit roundoff


@pytest.fixture
def amx() -> None:
    if not cpu_amx.available():
        pytest.skip(f"AMX kernel unavailable here: {cpu_amx.unavailable_reason()}")


def bf16_weight(n: int, k: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=generator) / k**0.5).bfloat16().float()


def assert_within_float32_bound(result: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> None:
    """|result - exact| <= (k + 3) u sum|x w| elementwise: float32's worst case for a k-term dot product, plus
    the three-term split's representation error."""
    exact = x.double() @ weight.double().T
    bound = (x.shape[1] + 3) * UNIT * (x.double().abs() @ weight.double().abs().T)
    excess = (result.double() - exact).abs() - bound
    assert excess.max().item() <= 0.0, f"error exceeds the float32 bound by {excess.max().item():.3g}"


def test_three_bf16_terms_hold_a_float32_value(amx) -> None:
    from kvbench.kernels import cpu_native

    x = torch.randn(5, 70) * torch.logspace(-20, 20, 70)  # magnitudes far apart in one row
    terms = torch.full((3, 32, 96), 7.0, dtype=torch.bfloat16)  # padding must come back zero
    cpu_native._library().kvbench_split3_bf16(x.data_ptr(), 5, 70, 70, terms.data_ptr(), 32, 96)
    total = terms[0].double() + terms[1].double() + terms[2].double()
    assert ((total[:5, :70] - x.double()).abs() <= UNIT * x.double().abs()).all()
    assert (terms[0][:5, :70].double() - x.double()).abs().max() > 0  # one bfloat16 term alone would not do
    assert not total[5:].any() and not total[:, 70:].any()


@pytest.mark.parametrize("rows", [1, 16, 17, 50, 130])
@pytest.mark.parametrize(("n", "k"), [(32, 32), (100, 70), (576, 1536), (2560, 2048)])
def test_linear_is_a_float32_product(amx, rows: int, n: int, k: int) -> None:
    weight = bf16_weight(n, k, seed=n + k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(rows))
    result = cpu_amx.linear(x, cpu_amx.pack(weight))
    assert result.shape == (rows, n) and result.dtype == torch.float32
    assert_within_float32_bound(result, x, weight)


def test_long_steps_go_through_in_passes_and_empty_ones_work(amx, monkeypatch: pytest.MonkeyPatch) -> None:
    weight = bf16_weight(100, 70, seed=5)
    packed = cpu_amx.pack(weight)
    x = torch.randn(130, 70)
    whole = cpu_amx.linear(x, packed)
    monkeypatch.setattr(cpu_amx, "MAX_ROWS_PER_PASS", 32)  # 130 rows: four passes of 32 and one of 2
    assert torch.equal(cpu_amx.linear(x, packed), whole)
    assert_within_float32_bound(whole, x, weight)
    assert cpu_amx.linear(torch.empty(0, 70), packed).shape == (0, 100)


def test_threads_share_the_columns_without_changing_a_bit(amx) -> None:
    weight = cpu_amx.pack(bf16_weight(1000, 256, seed=3))
    x = torch.randn(40, 256)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = cpu_amx.linear(x, weight)
        torch.set_num_threads(3)
        shared = cpu_amx.linear(x, weight)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(alone, shared)


def test_bias_strided_input_and_wrong_shapes(amx) -> None:
    weight = bf16_weight(64, 96, seed=1)
    packed = cpu_amx.pack(weight)
    wide = torch.randn(9, 200)
    x = wide[:, 10:106]  # rows 200 apart: the kernel reads the stride it is given
    bias = torch.randn(64)
    result = cpu_amx.linear(x, packed, bias)
    assert_within_float32_bound(result - bias, x, weight)
    with pytest.raises(ValueError, match="float32"):
        cpu_amx.linear(torch.randn(3, 95), packed)
    with pytest.raises(ValueError, match="float32"):
        cpu_amx.linear(torch.randn(3, 96, dtype=torch.float64), packed)


def test_takes_only_large_weights_that_are_exactly_bf16(amx, monkeypatch: pytest.MonkeyPatch) -> None:
    exact = bf16_weight(512, 512, seed=0)
    assert cpu_amx.exactly_bf16(exact) and cpu_amx.takes(exact)
    assert not cpu_amx.takes(exact + 1e-6)  # float32 values off the bfloat16 grid: refused
    last_off = exact.clone()
    last_off[-1, -1] = 1.0 + 2.0**-20  # one value, the very last one, is enough
    assert not cpu_amx.exactly_bf16(last_off) and cpu_amx.exactly_bf16(exact.t())  # .t(): the torch check
    assert not cpu_amx.takes(exact[:8, :8].clone())  # too small to pay off
    assert not cpu_amx.takes(exact.bfloat16())  # a bfloat16 model keeps oneDNN's bfloat16 path
    assert cpu_amx.packed_bytes(torch.empty(100, 70)) == 128 * 96 * 2
    monkeypatch.setenv(cpu_amx.ENV, "0")
    assert not cpu_amx.available() and "KVBENCH_AMX=0" in cpu_amx.unavailable_reason()
    assert not cpu_amx.takes(exact)


def test_without_the_c_kernels_there_is_no_amx(monkeypatch: pytest.MonkeyPatch) -> None:
    from kvbench.kernels import cpu_native

    monkeypatch.setattr(cpu_native, "_state", {})
    monkeypatch.setenv(cpu_native.ENV, "0")
    assert not cpu_amx.available() and "KVBENCH_NATIVE_KERNELS=0" in cpu_amx.unavailable_reason()
