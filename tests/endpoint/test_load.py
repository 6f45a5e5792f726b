"""Load patterns with a stand-in for the HTTP client: exactly C in flight, arrivals on schedule, the cap, the
turns of a conversation in order, and one record per planned request whatever happens."""

from __future__ import annotations

import asyncio
import math
import random
import time

import pytest

from kvbench.endpoint.conversation import Conversation, Turn
from kvbench.endpoint.load import ClosedLoop, OpenLoop, run_load
from kvbench.endpoint.record import FAILURE_KINDS, RequestRecord
from kvbench.errors import KvbenchError
from kvbench.workload.arrivals import gamma_arrivals


def single(count: int) -> list[Conversation]:
    return [Conversation(i, (Turn((1, 2, 3), 4),)) for i in range(count)]


class Recorder:
    """A ``send`` that sleeps a while, notes how many requests were in flight when each started, and answers."""

    def __init__(self, durations=None, fail=lambda conv, turn: False) -> None:
        self.durations = durations or (lambda conv, turn: 0.002)
        self.fail = fail
        self.in_flight = 0
        self.seen_in_flight: list[int] = []
        self.starts: dict[tuple[int, int], float] = {}
        self.answers: dict[tuple[int, int], list[str]] = {}

    async def __call__(self, conversation, turn, answers, record: RequestRecord) -> RequestRecord:
        record.start = time.perf_counter()
        self.starts[(conversation.index, turn)] = record.start
        self.answers[(conversation.index, turn)] = list(answers)
        self.in_flight += 1
        self.seen_in_flight.append(self.in_flight)
        try:
            await asyncio.sleep(self.durations(conversation.index, turn))
        finally:
            self.in_flight -= 1
        if self.fail(conversation.index, turn):
            return record.fail("http", "planned", 500)
        record.ok, record.text = True, f"answer {conversation.index}.{turn}"
        record.token_times = [0.001]
        record.ttft = record.latency = 0.001
        return record


def test_closed_loop_keeps_exactly_c_in_flight_and_refills_at_once():
    rng = random.Random(0)
    times = {i: rng.uniform(0.001, 0.02) for i in range(60)}
    send = Recorder(lambda conv, turn: times[conv])
    result = asyncio.run(run_load(single(60), ClosedLoop(5), send))
    assert len(result.records) == 60 and all(r.ok for r in result.records)
    # every request but the first C started with C - 1 others running: the completion that freed its slot is
    # refilled before anything else happens, so the server never sees fewer than C until the list runs out
    assert send.seen_in_flight[:5] == [1, 2, 3, 4, 5]
    assert send.seen_in_flight[5:] == [5] * 55
    assert result.peak_in_flight == 5
    order = sorted(send.starts, key=send.starts.get)
    assert [conv for conv, _ in order] == list(range(60))  # sent in list order


def test_closed_loop_with_fewer_requests_than_its_concurrency():
    send = Recorder()
    result = asyncio.run(run_load(single(3), ClosedLoop(8), send))
    assert len(result.records) == 3 and result.peak_in_flight == 3


def test_open_loop_follows_its_schedule():
    send = Recorder(lambda conv, turn: 0.001)
    pattern = OpenLoop(rate=200.0, burstiness=1.0, seed=3)
    result = asyncio.run(run_load(single(40), pattern, send))
    assert result.arrivals == gamma_arrivals(40, 200.0, 1.0, 3)
    for index, at in enumerate(result.arrivals):
        lateness = send.starts[(index, 0)] - (result.started + at)
        assert lateness >= -1e-3  # never early (a late one is the busy machine's, and recorded)
        assert result.records[index].arrival == pytest.approx(result.started + at)
    assert result.duration_s >= result.arrivals[-1]


def test_open_loop_cap_holds_requests_in_the_client_and_records_their_wait():
    send = Recorder(lambda conv, turn: 0.01)
    result = asyncio.run(run_load(single(20), OpenLoop(rate=math.inf, max_concurrency=4), send))
    assert max(send.seen_in_flight) == 4 and result.peak_in_flight == 4
    waits = [r.start - r.arrival for r in result.records]
    assert waits[0] < min(waits[16:]) and min(waits[16:]) > 0.03  # the 17th to 20th waited 4 rounds of 10 ms


def test_the_turns_of_a_conversation_go_in_order_with_their_history():
    conversations = [Conversation(i, tuple(Turn(f"q{i}.{t}", 4) for t in range(3))) for i in range(4)]
    send = Recorder()
    result = asyncio.run(run_load(conversations, ClosedLoop(2), send))
    assert len(result.records) == 12 and all(r.ok for r in result.records)
    for i in range(4):
        assert send.answers[(i, 2)] == [f"answer {i}.0", f"answer {i}.1"]
        assert send.starts[(i, 0)] < send.starts[(i, 1)] < send.starts[(i, 2)]
    assert max(send.seen_in_flight) == 2


def test_a_failed_turn_skips_the_rest_of_its_conversation_and_each_is_recorded():
    conversations = [Conversation(i, tuple(Turn(f"q{i}.{t}", 4) for t in range(3))) for i in range(3)]
    send = Recorder(fail=lambda conv, turn: (conv, turn) == (1, 0))
    result = asyncio.run(run_load(conversations, OpenLoop(rate=1000.0), send))
    kinds = [(r.conversation, r.turn, r.error_kind) for r in result.records]
    assert kinds == [
        (0, 0, None),
        (0, 1, None),
        (0, 2, None),
        (1, 0, "http"),
        (1, 1, "skipped"),
        (1, 2, "skipped"),
        (2, 0, None),
        (2, 1, None),
        (2, 2, None),
    ]
    assert (1, 1) not in send.starts


def test_a_deadline_cancels_what_is_in_flight_and_accounts_for_the_rest():
    send = Recorder(lambda conv, turn: 30.0 if conv >= 4 else 0.0)
    seen: list[RequestRecord] = []
    result = asyncio.run(run_load(single(10), ClosedLoop(2), send, deadline_s=0.5, on_record=seen.append))
    assert result.stopped_at_deadline and 0.5 <= result.duration_s < 10.0
    kinds = [r.error_kind for r in result.records]
    assert kinds[:4] == [None] * 4
    assert kinds[4:6] == ["cancelled", "cancelled"] and kinds[6:] == ["not_sent"] * 4
    assert "time limit (0.5 s)" in result.records[4].error
    assert sorted((r.conversation, r.turn) for r in seen) == [(i, 0) for i in range(10)]  # each reported once


def test_a_cancellation_the_client_swallows_sends_nothing_more_after_the_deadline():
    """Python 3.11's wait_for can swallow a cancellation that meets a read finishing at the same moment: the
    request then ends as if answered, and its worker must not go on sending the rest of the point's requests."""
    sent: list[int] = []

    async def send(conversation, turn, answers, record: RequestRecord) -> RequestRecord:
        record.start = time.perf_counter()
        sent.append(conversation.index)
        try:
            await asyncio.sleep(0.2)
        except asyncio.CancelledError:  # swallowed, as the race does: answered after all
            pass
        record.end = time.perf_counter()
        return record

    result = asyncio.run(run_load(single(50), ClosedLoop(2), send, deadline_s=0.3))
    assert result.stopped_at_deadline and result.duration_s < 2.0
    kinds = [r.error_kind for r in result.records]
    assert len(sent) <= 4 and kinds.count("not_sent") == 50 - len(sent)  # nothing sent after the deadline


def test_an_interrupted_load_marks_what_was_in_flight_before_it_propagates():
    send = Recorder(lambda conv, turn: 10.0)
    seen: list[RequestRecord] = []

    async def main():
        task = asyncio.ensure_future(run_load(single(3), ClosedLoop(3), send, on_record=seen.append))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert [r.error_kind for r in seen] == ["cancelled"] * 3 and "interrupted" in seen[0].error


def test_failure_kinds_are_known():
    with pytest.raises(AssertionError):
        RequestRecord(0, 0).fail("oops", "x")
    assert set(FAILURE_KINDS) >= {"http", "timeout", "stall", "connect", "disconnect", "malformed"}


@pytest.mark.parametrize(
    ("pattern", "message"),
    [
        (lambda: ClosedLoop(0), "concurrency must be a positive integer"),
        (lambda: OpenLoop(rate=0.0), "arrival rate must be a positive number"),
        (lambda: OpenLoop(rate=float("nan")), "arrival rate must be a positive number"),
        (lambda: OpenLoop(rate=1.0, burstiness=0.0), "burstiness must be a positive number"),
        (lambda: OpenLoop(rate=1.0, max_concurrency=0), "maximum concurrency must be a positive integer"),
    ],
)
def test_patterns_refuse_values_outside_their_meaning(pattern, message):
    with pytest.raises(KvbenchError, match=message):
        pattern()


def test_a_trace_is_sent_at_its_times_and_a_sessions_turns_in_order():
    from kvbench.endpoint.load import TraceLoop

    # session 0: turns at 0.00 and 0.05 s, its first answer slow (0.12 s): the second waits for it;
    # session 1: one turn at 0.03 s
    conversations = [
        Conversation(0, (Turn((1, 2), 2, at_s=0.0), Turn((1, 2, 3, 4), 2, at_s=0.05))),
        Conversation(1, (Turn((5, 6), 2, at_s=0.03),)),
    ]
    send = Recorder(lambda conv, turn: 0.12 if (conv, turn) == (0, 0) else 0.002)
    result = asyncio.run(run_load(conversations, TraceLoop(), send))
    start = result.started
    assert all(r.ok for r in result.records) and result.arrivals == [0.0, 0.03]
    assert send.starts[(0, 0)] - start < 0.02
    assert 0.03 <= send.starts[(1, 0)] - start < 0.06
    assert send.starts[(0, 1)] - start >= 0.12  # after its answer, though its time (0.05 s) came earlier
    assert send.answers[(0, 1)] == ["answer 0.0"]
    assert TraceLoop().describe() == {"pattern": "trace"}


def test_a_trace_replay_needs_every_turns_time():
    from kvbench.endpoint.load import TraceLoop

    with pytest.raises(KvbenchError):
        asyncio.run(run_load(single(2), TraceLoop(), Recorder()))
