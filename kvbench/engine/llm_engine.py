"""The tensor engine: the shared scheduler and a KV manager driving a real model forward, step by step.

The paged and the contiguous engine are the same object with a different KV manager: both store K/V in
the runner's block pool and hand the attention kernels a block table (a contiguous request's table is a
run of consecutive blocks). So any difference measured between them is due to memory management.

One step: admit -> a prefill step for the admitted requests, or else a decode step for the running ones ->
emit the sampled tokens. Tensor work (packing, forward, sampling, block copies) sits behind the runner.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from kvbench.engine.config import EngineConfig
from kvbench.engine.decode_batch import DecodeBatch
from kvbench.engine.instance import InstanceStats, instance_stats
from kvbench.engine.load_pattern import Load, LoadClient, as_load
from kvbench.engine.request import Request, RequestStatus, make_request
from kvbench.engine.result import RunResult, TokenCurve, steady_of
from kvbench.engine.sampling import SamplingParams
from kvbench.engine.scheduler import Scheduler
from kvbench.engine.step_log import StepLog
from kvbench.errors import KvbenchError
from kvbench.kv.manager import assert_drained
from kvbench.models.runner import ModelRunner

if TYPE_CHECKING:
    import torch


class EngineSession:
    """One stream of work on an engine: scheduler, generators, decode batch and step log, stepped on demand.

    ``LLMEngine.run`` drives a session closed-loop until its list is served; a fleet instance feeds one
    request by request (``submit``) and steps it while it has work. ``clock`` gives the time stamps of tokens
    (seconds; by default since the session started); ``on_done(now)`` is called when a request group ends
    after admission (a closed-loop client sends its next one).

    A server's session lives as long as the server: with ``keep_history=False`` it keeps no step log or token
    curve, and ``take_ended`` forgets what it hands out, so memory follows the requests in flight. Its
    ``on_tokens(emitted)`` hook sees each step's ``(request, token)`` pairs once they are recorded (a
    request that ended has its ``stop_reason``), and ``abort`` withdraws a request and frees its blocks.
    """

    def __init__(
        self,
        engine: LLMEngine,
        next_id: int = 0,
        clock: Callable[[], float] | None = None,
        on_done: Callable[[float], None] | None = None,
        keep_history: bool = True,
    ) -> None:
        config = engine.config
        self.engine = engine
        self.scheduler = Scheduler(config.build_manager(), config)
        self.scheduler.alloc_observer = engine.alloc_observer
        self.children: list[Request] = []  # samples forked from submitted requests
        self.generators: dict[int, torch.Generator | None] = {}
        self.group_left: dict[int, int] = {}  # samples of each group still running
        self.next_id = next_id  # ids of forked samples start here
        self.forked = False
        self.log = StepLog(config.pool_slots, config.block_size)
        self.curve = TokenCurve()
        self.decode_batch = DecodeBatch(engine.runner)
        self.clock = 0
        # (decode clock at which a running request fills its blocks, its admission number, its id): only those
        # due are looked at before a decode step (entries of requests since finished or preempted are dropped)
        self.room_due: list[tuple[int, int, int]] = []
        self.peak_running = 0
        self.start = time.perf_counter()
        self._clock = clock
        self.on_done = on_done
        self.keep_history = keep_history
        self.on_tokens: Callable[[list[tuple[Request, int]]], None] | None = None
        self.ended: list[Request] = []  # requests that ended since the last ``take_ended``

    def now(self) -> float:
        return self._clock() if self._clock is not None else time.perf_counter() - self.start

    # -- intake -----------------------------------------------------------------------------------------
    def add(self, request: Request) -> bool:
        """Queue a request (its ``arrival_time`` already set); False when it is rejected at once."""
        self.generators[request.request_id] = self.engine.generator_for(request.sampling)
        self.group_left[request.request_id] = request.num_samples
        self.next_id = max(self.next_id, request.request_id + 1)
        accepted = self.scheduler.add(request)
        if not accepted:
            self.ended.append(request)
        return accepted

    def submit(self, request: Request, arrival_time: float) -> bool:
        """An open-loop arrival (``arrival_time`` on this session's clock)."""
        request.arrival_time = arrival_time
        return self.add(request)

    # -- stepping ---------------------------------------------------------------------------------------
    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def step(self) -> bool:
        """One engine step (admit -> prefill or decode -> emit); False when there was nothing to run."""
        if not self.scheduler.has_work:
            return False
        self.engine.step(self)
        return True

    def step_until(self, t: float = math.inf) -> None:
        """Run steps while there is work and the clock is before ``t``."""
        while self.scheduler.has_work and self.now() < t:
            self.engine.step(self)

    def stats(self) -> InstanceStats:
        return instance_stats(self.scheduler, self.now())

    def take_ended(self) -> list[Request]:
        """Requests that finished or were rejected since the last call (a group's samples included); without
        history the session forgets them (and the scheduler its lists) once handed out."""
        ended, self.ended = self.ended, []
        if not self.keep_history:
            self.scheduler.forget_ended()
            self.children.clear()
            for request in ended:
                self._forget(request)
        return ended

    def abort(self, request: Request) -> bool:
        """Withdraw a queued or running request (one sample of a group): a running one returns its KV blocks
        at once. False when it had already ended or was never added."""
        if not self.scheduler.abort(request, self.clock):
            return False
        root = request.parent_id if request.parent_id is not None else request.request_id
        if root in self.group_left:
            self.group_left[root] -= 1
        if not self.keep_history:
            self._forget(request)
        return True

    def _forget(self, request: Request) -> None:
        self.generators.pop(request.request_id, None)
        root = request.parent_id if request.parent_id is not None else request.request_id
        if request.status is RequestStatus.REJECTED or self.group_left.get(root, 1) <= 0:
            self.group_left.pop(root, None)

    def admit(self) -> list[Request]:
        admitted = self.scheduler.admit(self.clock)
        for rejected in self.scheduler.drain_admission_rejections():  # an OOM answer frees the client's slot
            self.group_left[rejected.request_id] = 0
            self.ended.append(rejected)
            if self.on_done is not None:
                self.on_done(self.now())
        return admitted

    def group_done(self, request: Request, now: float) -> None:
        self.ended.append(request)
        root = request.parent_id if request.parent_id is not None else request.request_id
        self.group_left[root] -= 1
        if self.group_left[root] == 0 and self.on_done is not None:
            self.on_done(now)


class LLMEngine:
    """Build with a transformers Llama-family model; ``run`` a request list under closed-loop load."""

    # called with the seconds of each block allocation call (metrics); None: untimed
    alloc_observer: Callable[[float], None] | None = None

    def __init__(
        self, model, config: EngineConfig, eos_token_id: int | None = None, stop_token_ids: Sequence[int] = ()
    ) -> None:
        self.config = config
        self.model = model
        self.runner = ModelRunner(model, config.num_blocks, config.block_size, kernel_backend=config.kernel_backend)
        self.eos_token_id = eos_token_id
        self.stop_token_ids = frozenset(stop_token_ids)  # the model's other end-of-answer tokens
        self.device = self.runner.device

    @property
    def name(self) -> str:
        return self.config.engine

    @property
    def bytes_per_token(self) -> int:
        return self.runner.bytes_per_block // self.config.block_size

    def generator_for(self, params: SamplingParams) -> torch.Generator | None:
        """A request's random generator, or None when it samples greedily."""
        return None if params.is_greedy else self.runner.new_generator(params.seed)

    # -- public API -------------------------------------------------------------------------------------
    def generate(
        self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]
    ) -> list[list[int]]:
        """Output token ids for each prompt (all submitted at once)."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        requests = [make_request(i, list(p), sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
        self.run(requests, len(requests))
        for request in requests:
            if request.status is RequestStatus.REJECTED:
                raise KvbenchError(f"request {request.request_id} rejected: {request.reject_reason}")
        return [r.output_token_ids for r in requests]

    def run(self, requests: Sequence[Request], load: Load | int, on_step=None) -> RunResult:
        """Serve ``requests`` under ``load`` (an integer: that many in flight, closed loop); every block is back in
        the pool afterwards. An open loop waits (on the wall clock) for arrivals while the engine is idle.

        ``on_step(engine_name, scheduler, finished_count)`` is called after every step (progress, metrics).
        """
        run = self.session(next_id=max((r.request_id for r in requests), default=-1) + 1)
        client = as_load(load).client(requests, run)
        run.on_done = client.done
        client.release(0.0)
        cpu_start = time.process_time()
        while True:
            if run.scheduler.has_work:
                if self.step(run) and on_step is not None:
                    on_step(self.name, run.scheduler, len(run.scheduler.finished))
            elif (due := client.next_time()) is not None:
                time.sleep(max(0.0, due - run.now()))
            else:
                break
            client.release(run.now())
        cpu_s = time.process_time() - cpu_start
        assert_drained(run.scheduler.manager, f"the {self.name} engine's run")
        result = self.result_of(run, [*requests, *run.children], client)
        result.cpu_time_s = cpu_s if self.device.type == "cpu" else None
        return result

    def session(
        self, next_id: int = 0, clock: Callable[[], float] | None = None, keep_history: bool = True
    ) -> EngineSession:
        """A fresh session on this engine (its own scheduler and KV manager over the runner's pool)."""
        return EngineSession(self, next_id=next_id, clock=clock, keep_history=keep_history)

    def step(self, run: EngineSession) -> bool:
        """One step of ``run``; False when nothing was emitted (a decode step whose batch emptied)."""
        step_start = time.perf_counter()
        admitted = run.admit()
        if admitted:
            emitted = self._prefill_step(run, admitted)
        else:
            emitted = self._decode_step(run)
            if not emitted:
                return False
        self._emit(run, emitted, step_start)
        return True

    # -- steps ------------------------------------------------------------------------------------------
    def _prefill_step(self, run: EngineSession, admitted: list[Request]) -> list[tuple[Request, int]]:
        """The admitted requests' prompts (and outputs kept across a preemption) through the model."""
        table = run.scheduler.manager.block_table
        if any(r.num_preemptions for r in admitted):  # admitted again: its row in the kept batch is stale
            run.decode_batch.forget()
        # a prefix-cache hit holds the KV of the first num_cached_tokens already: only the rest is computed
        step = self.runner.build_step(
            [(r.prefill_token_ids()[r.num_cached_tokens :], r.num_cached_tokens, table(r.request_id)) for r in admitted]
        )
        logits = self.runner.forward(step)
        tokens = self.runner.sample(
            logits, [r.sampling for r in admitted], [run.generators[r.request_id] for r in admitted]
        )
        emitted = list(zip(admitted, tokens, strict=True))
        for row, request in enumerate(admitted):
            if request.num_samples > 1 and not request.output_token_ids:
                emitted += self._fork_samples(run, request, logits, row)
        for request, _ in emitted:  # when each newcomer (and each forked sample) fills its blocks
            heapq.heappush(
                run.room_due, (run.scheduler.next_room_clock(request), request.admit_seq, request.request_id)
            )
        return emitted

    def _decode_step(self, run: EngineSession) -> list[tuple[Request, int]]:
        """One token for every running request (room made first where a request fills its blocks)."""
        scheduler = run.scheduler
        if scheduler.manager.pool.num_shared:  # a copy-on-write can be due for any request: look at all
            run.room_due.clear()
            self._make_room(run, list(scheduler.running.values()))
        elif run.room_due and run.room_due[0][0] <= run.clock:
            self._make_room(run, self._due_for_room(run))
        batch = list(scheduler.running.values())
        if not batch:
            return []
        step = run.decode_batch.step(batch, run.clock, scheduler.manager.block_table, run.generators)
        logits = self.runner.forward(step)
        tokens = self.runner.sample(logits, run.decode_batch.params, run.decode_batch.generators)
        run.clock += 1
        return list(zip(batch, tokens, strict=True))

    @staticmethod
    def _due_for_room(run: EngineSession) -> list[Request]:
        """The running requests that fill their blocks by this decode step, oldest first."""
        running, due = run.scheduler.running, []
        while run.room_due and run.room_due[0][0] <= run.clock:
            _, admit_seq, request_id = heapq.heappop(run.room_due)
            request = running.get(request_id)
            if request is not None and request.admit_seq == admit_seq:  # not since finished, preempted or readmitted
                due.append(request)
        return sorted(due, key=lambda request: request.admit_seq)

    def _make_room(self, run: EngineSession, candidates: list[Request]) -> None:
        """Room for the next token of each candidate that needs it (oldest first), preempting if the pool is dry.

        Every request given room may have a changed block table: the decode batch is told. Each candidate still
        running goes back on the heap at the clock at which it next fills its blocks.
        """
        scheduler, clock = run.scheduler, run.clock
        for request in candidates:
            if request.status is not RequestStatus.RUNNING:  # preempted for an older request of this step
                continue
            if scheduler.needs_room(request, clock):
                copies, _preempted = scheduler.make_room(request, clock)
                run.decode_batch.table_changed(request.request_id)
                self.runner.copy_blocks(copies)
            if request.status is RequestStatus.RUNNING:
                heapq.heappush(
                    run.room_due, (scheduler.next_room_clock(request), request.admit_seq, request.request_id)
                )

    def _fork_samples(self, run: EngineSession, parent: Request, logits, row: int) -> list[tuple[Request, int]]:
        """Parallel sampling: samples 1..n-1 share the parent's prompt blocks and draw their own first token."""
        if not run.scheduler.manager.can_fork:
            raise KvbenchError("parallel sampling by forking needs the paged engine; expand requests for the baseline")
        children = []
        for index in range(1, parent.num_samples):
            params = parent.sampling
            if params.seed is not None:
                params = replace(params, seed=params.seed + index)
            child = Request(
                run.next_id,
                parent.prompt_len,
                parent.max_tokens,
                prompt_token_ids=parent.prompt_token_ids,
                arrival_time=parent.arrival_time,
                parent_id=parent.request_id,
                sample_index=index,
            )
            run.next_id += 1
            child.sampling = params
            run.generators[child.request_id] = self.generator_for(params)
            run.scheduler.fork(parent, child)
            run.children.append(child)
            children.append(child)
        run.forked = run.forked or bool(children)
        tokens = self.runner.sample(
            logits,
            [c.sampling for c in children],
            [run.generators[c.request_id] for c in children],
            rows=[row] * len(children),
        )
        return list(zip(children, tokens, strict=True))

    # -- emitting and accounting ------------------------------------------------------------------------
    def _emit(self, run: EngineSession, emitted: list[tuple[Request, int]], step_start: float) -> None:
        """Record the step's state (before finished requests leave: this step's memory counts), then hand
        each request its token; requests that stop are finished and their clients send the next."""
        now = run.now()
        run.peak_running = max(run.peak_running, len(run.scheduler.running))
        snapshot = None
        if run.keep_history:
            shared = run.forked or bool(run.scheduler.manager.pool.num_shared)  # forks or prefix-cache hits
            snapshot = run.log.snapshot(run.scheduler, run.clock, shared)
            run.curve.add(now, len(emitted))
        for request, token in emitted:
            if self._append_token(run.scheduler, request, token, run.clock, now):
                run.group_done(request, now)
        if run.on_tokens is not None:
            run.on_tokens(emitted)
        if snapshot is not None:
            snapshot.seconds = time.perf_counter() - step_start

    def _append_token(self, scheduler: Scheduler, request: Request, token: int, clock: int, now: float) -> bool:
        """Record a sampled token; returns True when it ends the request."""
        outputs = request.output_token_ids
        outputs.append(token)
        request.token_times.append(now)
        if request.first_token_time is None:
            request.first_token_time = now
        if len(outputs) < request.max_tokens and request.sampling.ignore_eos:
            return False  # the common benchmark case, decided without the general stop rule
        stop = request.sampling.stop_reason(token, len(outputs), self.eos_token_id, self.stop_token_ids)
        if stop is None:
            return False
        scheduler.finish(request, clock)
        request.finish_time = now
        request.stop_reason = stop
        return True

    def result_of(self, run: EngineSession, requests: list[Request], client: LoadClient | None = None) -> RunResult:
        """The run's result; with a closed-loop ``client``, its steady-state window too."""
        gaps = [np.diff(r.token_times) for r in requests if len(r.token_times) > 1]
        itl = np.concatenate(gaps) if gaps else np.zeros(0)
        return RunResult(
            requests=requests,
            accountant=run.log.accountant(requests),
            num_preemptions=run.scheduler.num_preemptions,
            peak_running=run.peak_running,
            itl_values_s=itl,
            itl_weights=np.ones_like(itl),
            pool_slots=self.config.pool_slots,
            block_size=self.config.block_size,
            steady=steady_of(run.curve, client) if client is not None else None,
        )
