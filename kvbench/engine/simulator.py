"""The tensor-free simulator: the real scheduler and KV managers, driven step by step without a model.

Each decode step gives every running request one token. Between two events (a request needs a new block,
or finishes) nothing but token counts changes, so the simulator jumps from event to event and accounts the
steps in between in closed form: 10,000 requests at max-len 2048 take seconds, not hours.
Closed loop: exactly ``concurrency`` requests are in flight (running or queued) until the list runs out.
A request with ``eos_after`` stops there (its EOS) while admission and reservations see only ``max_tokens``.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np

from kvbench.engine.client import ClosedLoopClient
from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.result import RunResult, TokenCurve, steady_of
from kvbench.engine.scheduler import Scheduler
from kvbench.kv.accounting import WasteAccountant
from kvbench.kv.manager import KVManager

_FINISH, _ROOM = 0, 1


def simulate(
    requests: Sequence[Request],
    manager: KVManager,
    timing,
    concurrency: int,
    config: EngineConfig | None = None,
    keep_timeline: bool = True,
) -> RunResult:
    """Serve ``requests`` closed-loop on ``manager``, scheduled by ``config``, with ``timing``'s step times."""
    scheduler = Scheduler(manager, config)
    block_size = manager.block_size
    pool_slots = manager.pool.num_blocks * block_size
    accountant = WasteAccountant(pool_slots, block_size, keep_timeline=keep_timeline)
    client = ClosedLoopClient(requests, concurrency, scheduler)
    events: list[tuple[int, int, int, int]] = []  # (clock, kind, admit_seq, request_id)
    by_id = {r.request_id: r for r in requests}
    itl_spans: list[tuple[float, float, int, int]] = []  # (t0, dt, k, running) decode spans
    clock, now, peak_running = 0, 0.0, 0
    curve = TokenCurve()
    stall_s, stalled = 0.0, 0  # prefill time the running requests have waited through since their last token

    def schedule_events(request: Request) -> None:
        finish = request.finish_clock()
        heapq.heappush(events, (finish, _FINISH, request.admit_seq, request.request_id))
        room = scheduler.next_room_clock(request)
        if room < finish:
            heapq.heappush(events, (room, _ROOM, request.admit_seq, request.request_id))

    def live(event) -> Request | None:
        request = by_id[event[3]]
        if request.status is RequestStatus.RUNNING and request.admit_seq == event[2]:
            return request
        return None

    def finish(request: Request) -> None:
        scheduler.finish(request, clock)
        request.finish_time = now
        eos = request.eos_after is not None and request.num_outputs >= request.eos_after  # EOS wins a tie, as in
        request.stop_reason = "eos" if eos else "length"  # the tensor engine
        client.done(now)

    client.top_up(now)
    while True:
        while events and events[0][0] <= clock and events[0][1] == _FINISH:
            request = live(heapq.heappop(events))
            if request is not None:
                finish(request)
        running_before = len(scheduler.running)
        admitted = scheduler.admit(clock)
        rejected_now = scheduler.drain_admission_rejections()
        for _rejected in rejected_now:  # an OOM answer frees the client's slot for its next request
            client.done(now)
        if admitted:
            step_s = timing.prefill_seconds([r.prefill_len() for r in admitted])
            _account(accountant, scheduler, clock, 1, timing=None, fixed_s=step_s, grow=0)
            now += step_s
            curve.add(now, len(admitted))
            stall_s += step_s
            stalled = max(stalled, running_before)
            peak_running = max(peak_running, len(scheduler.running))
            for request in admitted:
                if request.first_token_time is None:
                    request.first_token_time = now
                if request.outputs_at_base >= request.target_outputs:
                    finish(request)
                else:
                    schedule_events(request)
            continue
        if not scheduler.running:
            if scheduler.waiting:  # cannot happen: add() rejects what never fits an empty pool
                raise RuntimeError("scheduler stalled with requests waiting and none running")
            break
        while events and events[0][0] <= clock:
            event = heapq.heappop(events)
            request = live(event)
            if request is None:
                continue
            if event[1] == _FINISH:  # a finish due now after a room event reordered nothing
                finish(request)
                continue
            _copies, preempted = scheduler.make_room(request, clock)
            if request.status is RequestStatus.RUNNING:
                room = scheduler.next_room_clock(request)
                if room < request.finish_clock():
                    heapq.heappush(events, (room, _ROOM, request.admit_seq, request.request_id))
        if not scheduler.running:
            continue
        while events and live(events[0]) is None:
            heapq.heappop(events)
        k = events[0][0] - clock
        if rejected_now:  # requests sent after an OOM answer try admission after one step, as in the engine
            k = 1
        running = len(scheduler.running)
        span_s, t0, dt = _account(accountant, scheduler, clock, k, timing=timing, grow=running)
        if stall_s > 0:  # the first gap of requests that waited through prefills includes them
            hit = min(stalled, running)
            itl_spans.append((t0 + stall_s, 0.0, 1, hit))
            itl_spans.append((t0, 0.0, 1, running - hit))
            if k > 1:
                itl_spans.append((t0 + dt, dt, k - 1, running))
            stall_s, stalled = 0.0, 0
        else:
            itl_spans.append((t0, dt, k, running))
        peak_running = max(peak_running, running)
        clock += k
        now += span_s
        curve.add(now, running * k)

    values, weights = _itl_arrays(itl_spans)
    return RunResult(
        requests=list(requests),
        accountant=accountant,
        num_preemptions=scheduler.num_preemptions,
        peak_running=peak_running,
        itl_values_s=values,
        itl_weights=weights,
        pool_slots=pool_slots,
        block_size=block_size,
        steady=steady_of(curve, client),
    )


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
