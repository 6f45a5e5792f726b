"""The decode attention's prefetch: forced by the environment, else measured on this CPU, cached, and followed by
the runner; it changes the speed only, never a value."""

from __future__ import annotations

import pytest
import torch

from kvbench.cpu import decode_prefetch
from kvbench.cpu.decode_prefetch import CANDIDATES, ENV, TIE, choose, parse
from kvbench.errors import KvbenchError
from kvbench.kernels import cpu_native
from kvbench.kernels.cpu_native import DEFAULT_PREFETCH, DecodePrefetch

needs_kernels = pytest.mark.skipif(not cpu_native.available(), reason="the C kernels do not build here")


def test_parse_and_refuse():
    assert parse("off") == DecodePrefetch(0, 1)
    assert parse("16:L1") == DecodePrefetch(16, 1) and parse(" 32:l2 ") == DecodePrefetch(32, 2)
    for bad in ("", "16", "16:L3", "L1:16", "-4:L1", "1.5:L2", "on", "99999999999999999999:L1", "١٦:L1"):
        with pytest.raises(KvbenchError, match=ENV) as caught:
            parse(bad)
        assert "\n" not in str(caught.value)
    for ahead, level in ((-1, 1), (16, 0), (16, 3), (cpu_native.MAX_PREFETCH_AHEAD + 1, 2)):
        with pytest.raises(ValueError, match="a decode prefetch is"):
            DecodePrefetch(ahead, level)
    assert DecodePrefetch(0, 2).describe() == "off" and DecodePrefetch(32, 2).describe() == "32 tokens ahead into L2"


def test_the_environment_decides_before_any_measurement(monkeypatch):
    monkeypatch.setenv(ENV, "32:L2")
    monkeypatch.setattr(decode_prefetch, "_measure", lambda *a: pytest.fail("measured although forced"))
    choice = choose(4, 2, 64, 16, torch.float32)
    assert choice.prefetch == DecodePrefetch(32, 2) and choice.reason == f"set by {ENV}"
    assert choice.line() == f"decode attention prefetch: 32 tokens ahead into L2 (set by {ENV})"


def test_the_previous_setting_stays_unless_another_is_clearly_faster():
    def timings(**faster: float) -> dict[str, float]:
        base = {decode_prefetch._key(p): 100.0 for p in CANDIDATES}
        return {**base, **{key.replace("_", ":"): value for key, value in faster.items()}}

    assert decode_prefetch._decide(timings()) == DEFAULT_PREFETCH
    assert decode_prefetch._decide({**timings(), "32:L2": 100 / TIE + 0.5}) == DEFAULT_PREFETCH  # within the tie
    assert decode_prefetch._decide({**timings(), "32:L2": 80.0, "16:L2": 70.0}) == DecodePrefetch(16, 2)
    assert decode_prefetch._decide({**timings(), "0:L1": 50.0}) == DecodePrefetch(0, 1)  # none at all can win


@needs_kernels
def test_measured_on_a_pool_out_of_the_cache_then_cached(monkeypatch, tmp_path):
    monkeypatch.delenv(ENV, raising=False)
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(decode_prefetch, "last_level_cache_bytes", lambda: 1 << 20)  # a small probe pool
    pools = []
    probe = decode_prefetch._probe

    def spy(*args):
        made = probe(*args)
        pools.append(made)
        return made

    monkeypatch.setattr(decode_prefetch, "_probe", spy)
    first = choose(6, 2, 64, 16, torch.bfloat16)
    query, k_cache, v_cache, tables, lens = pools[0]
    assert k_cache.numel() * k_cache.element_size() * 2 <= 2 << 20  # twice the cache, K and V together
    assert sorted(tables.flatten().tolist()) == list(range(k_cache.shape[0]))  # every block once, scattered
    assert tables.flatten().tolist() != sorted(tables.flatten().tolist())
    assert query.dtype == k_cache.dtype == torch.bfloat16 and int(lens[0]) == decode_prefetch.CONTEXT
    assert first.prefetch in CANDIDATES and set(first.timings_us) == {decode_prefetch._key(p) for p in CANDIDATES}
    assert all(us > 0 for us in first.timings_us.values())
    assert "measured now" in first.reason and "16:L1" in first.reason and "off " in first.reason
    again = choose(6, 2, 64, 16, torch.bfloat16)
    assert len(pools) == 1 and "cached, measured" in again.reason
    assert again.prefetch == first.prefetch and again.timings_us == first.timings_us
    choose(6, 2, 64, 32, torch.bfloat16)  # another block size is another shape: measured
    assert len(pools) == 2


@needs_kernels
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_candidate_gives_the_same_values(dtype):
    """Prefetching reads ahead; it never changes what is computed (a context shorter than the distance too)."""
    generator = torch.Generator().manual_seed(1)
    blocks, block_size = 40, 4
    k_cache = torch.randn(blocks, block_size, 2, 64, generator=generator).to(dtype)
    v_cache = torch.randn(blocks, block_size, 2, 64, generator=generator).to(dtype)
    tables = torch.randperm(blocks, generator=generator).to(torch.int32).view(4, 10)
    lens = torch.tensor([40, 3, 17, 33], dtype=torch.int32)
    query = torch.randn(4, 6, 64, generator=generator).to(dtype)
    results = [
        cpu_native.paged_decode_attention(query, k_cache, v_cache, tables, lens, 0.125, prefetch=prefetch)
        for prefetch in (*CANDIDATES, DecodePrefetch(1, 2), DecodePrefetch(cpu_native.MAX_PREFETCH_AHEAD, 1))
    ]
    assert all(torch.equal(result, results[0]) for result in results[1:])


@needs_kernels
def test_the_runner_follows_the_choice_made_once_per_model(monkeypatch):
    from kvbench.models.hf_model import build_random_model
    from kvbench.models.runner import ModelRunner
    from kvbench.models.shapes import MODEL_PRESETS

    monkeypatch.setenv(ENV, "32:L2")
    model = build_random_model(MODEL_PRESETS["tiny"], seed=0)
    runner = ModelRunner(model, num_blocks=8, block_size=16, kernel_backend="native")
    assert runner.decode_prefetch is not None and runner._prefetch == DecodePrefetch(32, 2)
    monkeypatch.setenv(ENV, "off")  # the model keeps the choice made for this block size and dtype
    assert ModelRunner(model, num_blocks=8, block_size=16, kernel_backend="native")._prefetch == DecodePrefetch(32, 2)
    assert ModelRunner(model, num_blocks=8, block_size=8, kernel_backend="native")._prefetch == DecodePrefetch(0, 1)
    assert ModelRunner(model, num_blocks=8, block_size=16, kernel_backend="torch").decode_prefetch is None
