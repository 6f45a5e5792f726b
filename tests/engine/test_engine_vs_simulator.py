"""The tensor engine and the simulator run the same scheduler: on the same workload they take the same steps
and see the same pool (the last step of a finishing request included)."""

from __future__ import annotations

import pytest

from kvbench.engine.config import EngineConfig
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import Request
from kvbench.engine.simulator import simulate
from kvbench.engine.timing import UniformTiming
from kvbench.models.hf_model import build_random_model
from kvbench.models.shapes import MODEL_PRESETS
from kvbench.studies.backends import token_requests


@pytest.fixture(scope="module")
def model():
    return build_random_model(MODEL_PRESETS["tiny"], seed=0)


@pytest.mark.parametrize("engine, blocks", [("paged", 40), ("paged", 7), ("contiguous", 40)])
def test_engine_and_simulator_agree_step_by_step(model, engine, blocks):
    pairs = [(8, 1), (8, 3), (5, 7), (12, 4), (3, 9)]
    config = EngineConfig(engine=engine, block_size=4, num_blocks=blocks, max_len=32, reserve="pow2")
    result = LLMEngine(model, config).run(token_requests(pairs, 512, 0), concurrency=3)
    simulated = simulate([Request(i, p, o) for i, (p, o) in enumerate(pairs)], config.build_manager(),
                         UniformTiming(1.0), 3, config)
    assert result.accountant.steps == simulated.accountant.steps
    assert result.accountant.peak == simulated.accountant.peak
    assert result.accountant.peak_allocated == simulated.accountant.peak_allocated
    assert result.num_preemptions == simulated.num_preemptions
    assert [r.final_kv_len for r in result.requests] == [r.final_kv_len for r in simulated.requests]
    if blocks == 7:
        assert result.num_preemptions > 0
