"""Steppable instances: the simulator's event loop fed over time, and the tensor engine's session.

The closed-loop ``simulate`` and ``LLMEngine.run`` are themselves drivers of these objects (their tests pin
them); here, open-loop use: requests submitted at arrival instants, the clock advanced in arbitrary pieces.
"""

from __future__ import annotations

import time

import pytest

from kvbench.engine.config import EngineConfig
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.simulator import SimulatedInstance, simulate
from kvbench.engine.timing import RooflineTiming, UniformTiming
from kvbench.models.gpus import resolve_gpu
from kvbench.models.hf_model import build_random_model
from kvbench.models.resolve import resolve_model
from kvbench.models.shapes import MODEL_PRESETS
from kvbench.studies.run_requests import token_requests

PAIRS = [(8, 1), (8, 3), (5, 7), (12, 4), (3, 9), (20, 6), (7, 7), (9, 2)]
CONFIG = EngineConfig(block_size=4, num_blocks=12, max_len=32)


def _requests():
    return [Request(i, p, o) for i, (p, o) in enumerate(PAIRS)]


def test_all_submitted_at_zero_is_the_closed_loop_run_with_everything_in_flight():
    instance = SimulatedInstance(CONFIG.build_manager(), UniformTiming(1.0), CONFIG)
    opened = _requests()
    for request in opened:
        instance.submit(request, 0.0)
    instance.run()
    closed = simulate(_requests(), CONFIG.build_manager(), UniformTiming(1.0), len(PAIRS), CONFIG)
    assert [r.finish_time for r in opened] == [r.finish_time for r in closed.requests]
    assert [r.first_token_time for r in opened] == [r.first_token_time for r in closed.requests]
    assert instance.scheduler.num_preemptions == closed.num_preemptions > 0
    assert sorted(r.request_id for r in instance.take_ended()) == list(range(len(PAIRS)))
    assert instance.take_ended() == []


@pytest.mark.parametrize("piece", [0.003, 0.02, 0.5])
def test_stepping_in_pieces_keeps_the_schedule(piece):
    """Stopping a decode span at every horizon changes only where the accounting is cut, not what runs."""
    timing = RooflineTiming.for_model(resolve_model("llama-2-7b"), resolve_gpu("a100-80g"))
    whole = SimulatedInstance(CONFIG.build_manager(), timing, CONFIG)
    cut = SimulatedInstance(CONFIG.build_manager(), timing, CONFIG)
    a, b = _requests(), _requests()
    for x, y in zip(a, b, strict=True):
        whole.submit(x, 0.0)
        cut.submit(y, 0.0)
    whole.run()
    t = 0.0
    while cut.scheduler.has_work:
        t += piece
        cut.step_until(t)
        assert cut.now >= t or not cut.scheduler.has_work
    assert [r.final_kv_len for r in a] == [r.final_kv_len for r in b]
    assert [r.finish_time for r in b] == pytest.approx([r.finish_time for r in a], rel=1e-9)
    assert cut.accountant.elapsed_s == pytest.approx(whole.accountant.elapsed_s, rel=1e-9)


def test_a_later_arrival_waits_for_the_step_in_progress_and_an_idle_instance_jumps_to_it():
    instance = SimulatedInstance(CONFIG.build_manager(), UniformTiming(1.0), CONFIG)
    first, second, late = Request(0, 4, 10), Request(1, 4, 2), Request(2, 4, 2)
    instance.submit(first, 0.0)
    instance.submit(second, 2.5)  # arrives mid-step: admitted at the next step boundary, 3.0
    assert second.arrival_time == 2.5 and instance.now == 3.0
    instance.run()
    assert second.first_token_time == 4.0  # its prefill step runs 3.0 -> 4.0
    instance.submit(late, 100.0)  # idle since the others finished: the clock jumps to the arrival
    instance.run()
    assert late.first_token_time == 101.0
    stats = instance.stats()
    assert stats.finished == 3 and stats.free_blocks == stats.total_blocks and not stats.has_work


def test_stats_count_queued_prefill_blocks_and_prefix_hits():
    config = EngineConfig(block_size=4, num_blocks=16, max_len=64, enable_prefix_caching=True)
    instance = SimulatedInstance(config.build_manager(), UniformTiming(1.0), config)
    prompt = list(range(13))
    instance.submit(Request(0, 13, 2, prompt_token_ids=prompt), 0.0)
    instance.submit(Request(1, 13, 20, prompt_token_ids=[7] * 13), 0.0)
    stats = instance.stats()  # nothing admitted yet: both wait, 26 prompt tokens = 7 blocks of demand
    assert stats.waiting == 2 and stats.waiting_blocks == 7 and stats.free_blocks == 16
    instance.run()
    instance.submit(Request(2, 13, 2, prompt_token_ids=prompt), instance.now + 1)  # same prompt: 3 cached blocks
    instance.run()
    stats = instance.stats()
    assert stats.cached_tokens == 12 and stats.prompt_tokens >= 39 and stats.waiting_blocks == 0


@pytest.fixture(scope="module")
def model():
    return build_random_model(MODEL_PRESETS["tiny"], seed=0)


def test_engine_session_open_loop_matches_a_closed_loop_run(model):
    config = EngineConfig(engine="paged", block_size=4, num_blocks=40, max_len=32)
    engine = LLMEngine(model, config)
    closed = engine.run(token_requests(PAIRS, 512, 0), len(PAIRS))
    start = time.perf_counter()
    session = engine.session(clock=lambda: time.perf_counter() - start)
    requests = token_requests(PAIRS, 512, 0)
    for request in requests[:4]:
        session.submit(request, session.now())
    session.step()
    for request in requests[4:]:  # arrive while the first four run
        session.submit(request, session.now())
    while session.step():
        pass
    ended = session.take_ended()
    assert sorted(r.request_id for r in ended) == list(range(len(PAIRS)))
    assert all(r.status is RequestStatus.FINISHED for r in requests)
    assert [r.output_token_ids for r in requests] == [r.output_token_ids for r in closed.requests]
    stats = session.stats()
    assert stats.free_blocks == stats.total_blocks and stats.finished == len(PAIRS)
