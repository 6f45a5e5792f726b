"""Load patterns: how requests are released onto the server.

- :class:`ClosedLoop`: exactly C conversations in flight. Each of C workers takes the next conversation as soon
  as its current one is done (a single request is a conversation of one turn), so a completion is refilled at
  once and the server sees C requests until the list runs out, never a wave that drains to zero before the
  next is sent.
- :class:`TraceLoop`: a trace's requests at the times it recorded (``Turn.at_s``), a session's turns in order.
- :class:`OpenLoop`: conversations arrive at their own times whatever the server does: gamma-distributed gaps
  at ``rate`` per second with vLLM's ``burstiness`` as the shape (1: Poisson), optionally capped at
  ``max_concurrency`` requests in flight (the rest wait in the client, and that wait is recorded). A
  follow-up turn is released when the turn before it is answered.

Every planned request ends as one record (``record.py``): completed, failed with its reason, skipped after its
conversation's earlier turn failed, cancelled in flight, or never sent when ``deadline_s`` stops the point.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from kvbench.endpoint.conversation import Conversation, request_count
from kvbench.endpoint.record import RequestRecord
from kvbench.errors import KvbenchError
from kvbench.workload.arrivals import gamma_arrivals

Send = Callable[[Conversation, int, Sequence[str], RequestRecord], Awaitable[RequestRecord]]
OnRecord = Callable[[RequestRecord], None]


@dataclass(frozen=True)
class ClosedLoop:
    concurrency: int

    def __post_init__(self) -> None:
        if isinstance(self.concurrency, bool) or not isinstance(self.concurrency, int) or self.concurrency < 1:
            raise KvbenchError(f"concurrency must be a positive integer, got {self.concurrency!r}")

    def describe(self) -> dict:
        return {"pattern": "closed", "concurrency": self.concurrency}


@dataclass(frozen=True)
class OpenLoop:
    rate: float  # requests (conversations) per second; math.inf: all at once
    burstiness: float = 1.0
    max_concurrency: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        gamma_arrivals(1, self.rate, self.burstiness, self.seed)  # refuses a rate or burstiness out of range
        cap = self.max_concurrency
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, int) or cap < 1):
            raise KvbenchError(f"maximum concurrency must be a positive integer, got {cap!r}")

    def describe(self) -> dict:
        return {
            "pattern": "open",
            "rate": None if math.isinf(self.rate) else self.rate,
            "burstiness": self.burstiness,
            "max_concurrency": self.max_concurrency,
            "seed": self.seed,
        }


@dataclass(frozen=True)
class TraceLoop:
    """A trace at its own times: each turn sent at its ``at_s`` (and a session's next turn not before the one
    before it is answered)."""

    def describe(self) -> dict:
        return {"pattern": "trace"}


LoadPattern = ClosedLoop | OpenLoop | TraceLoop


@dataclass
class LoadResult:
    records: list[RequestRecord]  # one per planned request, by conversation then turn
    started: float  # perf_counter when the first request could go
    duration_s: float  # from ``started`` until the last request ended (or the deadline)
    stopped_at_deadline: bool = False
    max_send_lag_s: float = 0.0  # open loop: how late the client released a request against its schedule
    peak_in_flight: int = 0
    arrivals: list[float] = field(default_factory=list)  # open loop: the schedule, seconds from ``started``


class _Run:
    """The bookkeeping shared by both patterns: one record slot per planned request."""

    def __init__(
        self,
        conversations: Sequence[Conversation],
        send: Send,
        on_record: OnRecord | None,
        semaphore: asyncio.Semaphore | None = None,
    ) -> None:
        self.conversations = conversations
        self.send = send
        self.on_record = on_record
        self.semaphore = semaphore
        self.slots: dict[tuple[int, int], RequestRecord] = {}
        self.in_flight = 0
        self.peak = 0
        self.stop_reason = "the point was stopped"
        self.stopped = False  # set before cancelling: a cancellation the client swallowed must not send more
        self.started = time.perf_counter()  # the load's start, which a trace's times count from

    def _done(self, record: RequestRecord) -> None:
        if record.end is None:
            record.end = time.perf_counter()
        if self.on_record is not None:
            self.on_record(record)

    async def conversation(self, conversation: Conversation, arrival: float | None, timed: bool = False) -> None:
        answers: list[str] = []
        for turn in range(len(conversation.turns)):
            at_s = conversation.turns[turn].at_s
            if timed and at_s is not None and turn > 0:  # a trace's follow-up: at its time, after its answer
                due = self.started + at_s
                if due > time.perf_counter():
                    await asyncio.sleep(due - time.perf_counter())
                arrival = max(due, arrival or due)
            if self.stopped:  # left for records() to mark "not_sent"
                return
            record = RequestRecord(conversation.index, turn, arrival=arrival)
            if self.semaphore is not None:
                await self.semaphore.acquire()  # cancelled while waiting here: "not_sent"
            self.slots[(conversation.index, turn)] = record
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            try:
                await self.send(conversation, turn, answers, record)
            except asyncio.CancelledError:
                record.fail("cancelled", f"in flight when {self.stop_reason}")
                self._done(record)
                raise
            finally:
                self.in_flight -= 1
                if self.semaphore is not None:
                    self.semaphore.release()
            self._done(record)
            if not record.ok:
                for later in range(turn + 1, len(conversation.turns)):
                    skipped = RequestRecord(conversation.index, later).fail(
                        "skipped", f"turn {turn} of its conversation failed ({record.error_kind})"
                    )
                    skipped.start = skipped.end = record.end or time.perf_counter()
                    self.slots[(conversation.index, later)] = skipped
                    self._done(skipped)
                return
            answers.append(record.text)
            arrival = time.perf_counter()  # the follow-up is released by this answer

    def records(self) -> list[RequestRecord]:
        out = []
        now = time.perf_counter()
        for conversation in self.conversations:
            for turn in range(len(conversation.turns)):
                record = self.slots.get((conversation.index, turn))
                if record is None:
                    record = RequestRecord(conversation.index, turn).fail(
                        "not_sent", f"{self.stop_reason} before it was sent"
                    )
                    record.start = record.end = now
                    self.slots[(conversation.index, turn)] = record
                    if self.on_record is not None:
                        self.on_record(record)
                out.append(record)
        return out


async def run_load(
    conversations: Sequence[Conversation],
    pattern: LoadPattern,
    send: Send,
    deadline_s: float | None = None,
    on_record: OnRecord | None = None,
) -> LoadResult:
    """Release ``conversations`` onto the server by ``pattern`` through ``send``; returns every record."""
    if not conversations:
        raise KvbenchError("no requests to send")
    if len({c.index for c in conversations}) != len(conversations):
        raise ValueError("conversation indices must be unique")
    if deadline_s is not None and not (math.isfinite(deadline_s) and deadline_s > 0):
        raise KvbenchError(f"a point's time limit must be a positive number of seconds, got {deadline_s}")
    semaphore = None
    if isinstance(pattern, OpenLoop) and pattern.max_concurrency is not None:
        semaphore = asyncio.Semaphore(pattern.max_concurrency)
    run = _Run(conversations, send, on_record, semaphore)
    result = LoadResult([], run.started, 0.0)
    tasks: list[asyncio.Task] = []

    async def closed(pattern: ClosedLoop) -> None:
        queue = list(reversed(conversations))

        async def worker() -> None:
            while queue and not run.stopped:
                await run.conversation(queue.pop(), None)

        workers = [asyncio.ensure_future(worker()) for _ in range(min(pattern.concurrency, len(conversations)))]
        tasks.extend(workers)
        await asyncio.gather(*workers)

    async def open_(pattern: OpenLoop) -> None:
        result.arrivals = gamma_arrivals(len(conversations), pattern.rate, pattern.burstiness, pattern.seed)
        clock = time.perf_counter
        for conversation, at in zip(conversations, result.arrivals, strict=True):
            due = result.started + at
            delay = due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            result.max_send_lag_s = max(result.max_send_lag_s, clock() - due)
            tasks.append(asyncio.ensure_future(run.conversation(conversation, due)))
        await asyncio.gather(*tasks)

    async def trace(pattern: TraceLoop) -> None:
        first = [c.turns[0].at_s for c in conversations]
        if any(at is None for at in first):
            raise KvbenchError("a trace replay needs every turn's time")
        order = sorted(range(len(conversations)), key=lambda i: first[i] or 0.0)
        result.arrivals = [first[i] or 0.0 for i in order]
        clock = time.perf_counter
        for index in order:
            due = result.started + (first[index] or 0.0)
            delay = due - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            result.max_send_lag_s = max(result.max_send_lag_s, clock() - due)
            tasks.append(asyncio.ensure_future(run.conversation(conversations[index], due, timed=True)))
        await asyncio.gather(*tasks)

    if isinstance(pattern, ClosedLoop):
        driver = asyncio.ensure_future(closed(pattern))
    elif isinstance(pattern, TraceLoop):
        driver = asyncio.ensure_future(trace(pattern))
    else:
        driver = asyncio.ensure_future(open_(pattern))
    try:
        finished, _ = await asyncio.wait({driver}, timeout=deadline_s)
    except asyncio.CancelledError:
        run.stop_reason, run.stopped = "the point was interrupted", True
        await _cancel([driver, *tasks])
        raise
    if not finished:
        run.stop_reason, run.stopped = f"the point's time limit ({deadline_s:g} s) ran out", True
        result.stopped_at_deadline = True
        await _cancel([driver, *tasks])
    else:
        driver.result()  # an error in the driver itself (not in a request) is a bug: let it surface
    result.duration_s = time.perf_counter() - result.started
    result.records = run.records()
    result.peak_in_flight = run.peak
    assert len(result.records) == request_count(conversations)
    return result


async def _cancel(tasks: list[asyncio.Task]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
