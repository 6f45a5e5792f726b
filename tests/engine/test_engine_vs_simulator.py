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
from kvbench.studies.run_requests import token_requests


@pytest.fixture(scope="module")
def model():
    return build_random_model(MODEL_PRESETS["tiny"], seed=0)


@pytest.mark.parametrize("engine, blocks", [("paged", 40), ("paged", 7), ("contiguous", 40)])
def test_engine_and_simulator_agree_step_by_step(model, engine, blocks):
    pairs = [(8, 1), (8, 3), (5, 7), (12, 4), (3, 9)]
    config = EngineConfig(engine=engine, block_size=4, num_blocks=blocks, max_len=32, reserve="pow2")
    result = LLMEngine(model, config).run(token_requests(pairs, 512, 0), 3)
    simulated = simulate(
        [Request(i, p, o) for i, (p, o) in enumerate(pairs)], config.build_manager(), UniformTiming(1.0), 3, config
    )
    assert result.accountant.steps == simulated.accountant.steps
    assert result.accountant.peak == simulated.accountant.peak
    assert result.accountant.peak_allocated == simulated.accountant.peak_allocated
    assert result.num_preemptions == simulated.num_preemptions
    assert [r.final_kv_len for r in result.requests] == [r.final_kv_len for r in simulated.requests]
    # the same steps: the full-load window holds the same tokens (its seconds differ: wall clock vs roofline)
    assert result.steady.output_tokens == simulated.steady.output_tokens > 0
    if blocks == 7:
        assert result.num_preemptions > 0


@pytest.mark.parametrize(
    "engine, blocks, reserve",
    [("paged", 40, "max"), ("paged", 9, "max"), ("contiguous", 40, "max"), ("contiguous", 40, "pow2")],
)
def test_eos_in_the_engine_is_eos_after_in_the_simulator(model, engine, blocks, reserve):
    """A request that stops at EOS in the tensor engine and one told its EOS in advance by the simulator (while
    reservations see max_tokens in both) take the same steps, hold the same memory and end at the same length."""
    from dataclasses import replace

    pairs = [(8, 20), (8, 20), (5, 23), (12, 16), (3, 25)]  # max_tokens fill max_len 28
    config = EngineConfig(engine=engine, block_size=4, num_blocks=blocks, max_len=28, reserve=reserve)
    probe = token_requests(pairs, 512, 0)
    LLMEngine(model, config).run(probe, 5)
    counts: dict[int, int] = {}
    for request in probe:
        for token in request.output_token_ids[1:-1]:
            counts[token] = counts.get(token, 0) + 1
    eos = max(counts, key=counts.get)  # a token the model emits mid-answer: some requests stop early
    requests = token_requests(pairs, 512, 0)
    for request in requests:
        request.sampling = replace(request.sampling, ignore_eos=False, eos_token_id=eos)
    result = LLMEngine(model, config).run(requests, 3)
    assert any(r.stop_reason == "eos" and r.num_outputs < r.max_tokens for r in result.requests)
    simulated = simulate(
        [
            Request(i, p, o, eos_after=r.num_outputs if r.stop_reason == "eos" else None)
            for i, ((p, o), r) in enumerate(zip(pairs, result.requests, strict=True))
        ],
        config.build_manager(),
        UniformTiming(1.0),
        3,
        config,
    )
    assert [r.final_kv_len for r in result.requests] == [r.final_kv_len for r in simulated.requests]
    assert [r.stop_reason for r in result.requests] == [r.stop_reason for r in simulated.requests]
    assert result.accountant.steps == simulated.accountant.steps
    assert result.accountant.peak == simulated.accountant.peak
    assert result.accountant.peak_allocated == simulated.accountant.peak_allocated
    assert result.num_preemptions == simulated.num_preemptions
