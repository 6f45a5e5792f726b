"""The capacity study against hand arithmetic: strategies' holdings, windowed layers, vLLM's start-up figures, the
longest context, the scheduler's cap, and the reasons a model does not fit."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.models.deployment import StageBudget, StageShare
from kvbench.models.gpus import GIB
from kvbench.results.capacity_result import StrategyRow
from kvbench.studies.capacity import (
    CapacitySettings,
    Strategy,
    concurrency_at,
    longest_context,
    run_capacity_study,
    strategy_rows,
)

PUBLISHED = Path(__file__).parents[1] / "models" / "data" / "published"


def stage(
    kv_bytes: int, layers: int = 1, window_layers: int = 0, window: int | None = None, token_bytes: int = 1
) -> StageBudget:
    share = StageShare(0, range(layers + window_layers), 0, 0, layers, window_layers, window, token_bytes)
    return StageBudget(share, kv_bytes, kv_bytes, kv_bytes)


def rows(stages, **settings) -> dict[str, StrategyRow]:
    settings = CapacitySettings(**{"max_len": 2048, "mean_len": 500, "block_sizes": (16, 32), **settings})
    return {row.strategy: row for row in strategy_rows(stages, settings, context_limit=4096)}


def test_strategies_by_hand():
    # a pool of 10,000 token slots (one layer, one byte per token), requests of 500 tokens, max-len 2,048
    table = rows([stage(10_000)])
    assert list(table) == ["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged-16", "paged-32"]
    assert {n: r.slots_per_request for n, r in table.items()} == {
        "contiguous-max": 2048,
        "contiguous-pow2": 512,
        "contiguous-oracle": 500,
        "paged-16": 512,
        "paged-32": 512,
    }
    assert {n: r.max_concurrency for n, r in table.items()} == {
        "contiguous-max": 4,
        "contiguous-pow2": 19,
        "contiguous-oracle": 20,
        "paged-16": 19,
        "paged-32": 19,
    }
    assert table["contiguous-max"].token_state_pct_at_capacity == pytest.approx(100 * 4 * 500 / 10_000)
    assert table["contiguous-oracle"].token_state_pct_at_capacity == 100.0
    # at max-len every strategy holds 2,048 slots: 4 requests (4.88x); paged-32 uses 9,984 of the 10,000 slots
    assert {r.max_concurrency_at_max_len for r in table.values()} == {4}
    assert table["contiguous-max"].concurrency_ratio_at_max_len == pytest.approx(10_000 / 2048)
    assert table["paged-32"].kv_blocks == 312 and table["paged-32"].kv_cache_tokens == 9984
    assert table["paged-32"].concurrency_ratio_at_max_len == pytest.approx(312 / 64)
    odd = rows([stage(10_000)], mean_len=100, block_sizes=(16,))
    assert odd["paged-16"].slots_per_request == 112 and odd["contiguous-pow2"].slots_per_request == 128


def test_windowed_layers_hold_at_most_the_window():
    # one full layer and three windowed at 64 tokens; a request of 200 tokens
    pool = [stage(100_000, layers=1, window_layers=3, window=64)]
    oracle, paged = Strategy("contiguous-oracle"), Strategy("paged-16", 16)
    assert oracle.request_bytes(pool[0], 200, 2048) == 200 + 3 * 64
    # paged: 13 blocks in the full layer; a windowed layer keeps ceil(64 / 16) + 1 = 5 blocks once past the window
    assert paged.request_bytes(pool[0], 200, 2048) == 13 * 16 + 3 * 5 * 16
    assert paged.request_bytes(pool[0], 40, 2048) == 48 + 3 * 48  # under the window: as a full layer
    assert Strategy("contiguous-max").request_bytes(pool[0], 200, 2048) == 2048 + 3 * 64
    assert concurrency_at(oracle, pool, 200, 2048) == 100_000 // 392


def test_longest_context_at_a_concurrency():
    pool = [stage(10_000)]
    assert longest_context(Strategy("contiguous-oracle"), pool, 4, limit=100_000) == 2500
    assert longest_context(Strategy("paged-16", 16), pool, 4, limit=100_000) == 2496  # whole blocks of 16
    assert longest_context(Strategy("contiguous-oracle"), pool, 1, limit=4096) == 4096  # the model's limit
    windowed = [stage(10_000, layers=1, window_layers=1, window=100)]
    assert longest_context(Strategy("contiguous-oracle"), windowed, 2, limit=100_000) == 4900  # 2 x (L + 100)


def test_max_num_seqs_caps_the_concurrency():
    table = rows([stage(10_000)], max_num_seqs=10)
    assert table["contiguous-oracle"].max_concurrency == 10 and table["contiguous-oracle"].kv_max_concurrency == 20
    assert table["contiguous-oracle"].limited_by == "max_num_seqs"
    assert table["contiguous-max"].max_concurrency == 4 and table["contiguous-max"].limited_by == "kv_cache"


def test_vllm_cpu_figures_from_arithmetic():
    """vLLM CPU logs "CPU KV cache size: 23,296 tokens, Maximum concurrency for 1,024 tokens per request: 22.75x"
    for SmolLM2-135M in fp32 with VLLM_CPU_KVCACHE_SPACE=1 (GiB) and 128-token blocks:
    2 x 30 layers x 3 KV heads x 64 x 4 B = 46,080 B per token; a block 5,898,240 B; 1 GiB holds 182 blocks
    = 23,296 tokens; a 1,024-token request takes 8 blocks: 182 / 8 = 22.75."""
    settings = CapacitySettings(
        model=str(PUBLISHED / "smollm2-135m.json"), kv_cache_memory=GIB, max_len=1024, mean_len=500, block_sizes=(128,)
    )
    result = run_capacity_study(settings)
    assert result.bytes_per_token == 46_080 and result.model.facts.dtype == "fp32"
    (paged,) = [row for row in result.strategies if row.strategy == "paged-128"]
    assert paged.kv_blocks == 182 and paged.kv_cache_tokens == 23_296
    assert paged.concurrency_ratio_at_max_len == 22.75 and paged.max_concurrency_at_max_len == 22


def test_tensor_parallelism_and_fp8_kv_raise_the_concurrency():
    base = dict(model=str(PUBLISHED / "llama-3.1-70b-instruct.json"), gpu="h100-80g", max_len=8192, mean_len=1000)
    alone = run_capacity_study(CapacitySettings(**base, tensor_parallel=4))
    fp8 = run_capacity_study(CapacitySettings(**base, tensor_parallel=4, kv_cache_dtype="fp8"))
    assert alone.kv_bytes_per_token_per_gpu == 81_920 and fp8.kv_bytes_per_token_per_gpu == 40_960
    assert fp8.kv_budget_bytes == alone.kv_budget_bytes
    slots = alone.kv_budget_bytes // 81_920
    assert alone.kv_token_slots == slots and fp8.kv_token_slots == alone.kv_budget_bytes // 40_960
    oracle = {r.strategy: r for r in alone.strategies}["contiguous-oracle"]
    assert oracle.max_concurrency == slots // 1000


def test_weights_that_do_not_fit_say_by_how_much_and_what_would():
    settings = CapacitySettings(model=str(PUBLISHED / "llama-3.1-70b-instruct.json"), gpu="h100-80g")
    result = run_capacity_study(settings)
    (reason,) = result.reasons
    usable = int(0.9 * 80 * GIB)
    need = result.weight_bytes_per_gpu + result.activation_reserve_bytes
    assert not result.fits and reason.kind == "weights" and result.strategies == []
    assert reason.short_bytes == need - usable and reason.usable_bytes == usable
    assert reason.smallest_fitting_tensor_parallel_size == 2
    assert (
        reason.message.startswith("weights 131.42 GiB + activations")
        and "exceed the usable 72.00 GiB" in reason.message
    )


def test_a_max_len_the_kv_budget_cannot_hold():
    # Llama-3.1-8B bf16 on a 24 GiB card: weights 14.96 GiB leave ~6.2 GiB of KV; 131,072 tokens need 16 GiB
    settings = CapacitySettings(
        model=str(PUBLISHED / "llama-3.1-8b-instruct.json"), gpu="rtx4090-24g", max_len=131_072, mean_len=1000
    )
    result = run_capacity_study(settings)
    (reason,) = result.reasons
    budget = result.kv_budget_bytes
    assert reason.kind == "max_len" and reason.request_bytes == 131_072 * 131_072
    assert reason.longest_context == budget // 131_072
    assert not result.fits and result.strategies  # the table is still there
    # on two cards each keeps half the weights (7.5 GiB) and half the KV heads: 131,072 x 65,536 B = 8 GiB fits
    assert reason.smallest_fitting_tensor_parallel_size == 2
