"""A server's session: requests withdrawn mid-flight give their blocks back, and a session without history keeps
nothing of the requests that ended (memory follows what is in flight, not how long the server has run)."""

from __future__ import annotations

import pytest

from kvbench.engine.config import EngineConfig
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import RequestStatus, make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.kv.manager import KVLeak, assert_drained
from kvbench.studies.local_model import load_model


@pytest.fixture(scope="module")
def tiny():
    return load_model("tiny", device="cpu", seed=0)


def _engine(tiny, engine: str = "paged", num_blocks: int = 64, max_num_seqs: int = 256) -> LLMEngine:
    return LLMEngine(
        tiny.model,
        EngineConfig(engine=engine, block_size=4, num_blocks=num_blocks, max_len=64, max_num_seqs=max_num_seqs),
    )


@pytest.mark.parametrize("engine", ["paged", "contiguous"])
def test_aborting_running_and_waiting_requests_returns_every_block(tiny, engine):
    session = _engine(tiny, engine, max_num_seqs=2).session(keep_history=False)
    requests = []
    for index in range(4):
        request = make_request(index, list(range(1, 9)), SamplingParams(max_tokens=30, ignore_eos=True))
        session.submit(request, 0.0)
        requests.append(request)
    for _ in range(3):
        session.step()
    running = [r for r in requests if r.status is RequestStatus.RUNNING]
    waiting = [r for r in requests if r.status is RequestStatus.WAITING]
    assert len(running) == 2 and len(waiting) == 2  # both kinds are withdrawn
    held = session.scheduler.manager.pool.num_used
    assert session.abort(running[0])
    assert session.scheduler.manager.pool.num_used < held  # its blocks are back at once, not at the next step
    for request in requests[1:]:
        session.abort(request)
    assert all(r.status is RequestStatus.ABORTED for r in requests)
    assert not session.has_work
    assert_drained(session.scheduler.manager)
    assert session.abort(requests[0]) is False  # twice is a no-op
    assert session.scheduler.num_aborted == 4 and session.scheduler.waiting_tokens == 0


def test_aborting_one_sample_of_a_fork_keeps_its_siblings_and_shared_blocks(tiny):
    session = _engine(tiny).session(keep_history=False)
    parent = make_request(
        0, list(range(1, 10)), SamplingParams(max_tokens=8, temperature=1.0, seed=3, ignore_eos=True), num_samples=3
    )
    forked = []
    session.on_tokens = lambda emitted: forked.extend(r for r, _ in emitted if r.parent_id == parent.request_id)
    session.submit(parent, 0.0)
    session.step()  # prefill: the parent and its two forked samples
    children = list(dict.fromkeys(forked))
    assert len(children) == 2
    assert session.abort(children[0])
    while session.has_work:
        session.step()
    ended = session.take_ended()
    assert {r.request_id for r in ended} == {parent.request_id, children[1].request_id}
    assert len(parent.output_token_ids) == 8 and len(children[1].output_token_ids) == 8
    assert_drained(session.scheduler.manager)
    assert session.group_left == {} and session.generators == {}


def test_a_session_without_history_forgets_what_ended(tiny):
    engine = _engine(tiny)
    session = engine.session(keep_history=False)
    seen = []
    session.on_tokens = seen.extend
    for index in range(20):
        session.submit(make_request(index, [1, 2, 3], SamplingParams(max_tokens=5, ignore_eos=True)), 0.0)
        while session.has_work:
            session.step()
        session.take_ended()
    assert len(seen) == 20 * 5
    scheduler = session.scheduler
    assert scheduler.finished == [] and scheduler.rejected == [] and session.generators == {}
    assert session.group_left == {} and session.log.snapshots == [] and session.curve.times == []
    assert scheduler.num_finished == 20 and session.stats().finished == 20
    assert_drained(scheduler.manager)


def test_a_rejected_request_leaves_nothing_behind(tiny):
    session = _engine(tiny).session(keep_history=False)
    too_long = make_request(0, list(range(1, 60)), SamplingParams(max_tokens=30, ignore_eos=True))
    assert not session.submit(too_long, 0.0)
    assert session.take_ended() == [too_long]
    assert session.group_left == {} and session.generators == {} and session.scheduler.num_rejected == 1


def test_the_drained_check_catches_a_request_left_in_the_pool(tiny):
    session = _engine(tiny).session(keep_history=False)
    session.submit(make_request(0, [1, 2, 3], SamplingParams(max_tokens=10, ignore_eos=True)), 0.0)
    session.step()
    with pytest.raises(KVLeak):
        assert_drained(session.scheduler.manager)
