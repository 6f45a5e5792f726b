"""The CPU's C decode kernel against contiguous SDPA and the torch reference; building, caching and fallbacks."""

from __future__ import annotations

import pytest
import torch
from kv_cases import decode_oracle, make_case, poisoned_like, rel_error

from kvbench import kernels
from kvbench.kernels import cpu_native, reference

LENS = [1, 15, 16, 17, 300]
SCALE = 0.17


@pytest.fixture
def native() -> None:
    if not cpu_native.available():
        pytest.skip(f"CPU kernels unavailable here: {cpu_native.unavailable_reason()}")


@pytest.fixture
def fresh_state(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """A process that has not loaded the kernels yet, with its own build cache."""
    monkeypatch.setattr(cpu_native, "_state", {})
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
@pytest.mark.parametrize("group", [1, 3, 8])
def test_decode_matches_sdpa(native, block_size: int, group: int) -> None:
    case = make_case(LENS, block_size, num_kv_heads=2, head_dim=16, seed=block_size * 10 + group)
    query = torch.randn(len(LENS), 2 * group, 16, generator=torch.Generator().manual_seed(1))
    out = poisoned_like(query)
    result = cpu_native.paged_decode_attention(query, case.k_cache, case.v_cache, case.block_tables,
                                               case.context_lens, SCALE, out=out)
    assert result is out
    assert rel_error(out, decode_oracle(case, query, SCALE)) < 1e-5


def test_strided_query_empty_context_and_head_dim_64(native) -> None:
    """The runner hands over q as a view of the fused q/k/v projection; a request may have no context."""
    lens = [0, 40, 129]
    case = make_case(lens, 16, num_kv_heads=3, head_dim=64, seed=4)
    fused = torch.randn(len(lens), 9 + 2 * 3, 64, generator=torch.Generator().manual_seed(5))
    query = fused[:, :9]
    assert not query.is_contiguous()
    got = cpu_native.paged_decode_attention(query, case.k_cache, case.v_cache, case.block_tables,
                                            case.context_lens, SCALE)
    torch.testing.assert_close(got, reference.paged_decode_attention(
        query.contiguous(), case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE),
        rtol=1e-5, atol=1e-6)
    assert torch.equal(got[0], torch.zeros_like(got[0]))


def test_tables_too_narrow_for_the_context_are_refused(native) -> None:
    case = make_case([20, 40], 8, num_kv_heads=1, head_dim=16, seed=6)
    query = torch.randn(2, 2, 16)
    with pytest.raises(ValueError, match="covering 40 tokens"):
        cpu_native.paged_decode_attention(query, case.k_cache, case.v_cache, case.block_tables[:, :2],
                                          case.context_lens, SCALE)


def test_dispatch_runs_it_for_float32_and_the_reference_otherwise(native) -> None:
    case = make_case([9, 30], 8, 1, 16, seed=2)
    query = torch.randn(2, 2, 16)
    args = (query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, 0.25)
    torch.testing.assert_close(kernels.paged_decode_attention(*args, backend="native", max_context_len=30),
                               kernels.paged_decode_attention(*args, backend="torch"), rtol=1e-5, atol=1e-6)
    assert kernels.plan_decode(case.block_tables, case.context_lens, case.k_cache, "native") is None
    half = case.k_cache.to(torch.bfloat16)  # not a dtype the C kernel takes: the reference plans and runs
    assert isinstance(kernels.plan_decode(case.block_tables, case.context_lens, half, "native"),
                      reference.DecodePlan)


def test_builds_once_into_the_cache_and_reuses_it(fresh_state, tmp_path) -> None:
    if cpu_native._compiler() is None:
        pytest.skip("no C compiler on this machine")
    assert cpu_native.available() and cpu_native.unavailable_reason() is None
    built = list((tmp_path / "cache").glob("cpu_ops-*.so"))
    assert len(built) == 1
    stamp = built[0].stat().st_mtime_ns
    cpu_native._state.clear()  # a second process: finds the library, compiles nothing
    assert cpu_native.available() and built[0].stat().st_mtime_ns == stamp


def test_turned_off_or_unbuildable_means_the_torch_reference(fresh_state, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KVBENCH_KERNEL_BACKEND", raising=False)
    monkeypatch.setenv(cpu_native.ENV, "0")
    assert not cpu_native.available() and "KVBENCH_NATIVE_KERNELS=0" in cpu_native.unavailable_reason()
    assert kernels.resolve_backend(torch.device("cpu")) == "torch"
    monkeypatch.delenv(cpu_native.ENV)
    cpu_native._state.clear()
    monkeypatch.setenv("CC", "false")  # a compiler that always fails
    assert not cpu_native.available() and "could not build" in cpu_native.unavailable_reason()
    case = make_case([9, 30], 8, 1, 16, seed=2)
    query = torch.randn(2, 2, 16)
    args = (query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, 0.25)
    assert torch.equal(kernels.paged_decode_attention(*args, backend="native"),
                       reference.paged_decode_attention(*args))
    cpu_native._state.clear()
    monkeypatch.setenv("CC", "no-such-compiler-here")
    assert not cpu_native.available() and "no C compiler" in cpu_native.unavailable_reason()


@pytest.mark.parametrize("rows", [1, 5, 300])
def test_norm_silu_and_rotary_match_the_torch_ops(native, rows: int) -> None:
    import torch.nn.functional as F

    from kvbench.models.rope import apply_rotary

    gen = torch.Generator().manual_seed(rows)
    hidden, delta, weight = (torch.randn(rows, 72, generator=gen) * 3 for _ in range(3))
    weight = weight[0]
    torch.testing.assert_close(cpu_native.rms_norm(hidden, weight, 1e-5),
                               F.rms_norm(hidden, (72,), weight, 1e-5), rtol=1e-5, atol=1e-5)
    updated = hidden.clone()
    normed = cpu_native.add_rms_norm_(updated, delta, weight, 1e-6)
    torch.testing.assert_close(updated, hidden + delta, rtol=0, atol=0)
    torch.testing.assert_close(normed, F.rms_norm(hidden + delta, (72,), weight, 1e-6), rtol=1e-5, atol=1e-5)
    gate_up = torch.randn(rows, 2 * 40, generator=gen) * 6  # large |x| too: exp(-|x|) must not overflow
    gate_up[0, :4] = torch.tensor([0.0, -100.0, 100.0, -0.0])
    gate, up = gate_up.chunk(2, dim=-1)
    torch.testing.assert_close(cpu_native.silu_and_mul(gate_up), F.silu(gate) * up, rtol=1e-5, atol=1e-6)
    qkv = torch.randn(rows, 4 + 2 * 2, 16, generator=gen)
    cos, signed_sin = torch.randn(rows, 16, generator=gen), torch.randn(rows, 16, generator=gen)
    rotated = qkv.clone()
    cpu_native.rotary_(rotated, 6, cos, signed_sin)
    torch.testing.assert_close(rotated[:, :6], apply_rotary(qkv[:, :6], cos, signed_sin), rtol=1e-5, atol=1e-6)
    assert torch.equal(rotated[:, 6:], qkv[:, 6:])  # v is left as it was


def test_model_ops_refuse_what_they_cannot_take(native) -> None:
    with pytest.raises(ValueError, match="contiguous float32"):
        cpu_native.silu_and_mul(torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous float32"):
        cpu_native.rms_norm(torch.randn(8, 4).t(), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="do not fit"):
        cpu_native.rotary_(torch.randn(3, 4, 16), 2, torch.randn(2, 16), torch.randn(2, 16))


def test_the_runner_uses_them_on_one_thread_only(native) -> None:
    assert cpu_native.use_for_model_ops(torch.device("cpu"), torch.float32, 64)
    assert not cpu_native.use_for_model_ops(torch.device("cpu"), torch.bfloat16, 64)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert not cpu_native.use_for_model_ops(torch.device("cpu"), torch.float32, 64)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("head_dim", [64, 128, 96])  # the register-blocked shapes, and one the generic loops take
@pytest.mark.parametrize("group", [1, 2, 3, 4, 8, 9])  # up to 8 register-blocked, 9 generic
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_every_decode_path_matches_sdpa(native, head_dim: int, group: int, block_size: int) -> None:
    lens = [0, 1, 15, 16, 17, 130]
    case = make_case(lens, block_size, num_kv_heads=2, head_dim=head_dim, seed=head_dim + group + block_size)
    query = torch.randn(len(lens), 2 * group, head_dim, generator=torch.Generator().manual_seed(group))
    got = cpu_native.paged_decode_attention(query, case.k_cache, case.v_cache, case.block_tables,
                                            case.context_lens, SCALE)
    assert rel_error(got, decode_oracle(case, query, SCALE)) < 1e-5


def test_write_kv_matches_the_reference_and_skips_padding(native) -> None:
    from kvbench import kernels

    gen = torch.Generator().manual_seed(8)
    fused = torch.randn(5, 4 + 2 * 2, 16, generator=gen)  # [T, Hq + 2 Hkv, D]: k and v are strided views
    key, value = fused[:, 4:6], fused[:, 6:]
    slots = torch.tensor([3, 17, -1, 40, 0])
    pools = [torch.zeros(6, 8, 2, 16) for _ in range(4)]
    kernels.write_kv(key, value, pools[0], pools[1], slots, backend="native")
    reference.write_kv(key, value, pools[2], pools[3], slots)
    assert torch.equal(pools[0], pools[2]) and torch.equal(pools[1], pools[3])
    assert pools[0].view(-1, 2, 16)[17].equal(key[1]) and pools[0].abs().sum() > 0
    with pytest.raises(ValueError, match="do not fit"):
        cpu_native.write_kv(key, value, pools[0], pools[1], slots[:3])
