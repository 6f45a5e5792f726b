"""The tensor engine: the shared scheduler and a KV manager driving a real model forward, step by step.

The paged and the contiguous engine are the same object with a different KV manager: both store K/V in
the runner's block pool and hand the attention kernels a block table (a contiguous request's table is a
run of consecutive blocks). So any difference measured between them is due to memory management.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from kvbench.engine.client import ClosedLoopClient
from kvbench.engine.decode_batch import DecodeBatch
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.result import RunResult
from kvbench.engine.sampling import SamplingParams, make_generator, sample
from kvbench.engine.scheduler import ENGINES, Scheduler, SchedulerConfig
from kvbench.errors import KvbenchError
from kvbench.kv.accounting import WasteAccountant
from kvbench.kv.contiguous import RESERVATION_POLICIES
from kvbench.kv.factory import build_manager
from kvbench.models.runner import ModelRunner


@dataclass(frozen=True)
class EngineConfig:
    engine: str = "paged"  # "paged" | "contiguous"
    block_size: int = 16
    num_blocks: int = 256
    reserve: str = "max"  # contiguous reservation policy
    admission: str = "queue"  # contiguous: "queue" | "reject"
    max_num_seqs: int = 256
    max_len: int = 2048
    max_prefill_tokens: int = 4096
    kernel_backend: str | None = None

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise KvbenchError(f"unknown engine {self.engine!r}; choose one of {', '.join(ENGINES)}")
        if self.block_size < 1:
            raise KvbenchError(f"block size must be at least 1, got {self.block_size}")
        if self.num_blocks < 1:
            raise KvbenchError("the KV budget holds no block: raise --kv-memory or lower --block-size")
        if self.reserve not in RESERVATION_POLICIES:
            raise KvbenchError(f"unknown reservation policy {self.reserve!r}; choose one of {', '.join(RESERVATION_POLICIES)}")
        if self.admission not in ("queue", "reject"):
            raise KvbenchError(f"unknown admission mode {self.admission!r}; choose queue or reject")


@dataclass
class _StepRecord:
    seconds: float
    live: list[tuple[int, int, int]]  # (request id, held slots, kv length after the step)
    held: int
    external: int
    unique_used: int | None = None  # token states stored, each shared slot once (runs with forks only)
    unique_internal: int = 0  # slots of held blocks no owner will ever write (runs with forks only)


class LLMEngine:
    """Build with a transformers Llama-family model; ``run`` a request list under closed-loop load."""

    alloc_observer = None  # called with the seconds of each block allocation call (metrics); None: untimed

    def __init__(self, model, config: EngineConfig, eos_token_id: int | None = None) -> None:
        self.config = config
        self.model = model
        self.runner = ModelRunner(model, config.num_blocks, config.block_size, kernel_backend=config.kernel_backend)
        self.eos_token_id = eos_token_id
        self.device = self.runner.device

    @property
    def name(self) -> str:
        return self.config.engine

    @property
    def bytes_per_token(self) -> int:
        return self.runner.bytes_per_block // self.config.block_size

    def _new_scheduler(self) -> Scheduler:
        manager = build_manager(self.config.engine, self.config.num_blocks, self.config.block_size,
                                self.config.reserve, self.config.max_len)
        scheduler_config = SchedulerConfig(
            max_num_seqs=self.config.max_num_seqs,
            max_len=self.config.max_len,
            admission=self.config.admission,
            max_prefill_tokens=self.config.max_prefill_tokens,
        )
        scheduler = Scheduler(manager, scheduler_config)
        scheduler.alloc_observer = self.alloc_observer
        return scheduler

    # -- public API -------------------------------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], params: SamplingParams | Sequence[SamplingParams]) -> list[list[int]]:
        """Output token ids for each prompt (all submitted at once)."""
        if isinstance(params, SamplingParams):
            params = [params] * len(prompts)
        requests = [make_request(i, list(p), sp) for i, (p, sp) in enumerate(zip(prompts, params, strict=True))]
        self.run(requests, concurrency=len(requests))
        for request in requests:
            if request.status is RequestStatus.REJECTED:
                raise KvbenchError(f"request {request.request_id} rejected: {request.reject_reason}")
        return [r.output_token_ids for r in requests]

    def run(self, requests: Sequence[Request], concurrency: int, on_step=None) -> RunResult:
        """Serve ``requests`` with ``concurrency`` in flight; every block is back in the pool afterwards.

        ``on_step(engine_name, scheduler, finished_count)`` is called after every step (progress, metrics).
        """
        scheduler = self._new_scheduler()
        client = ClosedLoopClient(requests, concurrency, scheduler)
        generators = {r.request_id: _generator(r) for r in requests}
        group_left = {r.request_id: r.num_samples for r in requests}  # samples of each group still running
        children: list[Request] = []
        next_id = max((r.request_id for r in requests), default=-1) + 1
        records: list[_StepRecord] = []
        clock, peak_running = 0, 0
        decode_batch = DecodeBatch(self.runner)
        room_due = 0  # the first clock at which a running request may need a new block
        start = time.perf_counter()
        client.top_up(0.0)
        while scheduler.has_work:
            step_start = time.perf_counter()
            admitted = scheduler.admit(clock)
            for rejected in scheduler.drain_admission_rejections():  # an OOM answer frees the client's slot
                group_left[rejected.request_id] = 0
                client.done(time.perf_counter() - start)
            if admitted:
                batch = admitted
                chunks = [(self._prefill_tokens(r), 0, scheduler.manager.block_table(r.request_id)) for r in batch]
                step = self.runner.build_step(chunks)
                room_due = clock  # the newcomers' room is checked at the next decode step
            else:
                if clock >= room_due or scheduler.manager.pool.num_shared:
                    batch, room_due = self._prepare_decode(scheduler, clock, decode_batch)
                else:  # nobody reaches the end of its blocks before room_due: no request to look at
                    batch = list(scheduler.running.values())
                if not batch:
                    continue
                step = decode_batch.step(batch, clock, scheduler.manager.block_table, generators)
            logits = self.runner.forward(step)
            if admitted:
                tokens = sample(logits, [r.sampling for r in batch], [generators[r.request_id] for r in batch])
            else:
                tokens = sample(logits, decode_batch.params, decode_batch.generators)
            if not admitted:
                clock += 1
            now = time.perf_counter() - start
            emitted = zip(batch, tokens, strict=True)
            if admitted:
                emitted = list(emitted)
                for row, request in enumerate(batch):
                    if request.num_samples > 1 and not request.output_token_ids:
                        forks = self._fork_samples(scheduler, request, logits[row], next_id, generators)
                        next_id += len(forks)
                        children += [child for child, _ in forks]
                        emitted += forks
            peak_running = max(peak_running, len(scheduler.running))
            record = self._record(scheduler, clock, bool(children))  # before finishing: this step's state counts
            for request, token in emitted:
                if self._emit(scheduler, request, token, clock, now):
                    root = request.parent_id if request.parent_id is not None else request.request_id
                    group_left[root] -= 1
                    if group_left[root] == 0:
                        client.done(now)
            record.seconds = time.perf_counter() - step_start
            records.append(record)
            if on_step is not None:
                on_step(self.name, scheduler, len(scheduler.finished))
        manager = scheduler.manager
        manager.check_invariants()
        if manager.pool.num_used:
            raise RuntimeError(f"{manager.pool.num_used} KV blocks leaked")
        return self._result([*requests, *children], scheduler, records, peak_running)

    def _fork_samples(self, scheduler: Scheduler, parent: Request, logits_row: torch.Tensor, first_id: int,
                      generators: dict) -> list[tuple[Request, int]]:
        """Parallel sampling: samples 1..n-1 share the parent's prompt blocks and draw their own first token."""
        if self.config.engine != "paged":
            raise KvbenchError("parallel sampling by forking needs the paged engine; expand requests for the baseline")
        forks = []
        for index in range(1, parent.num_samples):
            params = parent.sampling
            if params.seed is not None:
                from dataclasses import replace

                params = replace(params, seed=params.seed + index)
            child = Request(first_id + index - 1, parent.prompt_len, parent.max_tokens,
                            prompt_token_ids=parent.prompt_token_ids, arrival_time=parent.arrival_time,
                            parent_id=parent.request_id, sample_index=index)
            child.sampling = params
            generators[child.request_id] = _generator(child)
            scheduler.fork(parent, child)
            token = sample(logits_row[None, :], [params], [generators[child.request_id]])[0]
            forks.append((child, token))
        return forks

    # -- steps ------------------------------------------------------------------------------------------
    @staticmethod
    def _prefill_tokens(request: Request) -> list[int]:
        return list(request.prompt_token_ids) + request.output_token_ids

    def _prepare_decode(self, scheduler: Scheduler, clock: int, decode_batch: DecodeBatch) -> tuple[list[Request], int]:
        """Room for every running request's next token (oldest first), preempting if the pool is dry.

        Every request given room may have a changed block table: ``decode_batch`` is told. Returns the
        running requests and the first clock at which one of them fills its blocks (until then, with no
        shared block and no new admission, no request needs looking at).
        """
        needs_room = scheduler.needs_room
        for request in list(scheduler.running.values()):
            if request.status is not RequestStatus.RUNNING or not needs_room(request, clock):
                continue
            copies, _preempted = scheduler.make_room(request, clock)
            decode_batch.table_changed(request.request_id)
            if copies:
                from kvbench.kernels import copy_blocks

                src = torch.tensor([c.src for c in copies], device=self.device)
                dst = torch.tensor([c.dst for c in copies], device=self.device)
                copy_blocks(self.runner.k_caches, self.runner.v_caches, src, dst, backend=self.config.kernel_backend)
        running = list(scheduler.running.values())
        return running, min(map(scheduler.next_room_clock, running), default=clock)

    def _emit(self, scheduler: Scheduler, request: Request, token: int, clock: int, now: float) -> bool:
        """Record a sampled token; returns True when it ends the request."""
        outputs = request.output_token_ids
        outputs.append(token)
        request.token_times.append(now)
        if request.first_token_time is None:
            request.first_token_time = now
        if len(outputs) < request.max_tokens and request.sampling.ignore_eos:
            return False  # the common benchmark case, decided without the general stop rule
        stop = request.sampling.stop_reason(token, len(outputs), self.eos_token_id)
        if stop is not None:
            scheduler.finish(request, clock)
            request.finish_time = now
            request.stop_reason = stop
            return True
        return False

    @staticmethod
    def _record(scheduler: Scheduler, clock: int, shared: bool) -> _StepRecord:
        """The pool's state after this step's writes; its duration is filled in when the step ends."""
        live = [(r.request_id, r.held_slots, r.kv_len(clock)) for r in scheduler.running.values()]
        used, internal = _shared_block_states(scheduler, clock) if shared else (None, 0)
        return _StepRecord(0.0, live, scheduler.held_slots(), scheduler.external_slots(), used, internal)

    def _result(self, requests, scheduler: Scheduler, records: list[_StepRecord], peak_running: int) -> RunResult:
        """Account every step with hindsight: each request's real final length splits reserved from internal."""
        pool_slots = self.config.num_blocks * self.config.block_size
        accountant = WasteAccountant(pool_slots, self.config.block_size)
        final = {r.request_id: r.final_kv_len for r in requests if r.final_kv_len is not None}
        for record in records:
            if record.unique_used is not None:  # shared blocks: count each slot once, whoever owns it
                used, internal = record.unique_used, record.unique_internal
                capped = record.held - internal
            else:
                used = sum(kv for _, _, kv in record.live)
                capped = sum(min(held, final.get(rid, held)) for rid, held, _ in record.live)
                internal = sum(max(held - final.get(rid, held), 0) for rid, held, _ in record.live)
            accountant.add_span(1, used0=used, grow=0, capped_held=capped, internal=internal,
                                external=record.external, held=record.held, running=len(record.live),
                                base_s=record.seconds)
        gaps = [np.diff(r.token_times) for r in requests if len(r.token_times) > 1]
        itl = np.concatenate(gaps) if gaps else np.zeros(0)
        return RunResult(
            requests=list(requests),
            accountant=accountant,
            num_preemptions=scheduler.num_preemptions,
            peak_running=peak_running,
            itl_values_s=itl,
            itl_weights=np.ones_like(itl),
            pool_slots=pool_slots,
            block_size=self.config.block_size,
        )


def _shared_block_states(scheduler: Scheduler, clock: int) -> tuple[int, int]:
    """(token states stored, slots never to be written) over the pool's blocks, a shared block counted once.

    A slot is written if any owner has written it; it is internal if no owner will reach it before its
    expected end (prompt + max_tokens - 1: the run's length when EOS is ignored, as in benchmarks).
    """
    block_size = scheduler.block_size
    written: dict[int, int] = {}
    reach: dict[int, int] = {}
    for request in scheduler.running.values():
        kv_len, final = request.kv_len(clock), request.expected_kv_len
        for index, block in enumerate(scheduler.manager.block_table(request.request_id)):
            start = index * block_size
            written[block] = max(written.get(block, 0), min(block_size, max(0, kv_len - start)))
            reach[block] = max(reach.get(block, 0), min(block_size, max(0, final - start)))
    return sum(written.values()), sum(block_size - filled for filled in reach.values())


def make_request(request_id: int, prompt_token_ids: list[int], params: SamplingParams, num_samples: int = 1) -> Request:
    """A request for the tensor engine; ``num_samples`` > 1 asks the paged engine for parallel samples."""
    request = Request(request_id, len(prompt_token_ids), params.max_tokens, prompt_token_ids=list(prompt_token_ids),
                      num_samples=num_samples)
    request.sampling = params
    return request


def _generator(request: Request) -> torch.Generator | None:
    params: SamplingParams = request.sampling
    return None if params.is_greedy else make_generator(params.seed)
