"""Continuous batching shared by the tensor engine and the simulator.

One decision-maker for both: which waiting requests to admit (FCFS, by free memory), how running requests
get room for their next token, whom to preempt (paged: by recompute, newest first), and, for the contiguous
baseline, whether a reservation that does not fit is queued or rejected as OOM. The scheduler also keeps
the running totals that waste accounting needs, so no step has to walk every request.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request, RequestStatus
from kvbench.kv.block_pool import OutOfBlocks
from kvbench.kv.manager import BlockCopy, KVManager


class Scheduler:
    alloc_observer: Callable[[float], None] | None = None  # seconds per allocation call (metrics)

    def __init__(self, manager: KVManager, config: EngineConfig | None = None) -> None:
        """Schedule onto ``manager`` with the scheduling settings of ``config`` (its KV fields describe the
        manager, which the caller built: usually ``config.build_manager()``)."""
        self.manager = manager
        self.config = config or EngineConfig()
        self.block_size = manager.block_size
        self.waiting: deque[Request] = deque()
        self.running: dict[int, Request] = {}  # insertion order = admission order
        self.finished: list[Request] = []
        self.rejected: list[Request] = []
        self.num_preemptions = 0
        self.num_finished = 0  # counts kept even where ``forget_ended`` drops the lists (a long-lived server)
        self.num_rejected = 0
        self.num_aborted = 0
        self._rejections_seen = 0
        self._admit_counter = 0
        self.waiting_tokens = 0  # prefill tokens of the queued requests (what a router sees as queued demand)
        self.prefill_tokens = 0  # prompt tokens of every admission (recomputes included)
        self.cached_tokens = 0  # of which a prefix cache already held the KV
        self._watermark_blocks = int(self.config.watermark * manager.pool.num_blocks) if manager.can_preempt else 0
        # running totals over live requests, for O(1) accounting (the simulator's). The final length is the
        # request's target_kv_len: exact when it runs to max_tokens or the simulator knows its EOS; the tensor
        # engine accounts with hindsight instead (step_log), once the real lengths are known.
        self.sum_kv_base = 0  # sum of kv_at_base - clock_base
        self.capped_held = 0  # sum of min(held, final length)
        self.internal = 0  # sum of max(held - final length, 0)

    # -- intake -----------------------------------------------------------------------------------------
    def add(self, request: Request) -> bool:
        """Queue a request, or reject it at once with a reason when it can never run. Returns accepted."""
        total = request.prompt_len + request.max_tokens
        if total > self.config.max_len:
            return self._reject(
                request, f"prompt + output = {total} tokens exceeds max-len {self.config.max_len}", "too_long"
            )
        if not self.manager.fits_empty_pool(request.expected_kv_len):
            return self._reject(request, "needs more KV memory than the whole pool holds", "pool")
        request.status = RequestStatus.WAITING
        self.waiting.append(request)
        self.waiting_tokens += request.prefill_len()
        return True

    def _reject(self, request: Request, reason: str, kind: str) -> bool:
        request.status = RequestStatus.REJECTED
        request.reject_reason = reason
        request.reject_kind = kind
        self.rejected.append(request)
        self.num_rejected += 1
        return False

    def drain_admission_rejections(self) -> list[Request]:
        """Requests rejected as OOM by ``admit`` since the last call: their clients may send the next one."""
        fresh = self.rejected[self._rejections_seen :]
        self._rejections_seen = len(self.rejected)
        return [r for r in fresh if r.reject_kind == "oom"]

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- admission --------------------------------------------------------------------------------------
    def admit(self, clock: int) -> list[Request]:
        """Admit waiting requests FCFS while memory and the batch limits allow; they are prefilled now."""
        admitted: list[Request] = []
        budget = self.config.max_prefill_tokens
        while self.waiting and len(self.running) < self.config.max_num_seqs:
            request = self.waiting[0]
            prefill = request.prefill_len()
            if admitted and prefill > budget:
                break
            reserve = self._watermark_blocks if self.running else 0
            if not self.manager.can_admit(prefill, request.expected_kv_len, reserve):
                if self.config.admission == "reject" and not self.manager.can_preempt:
                    self.waiting.popleft()
                    self.waiting_tokens -= prefill
                    self._reject(request, "oom: its KV reservation does not fit in free memory", "oom")
                    continue
                break
            self.waiting.popleft()
            start = time.perf_counter() if self.alloc_observer is not None else 0.0
            try:
                cached = self.manager.allocate(
                    request.request_id, prefill, request.expected_kv_len, request.prompt_token_ids
                )
            except OutOfBlocks:  # the estimate said yes but the pool disagrees: wait
                self.waiting.appendleft(request)
                break
            self.waiting_tokens -= prefill
            request.num_cached_tokens = cached
            if request.first_cached_tokens is None:
                request.first_cached_tokens = cached
            self.prefill_tokens += prefill
            self.cached_tokens += cached
            if self.alloc_observer is not None:
                self.alloc_observer(time.perf_counter() - start)
            self._start(request, clock, prefill)
            admitted.append(request)
            budget -= prefill
        return admitted

    def _start(self, request: Request, clock: int, prefill: int) -> None:
        request.status = RequestStatus.RUNNING
        request.admit_seq = self._admit_counter
        self._admit_counter += 1
        request.kv_at_base = prefill
        request.outputs_at_base = request.num_outputs + 1  # the prefill samples one token
        request.clock_base = clock
        self.running[request.request_id] = request
        self.sum_kv_base += prefill - clock
        self._set_held(request, self.manager.held_slots(request.request_id))

    def _set_held(self, request: Request, held: int) -> None:
        final = request.target_kv_len
        self.capped_held += min(held, final) - min(request.held_slots, final)
        self.internal += max(held - final, 0) - max(request.held_slots - final, 0)
        request.held_slots = held

    def fork(self, parent: Request, child: Request) -> None:
        """Start ``child`` as a copy of running ``parent`` that shares all its KV blocks (ref counts)."""
        self.manager.fork(parent.request_id, child.request_id)
        child.status = RequestStatus.RUNNING
        child.admit_seq = self._admit_counter
        self._admit_counter += 1
        child.kv_at_base = parent.kv_at_base
        child.outputs_at_base = parent.outputs_at_base
        child.clock_base = parent.clock_base
        child.num_outputs = parent.num_outputs
        self.running[child.request_id] = child
        self.sum_kv_base += child.kv_at_base - child.clock_base
        self._set_held(child, self.manager.held_slots(child.request_id))

    # -- decode -----------------------------------------------------------------------------------------
    def needs_room(self, request: Request, clock: int) -> bool:
        """Whether the decode step clock -> clock+1 writes past what the request holds, or into a shared block."""
        kv_len = request.kv_len(clock)
        if kv_len + 1 > request.held_slots:
            return True
        return self.manager.writes_shared_block(request.request_id, kv_len)

    def next_room_clock(self, request: Request) -> int:
        """The first decode clock at which ``needs_room`` becomes true."""
        return request.clock_base + request.held_slots - request.kv_at_base

    def make_room(self, request: Request, clock: int) -> tuple[list[BlockCopy], list[Request]]:
        """Give ``request`` room for the step clock -> clock+1, preempting newest-first if the pool is dry.

        Returns the copy-on-write copies to run and the requests preempted (possibly ``request`` itself).
        """
        preempted: list[Request] = []
        while True:
            start = time.perf_counter() if self.alloc_observer is not None else 0.0
            try:
                copies = self.manager.ensure_capacity(request.request_id, request.kv_len(clock) + 1)
            except OutOfBlocks:
                if not self.manager.can_preempt:
                    raise
                victim = self._newest_running()
                self.preempt(victim, clock)
                preempted.append(victim)
                if victim is request:
                    return [], preempted
                continue
            if self.alloc_observer is not None:
                self.alloc_observer(time.perf_counter() - start)
            self._set_held(request, self.manager.held_slots(request.request_id))
            return copies, preempted

    def _newest_running(self) -> Request:
        return next(reversed(self.running.values()))

    def preempt(self, request: Request, clock: int) -> None:
        """Free the request's KV and queue it first; it is recomputed (prompt + outputs so far) later."""
        request.num_outputs = request.outputs(clock)
        self._stop(request, clock)
        request.status = RequestStatus.WAITING
        request.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(request)
        self.waiting_tokens += request.prefill_len()

    def finish(self, request: Request, clock: int) -> None:
        request.final_kv_len = request.kv_len(clock)
        request.num_outputs = request.outputs(clock)
        self._stop(request, clock)
        request.status = RequestStatus.FINISHED
        self.finished.append(request)
        self.num_finished += 1

    def abort(self, request: Request, clock: int) -> bool:
        """Withdraw a waiting or running request: a running one frees its KV now. False when it had ended."""
        if request.status is RequestStatus.RUNNING:
            request.num_outputs = request.outputs(clock)
            self._stop(request, clock)
        elif request.status is RequestStatus.WAITING:
            try:
                self.waiting.remove(request)
            except ValueError:  # not queued yet (a session that has not added it)
                return False
            self.waiting_tokens -= request.prefill_len()
        else:
            return False
        request.status = RequestStatus.ABORTED
        self.num_aborted += 1
        return True

    def forget_ended(self) -> None:
        """Drop the finished and rejected requests kept so far (their counts stay): a long-lived session
        keeps no history. Call after ``drain_admission_rejections``."""
        self.finished.clear()
        self.rejected.clear()
        self._rejections_seen = 0

    def _stop(self, request: Request, clock: int) -> None:
        del self.running[request.request_id]
        self.sum_kv_base -= request.kv_at_base - request.clock_base
        self._set_held(request, 0)
        token_ids = None
        if self.manager.enable_prefix_caching and request.prompt_token_ids is not None:
            # only tokens whose KV was written (not the last sampled one) can be cached
            token_ids = (list(request.prompt_token_ids) + list(request.output_token_ids))[: request.kv_len(clock)]
        self.manager.free(request.request_id, token_ids)

    # -- accounting -------------------------------------------------------------------------------------
    def used_slots(self, clock: int) -> int:
        return self.sum_kv_base + len(self.running) * clock

    def held_slots(self) -> int:
        return self.manager.pool.num_used * self.block_size

    def external_slots(self) -> int:
        # what the head asks for is what its engine knows: max_tokens, not where it will really stop
        head = self.waiting[0].expected_kv_len if self.waiting else None
        return self.manager.external_slots(head)
