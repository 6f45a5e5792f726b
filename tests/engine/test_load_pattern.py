"""The two load patterns, checked by hand on a target that only records, then through both engines.

The open loop is pinned to what it must equal: every request submitted to a simulated instance at its arrival
instant (the fleet's way), and, capped, to the arithmetic of a one-slot queue.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.engine.config import EngineConfig
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.load_pattern import ClosedLoop, ClosedLoopClient, OpenLoop, OpenLoopClient, as_load
from kvbench.engine.request import Request, RequestStatus, make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.engine.simulator import SimulatedInstance, simulate
from kvbench.engine.timing import UniformTiming
from kvbench.models.hf_model import build_random_model
from kvbench.models.resolve import resolve_model
from kvbench.studies.run_requests import random_prompts


class Recorder:
    """A target that accepts everything except the ids in ``reject``, noting (id, arrival time)."""

    def __init__(self, reject=()) -> None:
        self.added: list[tuple[int, float]] = []
        self.reject = set(reject)

    def add(self, request: Request) -> bool:
        self.added.append((request.request_id, request.arrival_time))
        return request.request_id not in self.reject


def _requests(n: int) -> list[Request]:
    return [Request(i, 4, 2) for i in range(n)]


def test_closed_loop_tops_up_to_c_and_sends_one_per_end():
    target = Recorder()
    client = ClosedLoopClient(_requests(5), 2, target)
    assert client.next_time() is None
    client.release(0.0)
    client.release(0.5)  # a closed loop sends by ends only: a later release sends nothing
    assert target.added == [(0, 0.0), (1, 0.0)] and client.held_full
    client.done(1.0)
    client.done(2.0)
    assert target.added[2:] == [(2, 1.0), (3, 2.0)] and client.full_until is None
    client.done(3.0)  # the last request goes out: still two in flight
    client.done(4.0)  # nothing left to send: the full load ends here
    assert target.added[4:] == [(4, 3.0)] and client.full_until == 4.0


def test_closed_loop_rejected_at_once_holds_no_slot():
    target = Recorder(reject={1})
    client = ClosedLoopClient(_requests(4), 2, target)
    client.release(0.0)
    assert [i for i, _ in target.added] == [0, 1, 2] and client.in_flight == 2


def test_open_loop_sends_on_time_whatever_is_in_flight():
    target = Recorder()
    requests = _requests(4)
    client = OpenLoopClient(list(zip([0.0, 0.5, 0.5, 2.0], requests, strict=True)), target)
    client.release(0.0)
    assert target.added == [(0, 0.0)] and client.next_time() == 0.5
    client.release(0.7)  # a late release (wall-clock lag): the scheduled times are kept
    assert target.added[1:] == [(1, 0.5), (2, 0.5)] and client.next_time() == 2.0
    client.done(1.0)
    assert len(target.added) == 3 and not client.exhausted
    client.release(2.0)
    assert target.added[3] == (3, 2.0) and client.exhausted and client.next_time() is None
    assert client.held_full is None  # no full-load window in an open loop


def test_open_loop_cap_queues_in_arrival_order_and_times_from_the_send():
    target = Recorder()
    client = OpenLoopClient(list(zip([0.0, 0.1, 0.2, 5.0], _requests(4), strict=True)), target, max_concurrency=1)
    client.release(0.2)
    assert target.added == [(0, 0.0)] and client.in_flight == 1
    client.done(1.0)  # request 1 waited for the slot: it is timed from 1.0
    client.done(3.0)
    assert target.added[1:] == [(1, 1.0), (2, 3.0)]
    client.done(4.0)
    client.release(5.0)  # on time with a free slot: its scheduled time
    assert target.added[3] == (3, 5.0) and client.exhausted


def test_open_loop_refuses_unordered_or_negative_times():
    with pytest.raises(ValueError):
        OpenLoopClient([(1.0, Request(0, 4, 2)), (0.5, Request(1, 4, 2))], Recorder())
    with pytest.raises(ValueError):
        OpenLoopClient([(-1.0, Request(0, 4, 2))], Recorder())
    with pytest.raises(ValueError):
        OpenLoop((0.0,)).client(_requests(2), Recorder())
    assert as_load(3) == ClosedLoop(3)


CONFIG = EngineConfig(block_size=4, num_blocks=12, max_len=32)
PAIRS = [(8, 1), (8, 3), (5, 7), (12, 4), (3, 9), (20, 6), (7, 7), (9, 2)]
TIMES = (0.0, 0.5, 0.5, 3.0, 3.2, 9.0, 9.0, 9.5)


def test_simulated_open_loop_equals_submitting_each_request_at_its_arrival():
    timing = UniformTiming(1.0)
    instance = SimulatedInstance(CONFIG.build_manager(), timing, CONFIG)
    by_hand = [Request(i, p, o) for i, (p, o) in enumerate(PAIRS)]
    for t, request in zip(TIMES, by_hand, strict=True):
        instance.submit(request, t)
    instance.run()
    result = simulate(
        [Request(i, p, o) for i, (p, o) in enumerate(PAIRS)], CONFIG.build_manager(), timing, OpenLoop(TIMES), CONFIG
    )
    assert [r.arrival_time for r in result.requests] == list(TIMES)
    assert [r.finish_time for r in result.requests] == [r.finish_time for r in by_hand]
    assert [r.first_token_time for r in result.requests] == [r.first_token_time for r in by_hand]
    assert result.steady is None


def test_simulated_open_loop_with_a_cap_of_one_serves_one_at_a_time():
    """One in flight: each request is sent when the one before it ends (or at its arrival, if later)."""
    result = simulate(
        [Request(i, p, o) for i, (p, o) in enumerate(PAIRS)],
        CONFIG.build_manager(),
        UniformTiming(1.0),
        OpenLoop(TIMES, max_concurrency=1),
        CONFIG,
    )
    ordered = result.requests
    for before, after, scheduled in zip(ordered, ordered[1:], TIMES[1:], strict=False):
        assert after.arrival_time == max(scheduled, before.finish_time)
        assert after.first_token_time >= before.finish_time
    assert all(r.status is RequestStatus.FINISHED for r in ordered)


def test_tensor_engine_runs_an_open_loop_on_the_wall_clock():
    shape = resolve_model("tiny")
    model = build_random_model(shape, seed=0, device=torch.device("cpu"), dtype=torch.float32)
    config = EngineConfig(block_size=4, num_blocks=64, max_len=64)
    prompts = random_prompts([(6, 3), (5, 2), (7, 4)], shape.vocab_size, 0)

    def requests():
        return [make_request(i, p, SamplingParams(max_tokens=3, ignore_eos=True)) for i, p in enumerate(prompts)]

    engine = LLMEngine(model, config)
    closed = engine.run(requests(), 3)
    opened = engine.run(requests(), OpenLoop((0.0, 0.05, 0.1)))
    assert [r.output_token_ids for r in opened.requests] == [r.output_token_ids for r in closed.requests]
    assert [r.arrival_time for r in opened.requests] == [0.0, 0.05, 0.1]
    assert all(r.first_token_time >= r.arrival_time for r in opened.requests)
    assert opened.steady is None and closed.steady is not None
