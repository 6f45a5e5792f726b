"""Engines stepped in turn: each serves its own list exactly as alone, timed on its own steps only."""

from __future__ import annotations

import time

import pytest

from kvbench.engine.config import EngineConfig
from kvbench.engine.interleave import StepClock, run_interleaved
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.models.hf_model import build_random_model
from kvbench.models.shapes import ModelShape

SHAPE = ModelShape(
    "test-gqa",
    num_layers=2,
    hidden_size=64,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=128,
    vocab_size=256,
    dtype="fp32",
)
LENGTHS = [(5, 9), (17, 4), (33, 12), (8, 7), (1, 10), (12, 3), (20, 6)]


def _requests():
    return [
        make_request(
            i, [(7 * i + j) % SHAPE.vocab_size for j in range(p)], SamplingParams(max_tokens=o, ignore_eos=True)
        )
        for i, (p, o) in enumerate(LENGTHS)
    ]


@pytest.fixture(scope="module")
def engines():
    model = build_random_model(SHAPE, seed=3)
    # a pool where the contiguous slabs (max-len 48) hold only 2 requests: its schedule differs from paging's
    return {
        name: LLMEngine(model, EngineConfig(engine=name, block_size=4, num_blocks=24, max_len=48))
        for name in ("paged", "contiguous")
    }


def test_each_engine_serves_its_list_as_it_would_alone(engines):
    alone = {name: engine.run(_requests(), 3) for name, engine in engines.items()}
    together = dict(
        zip(engines, run_interleaved([(engine, _requests()) for engine in engines.values()], 3), strict=True)
    )
    for name in engines:
        a, b = alone[name], together[name]
        assert [r.output_token_ids for r in b.requests] == [r.output_token_ids for r in a.requests]
        assert (len(b.completed), b.peak_running, b.num_preemptions) == (
            len(a.completed),
            a.peak_running,
            a.num_preemptions,
        )
        assert len(b.accountant.timeline) == len(a.accountant.timeline)  # the same steps
    assert together["contiguous"].peak_running == 2 < together["paged"].peak_running == 3


def test_an_engine_is_timed_on_its_own_steps_only(engines, monkeypatch):
    """A slow contiguous engine does not slow the paged engine's figures down, though their steps alternate."""
    contiguous = engines["contiguous"]
    real_forward = contiguous.runner.forward

    def forward(step):
        time.sleep(0.02)  # inside the contiguous engine's step: its clock only
        return real_forward(step)

    monkeypatch.setattr(contiguous.runner, "forward", forward)
    paged, slow = run_interleaved([(engines["paged"], _requests()), (contiguous, _requests())], 3)
    steps = len(slow.accountant.timeline)
    assert slow.elapsed_s >= 0.02 * steps
    assert paged.elapsed_s < 0.02 * steps / 2  # none of the other engine's sleeps
    last_token = max(r.token_times[-1] for r in paged.completed)
    assert last_token <= paged.elapsed_s + 0.02  # token times on the paged engine's own clock
    # CPU time counts the work, not the waiting: the sleeps are in the wall clock only
    assert 0 < slow.cpu_time_s < slow.elapsed_s - 0.02 * steps * 0.9 and 0 < paged.cpu_time_s


def test_the_step_clock_runs_only_between_start_and_stop():
    clock = StepClock()
    assert clock() == 0.0
    clock.start()
    time.sleep(0.01)
    clock.stop()
    after = clock()
    time.sleep(0.01)
    assert clock() == after >= 0.01
