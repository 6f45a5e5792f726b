"""One EngineConfig, three paths: `waste`, `sweep --simulate` and the tensor engine schedule a seeded workload
identically (the same steps, peaks, preemptions and final lengths)."""

from __future__ import annotations

import pytest

from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import Request
from kvbench.engine.timing import UniformTiming
from kvbench.models.gpus import resolve_gpu
from kvbench.models.hf_model import build_random_model
from kvbench.models.shapes import MODEL_PRESETS
from kvbench.studies.backends.simulated import SimulatedBackend
from kvbench.studies.run_requests import token_requests
from kvbench.studies.waste import Strategy, run_strategy
from kvbench.workload.lengths import LengthSpec

MAX_LEN = 48
CONCURRENCY = 4


@pytest.fixture(scope="module")
def model():
    return build_random_model(MODEL_PRESETS["tiny"], seed=0)


@pytest.mark.parametrize(
    "strategy, pool_slots",
    [
        (Strategy("paged-4", "paged", 4), 64),  # tight: requests are preempted and recomputed
        (Strategy("paged-4", "paged", 4), 400),
        (Strategy("contiguous-max", "contiguous", 1, "max"), 160),  # room for three max-len slabs: queueing
        (Strategy("contiguous-pow2", "contiguous", 1, "pow2"), 160),
    ],
)
def test_waste_simulated_sweep_and_tensor_engine_schedule_alike(model, strategy, pool_slots):
    pairs = LengthSpec(mean_len=20, max_len=MAX_LEN, distribution="uniform", sigma=0.8).sample(14, seed=5)
    config = strategy.config(pool_slots, MAX_LEN, CONCURRENCY)
    waste = run_strategy(strategy, pairs, pool_slots, MAX_LEN, CONCURRENCY, UniformTiming(), keep_timeline=True)
    backend = SimulatedBackend(MODEL_PRESETS["llama-2-13b"], resolve_gpu("a100-80g"), config)
    simulated, _ = backend.run(config.engine, [Request(i, p, o) for i, (p, o) in enumerate(pairs)], CONCURRENCY, None)
    tensor = LLMEngine(model, config).run(token_requests(pairs, 512, seed=0), CONCURRENCY)
    for other in (simulated, tensor):
        assert other.accountant.steps == waste.accountant.steps
        assert other.accountant.peak == waste.accountant.peak
        assert other.accountant.peak_allocated == waste.accountant.peak_allocated
        assert other.num_preemptions == waste.num_preemptions
        assert other.peak_running == waste.peak_running
        assert [r.final_kv_len for r in other.requests] == [r.final_kv_len for r in waste.requests]
    if pool_slots == 64:
        assert waste.num_preemptions > 0  # the tight pool really exercises preemption
