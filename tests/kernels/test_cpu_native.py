"""The CPU's C kernels (float32 and bfloat16, every instruction-set variant this CPU runs) against contiguous SDPA,
the torch ops and the torch reference; building, caching and fallbacks.

Tests taking ``variant`` run once per build variant: ``native`` (what this CPU gets) and each narrower one of
``KVBENCH_CPU_ISA`` it can run (AVX-512 with BF16, without, AVX2), so the paths of other CPUs are checked here too.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from isa_variants import runnable_variants
from kv_cases import decode_oracle, make_case, poisoned_like, prefill_oracle, query_start_loc, rel_error

from kvbench import kernels
from kvbench.errors import KvbenchError
from kvbench.kernels import cpu_native, reference

LENS = [1, 15, 16, 17, 300]
SCALE = 0.17
BF16_UNIT = 2.0**-8  # bfloat16's unit roundoff (8 significant bits)


@pytest.fixture
def native() -> None:
    if not cpu_native.available():
        pytest.skip(f"CPU kernels unavailable here: {cpu_native.unavailable_reason()}")


VARIANTS = runnable_variants()


@pytest.fixture(params=VARIANTS)
def variant(request, monkeypatch: pytest.MonkeyPatch) -> str:
    """The C kernels built for one instruction-set variant (cached like any build), loaded afresh."""
    monkeypatch.setattr(cpu_native, "_state", {})
    monkeypatch.setenv(cpu_native.ISA_ENV, request.param)
    if not cpu_native.available():
        pytest.skip(f"CPU kernels unavailable here: {cpu_native.unavailable_reason()}")
    return request.param


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
    result = cpu_native.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE, out=out
    )
    assert result is out
    assert rel_error(out, decode_oracle(case, query, SCALE)) < 1e-5


def test_strided_query_empty_context_and_head_dim_64(native) -> None:
    """The runner hands over q as a view of the fused q/k/v projection; a request may have no context."""
    lens = [0, 40, 129]
    case = make_case(lens, 16, num_kv_heads=3, head_dim=64, seed=4)
    fused = torch.randn(len(lens), 9 + 2 * 3, 64, generator=torch.Generator().manual_seed(5))
    query = fused[:, :9]
    assert not query.is_contiguous()
    got = cpu_native.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE
    )
    torch.testing.assert_close(
        got,
        reference.paged_decode_attention(
            query.contiguous(), case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE
        ),
        rtol=1e-5,
        atol=1e-6,
    )
    assert torch.equal(got[0], torch.zeros_like(got[0]))


def test_tables_too_narrow_for_the_context_are_refused(native) -> None:
    case = make_case([20, 40], 8, num_kv_heads=1, head_dim=16, seed=6)
    query = torch.randn(2, 2, 16)
    with pytest.raises(ValueError, match="covering 40 tokens"):
        cpu_native.paged_decode_attention(
            query, case.k_cache, case.v_cache, case.block_tables[:, :2], case.context_lens, SCALE
        )


def test_dispatch_runs_it_for_float32_and_the_reference_otherwise(native) -> None:
    """float32 (and bfloat16, below) run in C; float16 is not a dtype the C kernel takes: the reference plans."""
    case = make_case([9, 30], 8, 1, 16, seed=2)
    query = torch.randn(2, 2, 16)
    args = (query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, 0.25)
    torch.testing.assert_close(
        kernels.paged_decode_attention(*args, backend="native", max_context_len=30),
        kernels.paged_decode_attention(*args, backend="torch"),
        rtol=1e-5,
        atol=1e-6,
    )
    assert kernels.plan_decode(case.block_tables, case.context_lens, case.k_cache, "native") is None
    half = case.k_cache.to(torch.float16)  # not a dtype the C kernel takes: the reference plans and runs
    assert isinstance(kernels.plan_decode(case.block_tables, case.context_lens, half, "native"), reference.DecodePlan)


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
    assert torch.equal(kernels.paged_decode_attention(*args, backend="native"), reference.paged_decode_attention(*args))
    cpu_native._state.clear()
    monkeypatch.setenv("CC", "no-such-compiler-here")
    assert not cpu_native.available() and "no C compiler" in cpu_native.unavailable_reason()


@pytest.mark.parametrize("rows", [1, 5, 300])
def test_norm_silu_and_rotary_match_the_torch_ops(variant, rows: int) -> None:
    import torch.nn.functional as F

    from kvbench.models.rope import apply_rotary

    gen = torch.Generator().manual_seed(rows)
    hidden, delta, weight = (torch.randn(rows, 72, generator=gen) * 3 for _ in range(3))
    weight = weight[0]
    torch.testing.assert_close(
        cpu_native.rms_norm(hidden, weight, 1e-5), F.rms_norm(hidden, (72,), weight, 1e-5), rtol=1e-5, atol=1e-5
    )
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


@pytest.mark.parametrize("rows", [1, 5, 300])
def test_bf16_norm_silu_and_rotary_are_the_float32_results_rounded_once(variant, rows: int) -> None:
    """bfloat16 in and out, float32 inside: each output is the float32 computation on the same bfloat16 inputs,
    rounded once (the residual sum, kept in bfloat16 as torch's add keeps it, rounded first)."""
    from kvbench.models.rope import apply_rotary

    gen = torch.Generator().manual_seed(rows)
    hidden, delta, weight = ((torch.randn(rows, 72, generator=gen) * 3).bfloat16() for _ in range(3))
    weight = weight[0]

    def close(got: torch.Tensor, want: torch.Tensor) -> None:  # want: float32, to be rounded once
        assert got.dtype == torch.bfloat16
        normal = want.abs() > 1e-30  # exp's cut-off at -87 leaves silu(-100) at 1e-35, not torch's 1e-42
        assert (got == want.bfloat16())[normal].float().mean() > 0.99  # sums may differ by a last bit: rarely
        torch.testing.assert_close(got.float(), want, rtol=2 * BF16_UNIT, atol=1e-6)

    close(cpu_native.rms_norm(hidden, weight, 1e-5), F.rms_norm(hidden.float(), (72,), weight.float(), 1e-5))
    updated = hidden.clone()
    normed = cpu_native.add_rms_norm_(updated, delta, weight, 1e-6)
    assert torch.equal(updated, hidden + delta)  # torch's bfloat16 add: the exact sum rounded once
    close(normed, F.rms_norm((hidden + delta).float(), (72,), weight.float(), 1e-6))
    gate_up = (torch.randn(rows, 2 * 40, generator=gen) * 6).bfloat16()
    gate_up[0, :4] = torch.tensor([0.0, -100.0, 100.0, -0.0])
    gate, up = gate_up.float().chunk(2, dim=-1)
    close(cpu_native.silu_and_mul(gate_up), F.silu(gate) * up)
    qkv = torch.randn(rows, 4 + 2 * 2, 16, generator=gen).bfloat16()
    cos, signed_sin = (torch.randn(rows, 16, generator=gen).bfloat16() for _ in range(2))
    rotated = qkv.clone()
    cpu_native.rotary_(rotated, 6, cos, signed_sin)
    close(rotated[:, :6], apply_rotary(qkv[:, :6].float(), cos.float(), signed_sin.float()))
    assert torch.equal(rotated[:, 6:], qkv[:, 6:])


def test_model_ops_refuse_what_they_cannot_take(native) -> None:
    with pytest.raises(ValueError, match="contiguous float32 or bfloat16"):
        cpu_native.silu_and_mul(torch.randn(4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="contiguous float32 or bfloat16"):
        cpu_native.rms_norm(torch.randn(8, 4).t(), torch.ones(8), 1e-5)
    with pytest.raises(ValueError, match="one dtype"):
        cpu_native.rms_norm(torch.randn(8, 4).bfloat16(), torch.ones(4), 1e-5)
    with pytest.raises(ValueError, match="do not fit"):
        cpu_native.rotary_(torch.randn(3, 4, 16), 2, torch.randn(2, 16), torch.randn(2, 16))


def test_the_runner_uses_them_on_one_thread_only(native) -> None:
    assert cpu_native.use_for_model_ops(torch.device("cpu"), torch.float32, 64)
    assert cpu_native.use_for_model_ops(torch.device("cpu"), torch.bfloat16, 64)
    assert not cpu_native.use_for_model_ops(torch.device("cpu"), torch.float16, 64)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        assert not cpu_native.use_for_model_ops(torch.device("cpu"), torch.float32, 64)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("head_dim", [64, 128, 96])  # the register-blocked shapes, and one the generic loops take
@pytest.mark.parametrize("group", [1, 2, 3, 4, 8, 9])  # up to 8 register-blocked, 9 generic
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_every_decode_path_matches_sdpa(variant, head_dim: int, group: int, block_size: int) -> None:
    lens = [0, 1, 15, 16, 17, 130]
    case = make_case(lens, block_size, num_kv_heads=2, head_dim=head_dim, seed=head_dim + group + block_size)
    query = torch.randn(len(lens), 2 * group, head_dim, generator=torch.Generator().manual_seed(group))
    got = cpu_native.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE
    )
    assert rel_error(got, decode_oracle(case, query, SCALE)) < 1e-5


@pytest.mark.parametrize("head_dim", [64, 128, 96])
@pytest.mark.parametrize("group", [1, 3, 8, 9])
@pytest.mark.parametrize("block_size", [1, 16])
def test_bf16_decode_is_the_exact_attention_rounded_once(variant, head_dim: int, group: int, block_size: int) -> None:
    """bfloat16 q, K and V: float32 inside (vdpbf16ps where built for it), each output rounded to bfloat16 once, so
    nearly every value equals the float64 attention of the same bfloat16 inputs, rounded; none is off by more than
    the rounding plus float32's sums."""
    lens = [0, 1, 17, 130]
    case = make_case(
        lens, block_size, num_kv_heads=2, head_dim=head_dim, seed=head_dim + group + block_size, dtype=torch.bfloat16
    )
    fused = torch.randn(len(lens), 2 * group + 4, head_dim, generator=torch.Generator().manual_seed(group))
    query = fused.bfloat16()[:, : 2 * group]  # a strided view, as the runner's q is
    out = poisoned_like(torch.empty(len(lens), 2 * group, head_dim, dtype=torch.bfloat16))
    got = cpu_native.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE, out=out
    )
    assert got is out and got.dtype == torch.bfloat16
    exact = decode_oracle(case, query, SCALE)
    assert rel_error(got, exact) < 2 * BF16_UNIT
    assert (got == exact.bfloat16()).float().mean() > 0.97  # rounded once, not twice: almost all equal
    assert torch.equal(got[0], torch.zeros_like(got[0]))


PREFILL_LENS, PREFILL_Q_LENS = [40, 3, 64, 17, 9, 130], [40, 1, 8, 2, 9, 37]  # whole prompts, chunks after a prefix


@pytest.mark.parametrize("head_dim", [16, 64, 128, 80])
@pytest.mark.parametrize("group", [1, 3, 8])
@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_prefill_matches_sdpa(variant, head_dim: int, group: int, block_size: int, dtype: torch.dtype) -> None:
    """New tokens attend causally to the cached context and themselves, K/V read in place through the table; in
    bfloat16, float32 inside with each output rounded once."""
    case = make_case(PREFILL_LENS, block_size, num_kv_heads=2, head_dim=head_dim, seed=head_dim + group, dtype=dtype)
    tokens = sum(PREFILL_Q_LENS)
    fused = torch.randn(tokens, 2 * group + 4, head_dim, generator=torch.Generator().manual_seed(group)).to(dtype)
    query = fused[:, : 2 * group]  # a strided view, as the runner's q is
    out = poisoned_like(torch.empty(tokens, 2 * group, head_dim, dtype=dtype))
    got = cpu_native.paged_prefill_attention(
        query,
        case.k_cache,
        case.v_cache,
        case.block_tables,
        query_start_loc(PREFILL_Q_LENS),
        case.context_lens,
        SCALE,
        out=out,
    )
    assert got is out and got.dtype == dtype
    exact = prefill_oracle(case, query, PREFILL_Q_LENS, SCALE)
    if dtype == torch.float32:
        assert rel_error(got, exact) < 1e-5
    else:
        assert rel_error(got, exact) < 2 * BF16_UNIT
        assert (got == exact.bfloat16()).float().mean() > 0.97


def test_prefill_dispatch_plans_nothing_and_refuses_what_it_cannot_take(variant) -> None:
    case = make_case(PREFILL_LENS, 16, num_kv_heads=2, head_dim=64, seed=1)
    query = torch.randn(sum(PREFILL_Q_LENS), 4, 64)
    starts = query_start_loc(PREFILL_Q_LENS)
    assert kernels.plan_prefill(case.block_tables, starts, case.context_lens, case.k_cache, 4, "native") is None
    args = (query, case.k_cache, case.v_cache, case.block_tables, starts, case.context_lens, SCALE)
    torch.testing.assert_close(
        kernels.paged_prefill_attention(*args, backend="native"),
        kernels.paged_prefill_attention(*args, backend="torch"),
        rtol=1e-5,
        atol=1e-6,
    )
    odd = make_case([5], 4, num_kv_heads=1, head_dim=24, seed=2)  # head_dim 24: not a multiple of 16
    assert not cpu_native.takes_prefill(odd.k_cache)
    assert (
        kernels.plan_prefill(odd.block_tables, query_start_loc([5]), odd.context_lens, odd.k_cache, 2, "native")
        is not None
    )  # the reference plans and runs it
    with pytest.raises(ValueError, match="multiple of 16"):
        cpu_native.paged_prefill_attention(
            torch.randn(5, 2, 24),
            odd.k_cache,
            odd.v_cache,
            odd.block_tables,
            query_start_loc([5]),
            odd.context_lens,
            SCALE,
        )
    with pytest.raises(ValueError, match="query starts"):
        cpu_native.paged_prefill_attention(query[:-1], *args[1:])


def test_bf16_dispatch_and_write_kv(variant) -> None:
    case = make_case([9, 30], 8, 2, 64, seed=3, dtype=torch.bfloat16)
    query = torch.randn(2, 6, 64).bfloat16()
    args = (query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, 0.125)
    assert kernels.plan_decode(case.block_tables, case.context_lens, case.k_cache, "native") is None
    native_out = kernels.paged_decode_attention(*args, backend="native", max_context_len=30)
    torch_out = kernels.paged_decode_attention(*args, backend="torch")
    assert native_out.dtype == torch.bfloat16
    torch.testing.assert_close(native_out.float(), torch_out.float(), rtol=0, atol=4 * BF16_UNIT)
    fused = torch.randn(5, 6 + 2 * 2, 64).bfloat16()
    key, value = fused[:, 6:8], fused[:, 8:]
    slots = torch.tensor([3, 17, -1, 40, 0])
    pools = [torch.zeros(6, 8, 2, 64, dtype=torch.bfloat16) for _ in range(4)]
    kernels.write_kv(key, value, pools[0], pools[1], slots, backend="native")
    reference.write_kv(key, value, pools[2], pools[3], slots)
    assert torch.equal(pools[0], pools[2]) and torch.equal(pools[1], pools[3]) and pools[0].abs().sum() > 0


def test_write_kv_matches_the_reference_and_skips_padding(variant) -> None:
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


def test_each_variant_is_built_for_what_it_names(variant) -> None:
    sets = cpu_native.instruction_sets()
    expected = {"avx2": ["AVX2"], "avx512": ["AVX2", "AVX-512"], "avx512bf16": ["AVX2", "AVX-512", ISA_BF16]}
    if variant in expected:
        assert sets == expected[variant]
    assert cpu_native.build_description().startswith(f"C kernels built for {variant}: ")


def test_a_variant_this_cpu_cannot_run_or_an_unknown_one_is_refused(fresh_state, monkeypatch) -> None:
    monkeypatch.setenv(cpu_native.ISA_ENV, "avx9000")  # the user's typo: an error, never a silent fall-back
    with pytest.raises(KvbenchError, match="unknown KVBENCH_CPU_ISA='avx9000'"):
        cpu_native.available()
    cpu_native._state.clear()
    monkeypatch.setenv(cpu_native.ISA_ENV, "avx512bf16")
    monkeypatch.setattr(cpu_native, "_cpu_flags", lambda: {"avx2", "fma", "bmi2"})
    monkeypatch.setattr(cpu_native.platform, "machine", lambda: "x86_64")
    assert not cpu_native.available()
    assert "needs avx512f, avx512bw, avx512dq, avx512vl, avx512_bf16" in cpu_native.unavailable_reason()
    assert cpu_native.build_description().startswith("C kernels unavailable (")


# -- the build cache: nothing another user could plant is loaded -------------------------------------------------
# These tests build a stand-in source (every entry point, doing nothing) instead of the kernels: the cache's checks
# do not depend on what the library computes, and a stand-in builds in milliseconds where the kernels take seconds.
ISA_BF16 = "AVX-512 BF16 (vdpbf16ps)"


@pytest.fixture
def stub(fresh_state, tmp_path, monkeypatch: pytest.MonkeyPatch):
    """Builds of a stand-in library into a fresh cache: returns (library, digest file, folder) after the first."""
    if cpu_native._compiler() is None:
        pytest.skip("no C compiler on this machine")
    source = tmp_path / "stub.c"
    source.write_text("".join(f"int {name}(void) {{ return 0; }}\n" for name in cpu_native.SIGNATURES))
    monkeypatch.setattr(cpu_native, "SOURCES", (source,))
    monkeypatch.setattr(cpu_native, "FLAGS", ("-O0", "-fPIC", "-shared"))
    assert cpu_native.available(), cpu_native.unavailable_reason()
    folder = tmp_path / "cache"
    (library,) = folder.glob("cpu_ops-*.so")
    return library, library.with_suffix(".sha256"), folder


def _reload() -> None:
    """What a second process does: load from the cache."""
    cpu_native._state.clear()


def test_the_cache_folder_is_private_and_the_digest_is_recorded(stub) -> None:
    import hashlib
    import stat

    library, digest, folder = stub
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(library.stat().st_mode) & 0o022 == 0
    assert digest.read_text().strip() == hashlib.sha256(library.read_bytes()).hexdigest()
    stamp = library.stat().st_mtime_ns
    _reload()
    assert cpu_native.available() and library.stat().st_mtime_ns == stamp  # verified and loaded, not rebuilt


@pytest.mark.parametrize("planted", ["garbage", "garbage with its digest", "another library", "no digest"])
def test_a_library_that_is_not_what_was_built_is_rebuilt_with_a_note(stub, tmp_path, capsys, planted: str) -> None:
    import hashlib
    import subprocess

    library, digest, _ = stub
    good = library.read_bytes()
    if planted.startswith("garbage"):
        library.write_bytes(b"\x7fELF not really a library")
        if planted == "garbage with its digest":  # the digest matches, the load fails: still no traceback
            digest.write_text(hashlib.sha256(library.read_bytes()).hexdigest())
    elif planted == "another library":  # a real shared library, without kvbench's entry points
        source = tmp_path / "other.c"
        source.write_text("int other(void) { return 1; }\n")
        subprocess.run([cpu_native._compiler(), "-shared", "-fPIC", "-o", str(library), str(source)], check=True)
        digest.write_text(hashlib.sha256(library.read_bytes()).hexdigest())
    else:
        digest.unlink()
    capsys.readouterr()
    _reload()
    assert cpu_native.available(), cpu_native.unavailable_reason()
    note = capsys.readouterr().err.strip().splitlines()
    assert len(note) == 1 and note[0].startswith("kvbench: note: rebuilding the CPU kernels: ")
    assert library.read_bytes() == good


def test_a_library_others_may_write_or_a_link_is_not_loaded(stub, tmp_path, capsys) -> None:
    import hashlib

    library, digest, _ = stub
    library.chmod(0o666)  # anyone could have changed it since its digest was recorded
    _reload()
    assert cpu_native.available()
    assert "may be written by other users" in capsys.readouterr().err
    assert library.stat().st_mode & 0o022 == 0  # replaced by a fresh build of our own
    target = tmp_path / "elsewhere.so"
    library.rename(target)
    library.symlink_to(target)
    digest.write_text(hashlib.sha256(target.read_bytes()).hexdigest())
    _reload()
    assert cpu_native.available()
    assert "not a regular file" in capsys.readouterr().err and not library.is_symlink()


def test_a_cache_folder_others_may_write_or_own_is_refused(stub, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvbench import private_cache

    library, _, folder = stub
    library.unlink()
    folder.chmod(0o777)
    _reload()
    assert not cpu_native.available()
    assert "may be written by other users" in cpu_native.unavailable_reason()
    assert kernels.resolve_backend(torch.device("cpu"), None) == "torch"  # the torch reference runs instead
    assert not library.exists()  # nothing was built into it
    folder.chmod(0o700)
    monkeypatch.setattr(private_cache, "current_owner", lambda: 4242)  # as if the folder were someone else's
    _reload()
    assert not cpu_native.available() and "not to this user (4242)" in cpu_native.unavailable_reason()
