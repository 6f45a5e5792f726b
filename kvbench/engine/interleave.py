"""Two or more engines served side by side, one step each in turn, each timed on its own steps only.

Run one after the other, two engines meet different moments of a shared machine: the load of other processes
comes and goes over seconds, so a single run's throughput ratio swung from 0.46 to 1.16 on this project's 2-core
VM. Stepped in turn, both meet the same moments: each engine's clock (:class:`StepClock`) advances only while one
of its own steps runs, so its throughput, latencies and time-weighted shares are what it would show alone, and a
slow stretch of the machine falls on both. Every engine still serves its own request list in its own closed loop:
the schedules (steps, admissions, peaks) are those of a run alone.

On a CPU each result also carries the process CPU seconds of its engine's steps: on a busy machine the wall
clock counts the time the process waited for a core, the CPU time only the engine's work.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from kvbench.engine.llm_engine import EngineSession, LLMEngine
from kvbench.engine.load_pattern import ClosedLoopClient
from kvbench.engine.request import Request
from kvbench.engine.result import RunResult
from kvbench.kv.manager import assert_drained


class StepClock:
    """Seconds spent inside this engine's steps: the clock its token times and arrivals are read on."""

    def __init__(self) -> None:
        self.total = 0.0
        self._started: float | None = None

    def __call__(self) -> float:
        if self._started is None:
            return self.total
        return self.total + time.perf_counter() - self._started

    def start(self) -> None:
        self._started = time.perf_counter()

    def stop(self) -> None:
        if self._started is not None:
            self.total += time.perf_counter() - self._started
            self._started = None


def run_interleaved(
    runs: Sequence[tuple[LLMEngine, Sequence[Request]]], concurrency: int, on_step: Callable | None = None
) -> list[RunResult]:
    """Serve each engine's request list closed-loop at ``concurrency``, one step of each engine in turn (the
    order alternating every round); one result per engine, in order. ``on_step`` as in ``LLMEngine.run``."""
    sessions: list[tuple[LLMEngine, EngineSession, ClosedLoopClient, StepClock, Sequence[Request]]] = []
    for engine, requests in runs:
        clock = StepClock()
        session = engine.session(next_id=max((r.request_id for r in requests), default=-1) + 1, clock=clock)
        client = ClosedLoopClient(requests, concurrency, session)
        session.on_done = client.done
        client.top_up(0.0)
        sessions.append((engine, session, client, clock, requests))
    turn = 0
    cpu_s = [0.0] * len(sessions)  # each engine's process CPU seconds inside its steps
    while any(session.scheduler.has_work for _, session, _, _, _ in sessions):
        order = list(enumerate(sessions)) if turn % 2 == 0 else list(enumerate(sessions))[::-1]
        for index, (engine, session, _, clock, _) in order:  # neither engine always steps first
            if not session.scheduler.has_work:
                continue
            cpu_start = time.process_time()
            clock.start()
            stepped = engine.step(session)
            clock.stop()
            cpu_s[index] += time.process_time() - cpu_start
            if stepped and on_step is not None:
                on_step(engine.name, session.scheduler, len(session.scheduler.finished))
        turn += 1
    results = []
    for (engine, session, client, _, requests), cpu in zip(sessions, cpu_s, strict=True):
        assert_drained(session.scheduler.manager, f"the {engine.name} engine's run")
        result = engine.result_of(session, [*requests, *session.children], client)
        result.cpu_time_s = cpu if engine.device.type == "cpu" else None
        results.append(result)
    return results
