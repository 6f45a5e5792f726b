"""The tensor-free simulator: the real scheduler and KV managers, driven step by step without a model.

Each decode step gives every running request one token. Between two events (a request needs a new block,
or finishes) nothing but token counts changes, so the simulator jumps from event to event and accounts the
steps in between in closed form: 10,000 requests at max-len 2048 take seconds, not hours.

:class:`SimulatedInstance` is that event loop as a steppable object with a virtual clock: requests can be
submitted at any time and the instance advanced to a time (``step_until``), which is what a fleet of
instances behind a router needs. :func:`simulate` drives one instance closed-loop: exactly ``concurrency``
requests are in flight (running or queued) until the list runs out. A request with ``eos_after`` stops there
(its EOS) while admission and reservations see only ``max_tokens``.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

import numpy as np

from kvbench.engine.config import EngineConfig
from kvbench.engine.instance import InstanceStats, instance_stats
from kvbench.engine.load_pattern import Load, LoadClient, as_load
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.result import RunResult, TokenCurve, steady_of
from kvbench.engine.scheduler import Scheduler
from kvbench.kv.accounting import WasteAccountant
from kvbench.kv.manager import KVManager

_FINISH, _ROOM = 0, 1


class SimulatedInstance:
    """One simulated engine: the shared scheduler, a KV manager and roofline step times, on a virtual clock.

    ``now`` is the time at which the next step starts; steps are atomic, so after ``step_until(t)`` the
    instance may stand a little past ``t`` (a step that began before ``t`` ends after it), exactly as a real
    engine finishes its current step before it sees a new request.
    """

    def __init__(
        self,
        manager: KVManager,
        timing,
        config: EngineConfig | None = None,
        keep_timeline: bool = True,
        on_done: Callable[[float], None] | None = None,
        start_time: float = 0.0,
    ) -> None:
        """``on_done(now)`` is called when a request ends after admission (finished, or rejected as OOM):
        a closed-loop client sends its next one."""
        self.scheduler = Scheduler(manager, config)
        self.timing = timing
        self.on_done = on_done
        block_size = manager.block_size
        self.pool_slots = manager.pool.num_blocks * block_size
        self.accountant = WasteAccountant(self.pool_slots, block_size, keep_timeline=keep_timeline)
        self.events: list[tuple[int, int, int, int]] = []  # (clock, kind, admit_seq, request_id)
        self.by_id: dict[int, Request] = {}
        self.itl_spans: list[tuple[float, float, int, int]] = []  # (t0, dt, k, running) decode spans
        self.clock, self.now, self.peak_running = 0, start_time, 0
        self.stall_s, self.stalled = 0.0, 0  # prefill time the running requests waited through since their last token
        self.ended: list[Request] = []  # requests that ended since the last ``take_ended``
        self.busy_s = 0.0  # time spent in steps (the rest of ``now`` is idle)
        self.curve = TokenCurve()  # output tokens emitted over time (the steady-state window)

    # -- intake -----------------------------------------------------------------------------------------
    def add(self, request: Request) -> bool:
        """Queue a request (its ``arrival_time`` already set); False when it is rejected at once."""
        self.by_id[request.request_id] = request
        accepted = self.scheduler.add(request)
        if not accepted:
            self.ended.append(request)
        return accepted

    def submit(self, request: Request, arrival_time: float) -> bool:
        """An open-loop arrival at ``arrival_time``: the instance first runs (or idles) up to that instant."""
        self.step_until(arrival_time)
        request.arrival_time = arrival_time
        return self.add(request)

    # -- stepping ---------------------------------------------------------------------------------------
    def step_until(self, t: float) -> None:
        """Run steps while the next one starts before ``t``; an idle instance's clock moves to ``t``."""
        while self.now < t:
            if not self.step(horizon=t):
                self.now = t
                return

    def run(self) -> None:
        """Run until every request has ended."""
        while self.step():
            pass

    def take_ended(self) -> list[Request]:
        """Requests that ended (finished or rejected) since the last call."""
        ended, self.ended = self.ended, []
        return ended

    def stats(self) -> InstanceStats:
        return instance_stats(self.scheduler, self.now)

    def _live(self, event) -> Request | None:
        request = self.by_id[event[3]]
        if request.status is RequestStatus.RUNNING and request.admit_seq == event[2]:
            return request
        return None

    def _schedule_events(self, request: Request) -> None:
        finish = request.finish_clock()
        heapq.heappush(self.events, (finish, _FINISH, request.admit_seq, request.request_id))
        room = self.scheduler.next_room_clock(request)
        if room < finish:
            heapq.heappush(self.events, (room, _ROOM, request.admit_seq, request.request_id))

    def _finish(self, request: Request) -> None:
        self.scheduler.finish(request, self.clock)
        eos = request.eos_after is not None and request.num_outputs >= request.eos_after  # EOS wins a tie, as in
        request.stop_reason = "eos" if eos else "length"  # the tensor engine
        request.finish_time = self.now
        self.ended.append(request)
        if self.on_done is not None:
            self.on_done(self.now)

    def step(self, horizon: float = math.inf) -> bool:
        """One prefill step or one decode span; False when there is nothing to run.

        A decode span jumps to the next event; with a finite ``horizon`` it stops at the first step boundary
        at or after it, so that a request arriving then joins the batch at the next step, as in an engine.
        """
        scheduler, events = self.scheduler, self.events
        while events and events[0][0] <= self.clock and events[0][1] == _FINISH:
            request = self._live(heapq.heappop(events))
            if request is not None:
                self._finish(request)
        running_before = len(scheduler.running)
        admitted = scheduler.admit(self.clock)
        rejected_now = scheduler.drain_admission_rejections()
        for rejected in rejected_now:  # an OOM answer frees the client's slot for its next request
            self.ended.append(rejected)
            if self.on_done is not None:
                self.on_done(self.now)
        if admitted:
            self._prefill(admitted, running_before)
            return True
        if not scheduler.running:
            if scheduler.waiting:  # cannot happen: add() rejects what never fits an empty pool
                raise RuntimeError("scheduler stalled with requests waiting and none running")
            return False
        while events and events[0][0] <= self.clock:
            event = heapq.heappop(events)
            request = self._live(event)
            if request is None:
                continue
            if event[1] == _FINISH:  # a finish due now after a room event reordered nothing
                self._finish(request)
                continue
            _copies, _preempted = scheduler.make_room(request, self.clock)
            if request.status is RequestStatus.RUNNING:
                room = scheduler.next_room_clock(request)
                if room < request.finish_clock():
                    heapq.heappush(events, (room, _ROOM, request.admit_seq, request.request_id))
        if not scheduler.running:
            return True
        while events and self._live(events[0]) is None:
            heapq.heappop(events)
        k = events[0][0] - self.clock
        if rejected_now:  # requests sent after an OOM answer try admission after one step, as in the engine
            k = 1
        if horizon < math.inf:
            k = self._steps_before(k, horizon - self.now)
        self._decode_span(k)
        return True

    def _prefill(self, admitted: list[Request], running_before: int) -> None:
        scheduler, timing = self.scheduler, self.timing
        lens = [r.prefill_len() for r in admitted]
        cached = [r.num_cached_tokens for r in admitted]
        step_s = timing.prefill_seconds(lens, cached=cached) if any(cached) else timing.prefill_seconds(lens)
        _account(self.accountant, scheduler, self.clock, 1, timing=None, fixed_s=step_s, grow=0)
        self.now += step_s
        self.busy_s += step_s
        self.stall_s += step_s
        self.stalled = max(self.stalled, running_before)
        self.peak_running = max(self.peak_running, len(scheduler.running))
        self.curve.add(self.now, len(admitted))
        for request in admitted:
            if request.first_token_time is None:
                request.first_token_time = self.now
            if request.outputs_at_base >= request.target_outputs:
                self._finish(request)
            else:
                self._schedule_events(request)

    def _steps_before(self, k: int, seconds: float) -> int:
        """The fewest of the next ``k`` decode steps that reach ``seconds`` from now (all ``k`` if they do not)."""
        running = len(self.scheduler.running)
        base, per_used, floor = self.timing.decode_coefficients(running)
        used0 = self.scheduler.used_slots(self.clock) + running
        if seconds <= 0 or _span_seconds(k, used0, running, base, per_used, floor) <= seconds:
            return k if seconds > 0 else 1
        low, high = 1, k  # span_seconds(high) > seconds
        while low < high:
            mid = (low + high) // 2
            if _span_seconds(mid, used0, running, base, per_used, floor) >= seconds:
                high = mid
            else:
                low = mid + 1
        return low

    def _decode_span(self, k: int) -> None:
        scheduler = self.scheduler
        running = len(scheduler.running)
        span_s, t0, dt = _account(self.accountant, scheduler, self.clock, k, timing=self.timing, grow=running)
        if self.stall_s > 0:  # the first gap of requests that waited through prefills includes them
            hit = min(self.stalled, running)
            self.itl_spans.append((t0 + self.stall_s, 0.0, 1, hit))
            self.itl_spans.append((t0, 0.0, 1, running - hit))
            if k > 1:
                self.itl_spans.append((t0 + dt, dt, k - 1, running))
            self.stall_s, self.stalled = 0.0, 0
        else:
            self.itl_spans.append((t0, dt, k, running))
        self.peak_running = max(self.peak_running, running)
        self.clock += k
        self.now += span_s
        self.busy_s += span_s
        self.curve.add(self.now, running * k)

    # -- results ----------------------------------------------------------------------------------------
    def result(self, requests: Sequence[Request], client: LoadClient | None = None) -> RunResult:
        """The run's result; with a closed-loop ``client``, its steady-state window too."""
        values, weights = _itl_arrays(self.itl_spans)
        return RunResult(
            requests=list(requests),
            accountant=self.accountant,
            num_preemptions=self.scheduler.num_preemptions,
            peak_running=self.peak_running,
            itl_values_s=values,
            itl_weights=weights,
            pool_slots=self.pool_slots,
            block_size=self.scheduler.block_size,
            steady=steady_of(self.curve, client) if client is not None else None,
        )


def simulate(
    requests: Sequence[Request],
    manager: KVManager,
    timing,
    load: Load | int,
    config: EngineConfig | None = None,
    keep_timeline: bool = True,
) -> RunResult:
    """Serve ``requests`` under ``load`` (an integer: that many in flight, closed loop) on ``manager``, scheduled
    by ``config``, with ``timing``'s step times. An open loop's arrivals join at the next step boundary."""
    instance = SimulatedInstance(manager, timing, config, keep_timeline)
    client = as_load(load).client(requests, instance)
    instance.on_done = client.done
    client.release(0.0)
    while (due := client.next_time()) is not None:
        instance.step_until(due)
        client.release(due)
    instance.run()
    return instance.result(requests, client)


def _span_seconds(k: int, used0: int, grow: int, base: float, per_used: float, floor: float) -> float:
    """Seconds of ``k`` decode steps whose j-th takes ``max(floor, base + per_used * (used0 + grow * j))``
    (the accountant's formula, without accounting)."""
    mem0 = base + per_used * used0
    slope = per_used * grow
    if mem0 >= floor:
        split = 0
    elif slope <= 0:
        split = k
    else:
        split = min(k, math.ceil((floor - mem0) / slope))
    rest = k - split
    start = mem0 + slope * split
    return floor * split + start * rest + slope * rest * (rest - 1) / 2


def _account(accountant, scheduler, clock, k, timing, grow, fixed_s: float = 0.0) -> tuple[float, float, float]:
    """Account k steps from ``clock``; returns (total s, first step s, per-step growth s)."""
    running = len(scheduler.running)
    used_after_first = scheduler.used_slots(clock) + grow
    if timing is None:
        base, per_used, floor = fixed_s, 0.0, 0.0
    else:
        base, per_used, floor = timing.decode_coefficients(running)
    total = accountant.add_span(
        k,
        used0=used_after_first,
        grow=grow,
        capped_held=scheduler.capped_held,
        internal=scheduler.internal,
        external=scheduler.external_slots(),
        held=scheduler.held_slots(),
        running=running,
        base_s=base,
        per_used_s=per_used,
        floor_s=floor,
    )
    memory_s = base + per_used * used_after_first
    first = max(floor, memory_s)
    growth = per_used * grow if memory_s >= floor else 0.0  # ITL only: ignores a mid-span roofline switch
    return total, first, growth


def _itl_arrays(spans) -> tuple[np.ndarray, np.ndarray]:
    """Expand decode spans into one gap per step, weighted by the requests that saw it."""
    if not spans:
        return np.zeros(0), np.zeros(0)
    t0 = np.array([s[0] for s in spans])
    dt = np.array([s[1] for s in spans])
    ks = np.array([s[2] for s in spans], dtype=np.int64)
    running = np.array([s[3] for s in spans], dtype=float)
    offsets = np.arange(ks.sum()) - np.repeat(np.cumsum(ks) - ks, ks)
    values = np.repeat(t0, ks) + np.repeat(dt, ks) * offsets
    weights = np.repeat(running, ks)
    keep = weights > 0
    return values[keep], weights[keep]
