"""The one engine loop of a server: a thread that owns an engine session and steps it while work exists.

Continuous batching: HTTP handlers (on the asyncio event loop) hand in jobs and aborts through a thread-safe
inbox; the engine thread takes them in between steps, so a request joins the batch at the next step and a
withdrawn one leaves it (its KV blocks back in the pool) before the next. Only the engine thread touches the
session, the scheduler and the KV manager.

Each step's tokens go back to the event loop in one batch (one ``call_soon_threadsafe`` per step at most, however
many requests ran): the loop appends them to their jobs and wakes the handlers, which write them out. A handler
that falls behind finds several tokens waiting and sends them together, so a slow client never slows the engine.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import Request, RequestStatus, make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.kv.manager import assert_drained
from kvbench.measure.metrics import KvMetrics
from kvbench.serve.protocol import ApiError

FINISH_REASONS = {"length": "length", "eos": "stop", "stop": "stop"}  # the engine's stop reason -> OpenAI's
METRICS_EVERY_S = 0.01  # the gauges are read at most this often while busy (always when the engine goes idle)


@dataclass
class ChoiceState:
    """One choice's tokens as the event loop has received them."""

    tokens: list[int] = field(default_factory=list)
    unread: int = 0  # tokens not yet taken by the handler
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    done: bool = False


class Job:
    """One HTTP request's generation: ``prompts`` x ``n`` choices, each with its own engine request (the paged
    engine forks the samples of a prompt from one, sharing its prompt blocks)."""

    def __init__(self, prompts: list[list[int]], params: list[SamplingParams], n: int, fork: bool,
                 wake_per_token: bool = True) -> None:
        self.prompts = prompts
        self.params = params
        self.n = n
        self.fork = fork and n > 1
        self.wake_per_token = wake_per_token  # else tokens come with a choice's end, and the handler wakes at the last
        self.choices = [ChoiceState() for _ in range(len(prompts) * n)]
        self.error: ApiError | None = None
        self.changed = asyncio.Event()
        self.open = len(self.choices)  # choices not ended yet (event loop side)
        # engine-thread side: the engine request serving each live choice
        self._live: dict[int, Request] = {}

    @property
    def done(self) -> bool:
        return self.error is not None or self.open == 0

    def engine_requests(self) -> list[tuple[int, Request]]:
        """(first choice, request) per engine request to submit: one per prompt with forks, else one per choice."""
        out = []
        for index, (ids, params) in enumerate(zip(self.prompts, self.params, strict=True)):
            if self.fork:
                out.append((index * self.n, make_request(0, ids, params, num_samples=self.n)))
                continue
            for sample in range(self.n):
                sample_params = params
                if params.seed is not None and sample:  # the seeds a fork would give its samples
                    sample_params = replace(params, seed=params.seed + sample)
                out.append((index * self.n + sample, make_request(0, ids, sample_params)))
        return out

    # -- event loop side --------------------------------------------------------------------------------
    def _push(self, choice: int, tokens: list[int], finish: str | None, stop: str | int | None) -> bool:
        state = self.choices[choice]
        if state.done:
            return False
        state.tokens.extend(tokens)
        state.unread += len(tokens)
        if finish is not None:
            state.finish_reason, state.stop_reason, state.done = finish, stop, True
            self.open -= 1
        return self.wake_per_token or self.open == 0

    def _fail(self, error: ApiError) -> None:
        if self.error is None and self.open:
            self.error = error
        self.changed.set()

    def end_choice(self, choice: int, finish: str, stop: str | int | None) -> None:
        """The handler ended a choice itself (a stop string): later tokens of it are dropped."""
        state = self.choices[choice]
        if not state.done:
            state.finish_reason, state.stop_reason, state.done = finish, stop, True
            self.open -= 1


class EngineLoop:
    """The engine thread. ``submit`` and ``abort`` are called on the event loop; the rest runs on the thread."""

    def __init__(self, engine: LLMEngine, loop: asyncio.AbstractEventLoop, metrics: KvMetrics | None = None) -> None:
        self.engine = engine
        self.loop = loop
        self.metrics = metrics
        if metrics is not None:  # block allocations timed into the histogram (no per-sample list: it would grow)
            engine.alloc_observer = metrics.alloc_observer(engine.name, keep_samples=False)
            metrics.begin_run(engine.name)
        self.session = engine.session(keep_history=False)
        self.session.on_tokens = self._on_tokens
        self._inbox: deque[tuple[str, Job, tuple[int, ...] | None]] = deque()
        self._inbox_lock = threading.Lock()  # "inbox empty" and "idle" change together
        self._wake = threading.Event()
        self._idle = threading.Event()
        self.jobs: set[Job] = set()  # jobs submitted and not yet released by their handler (event loop side)
        self._stop = False
        self._outbox: list[tuple] = []
        self._out_lock = threading.Lock()
        self._posted = False
        self._owners: dict[int, tuple[Job, int]] = {}  # engine request id -> (job, its first choice)
        self._step_finished = 0  # requests finished and tokens emitted since the metrics were last fed
        self._step_tokens = 0
        self._observed_at = 0.0
        self.error: BaseException | None = None  # what ended the thread, if not a stop
        self.tokens = 0  # emitted so far
        self._thread = threading.Thread(target=self._run, name="kvbench-engine", daemon=True)

    # -- event loop side --------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        self._send("submit", job, None)
        self.jobs.add(job)

    def release(self, job: Job) -> None:
        """The handler is done with ``job``: withdraw whatever of it still runs (a client gone, a stop string)."""
        self.jobs.discard(job)
        if job.error is None and job.open:
            self.abort(job)

    def abort(self, job: Job, choices: Iterable[int] | None = None) -> None:
        """Withdraw a job (or some of its choices): their blocks are freed before the next step."""
        self._send("abort", job, None if choices is None else tuple(choices))

    def _send(self, what: str, job: Job, choices) -> None:
        if self.error is not None:
            raise ApiError(500, f"the engine stopped: {self.error}")
        with self._inbox_lock:
            self._idle.clear()
            self._inbox.append((what, job, choices))
        self._wake.set()

    def stop(self, timeout: float = 30.0) -> None:
        """End the thread once its inbox is handled and it has no work left (the caller withdraws what still
        runs first: a stop never cuts a step short)."""
        self._stop = True
        self._wake.set()
        self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until the engine has no work and an empty inbox (tests and shutdown)."""
        return self._idle.wait(timeout)

    def check_drained(self) -> None:
        """The KV manager's drained check (raises ``KVLeak``); only while idle or stopped."""
        assert_drained(self.session.scheduler.manager, f"the {self.engine.name} server")

    def _deliver(self) -> None:
        """On the event loop: hand the posted tokens and failures to their jobs, wake their handlers."""
        with self._out_lock:
            events, self._outbox = self._outbox, []
            self._posted = False
        woken = set()
        for event in events:
            job = event[0]
            if len(event) == 2:
                job._fail(event[1])
            elif job._push(*event[1:]) and job not in woken:
                woken.add(job)
                job.changed.set()

    # -- engine thread ----------------------------------------------------------------------------------
    def _post(self, events: list[tuple]) -> None:
        with self._out_lock:
            self._outbox.extend(events)
            schedule = not self._posted
            self._posted = True
        if schedule:
            try:
                self.loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the event loop has closed: nobody is waiting any more
                pass

    def _run(self) -> None:
        session = self.session
        try:
            while True:
                self._take_inbox()
                if not session.has_work:
                    self._observe(force=True)
                    if self._stop and not self._inbox:
                        return
                    with self._inbox_lock:
                        idle = not self._inbox
                        if idle:
                            self._idle.set()
                    if idle:
                        self._wake.wait()
                    self._wake.clear()
                    continue
                before = self.tokens
                session.step()
                self._handle_ended(session.take_ended())
                self._step_tokens += self.tokens - before
                self._observe()
        except BaseException as err:  # noqa: BLE001 - a crashed engine fails every job with the reason
            self.error = err
            error = ApiError(500, f"the engine failed: {err!r}")

            def fail_every_job() -> None:
                for job in list(self.jobs):
                    job._fail(error)

            try:
                self.loop.call_soon_threadsafe(fail_every_job)
            except RuntimeError:  # the event loop has closed
                pass
            raise
        finally:
            self._idle.set()

    def _observe(self, force: bool = False) -> None:
        """Feed the metrics (counts exact, gauges at most every ``METRICS_EVERY_S`` while stepping)."""
        if self.metrics is None:
            return
        now = time.perf_counter()
        if not force and now - self._observed_at < METRICS_EVERY_S:
            return
        self.metrics.observe_counts(self.engine.name, self.session.scheduler, self.session.clock,
                                    self._step_finished, self._step_tokens)
        self._step_finished = self._step_tokens = 0
        self._observed_at = now

    def _take_inbox(self) -> None:
        while self._inbox:
            what, job, choices = self._inbox.popleft()
            if what == "submit":
                self._submit(job)
            else:
                self._abort(job, choices)

    def _submit(self, job: Job) -> None:
        session = self.session
        now = session.now()
        for first, request in job.engine_requests():
            request.request_id = session.next_id  # ids come from the session: forks take theirs from it too
            self._owners[request.request_id] = (job, first)
            job._live[first] = request
            if not session.submit(request, now):
                self._reject(request)
                return

    def _abort(self, job: Job, choices: tuple[int, ...] | None) -> None:
        for choice, request in list(job._live.items()):
            if choices is None or choice in choices:
                self.session.abort(request)
                job._live.pop(choice, None)
                self._owners.pop(request.request_id, None)

    def _on_tokens(self, emitted: list[tuple[Request, int]]) -> None:
        """The session's hook after each step: route every token to its job's choice."""
        # (job, choice, tokens, finish reason, stop token)
        events: list[tuple[Job, int, list[int], str | None, int | None]] = []
        owners = self._owners
        for request, token in emitted:
            owner = owners.get(request.request_id)
            if owner is None:
                if request.parent_id is None or request.parent_id not in owners:
                    continue  # withdrawn already
                owner = owners[request.parent_id]  # a sample forked from its parent this step
                owners[request.request_id] = owner
                owner[0]._live[owner[1] + request.sample_index] = request
            job, first = owner
            choice = first + request.sample_index
            if request.stop_reason is None:
                if job.wake_per_token:
                    events.append((job, choice, [token], None, None))
                continue
            finish = FINISH_REASONS[request.stop_reason]
            stop = request.output_token_ids[-1] if request.stop_reason == "stop" else None
            del owners[request.request_id]
            job._live.pop(choice, None)
            self._step_finished += 1
            tokens = [token] if job.wake_per_token else list(request.output_token_ids)
            events.append((job, choice, tokens, finish, stop))
        self.tokens += len(emitted)
        if events:
            self._post(events)

    def _handle_ended(self, ended: list[Request]) -> None:
        for request in ended:
            if request.status is RequestStatus.REJECTED:
                self._reject(request)

    def _reject(self, request: Request) -> None:
        """A request the engine refused: its job fails (its other requests are withdrawn)."""
        owner = self._owners.pop(request.request_id, None)
        if owner is None:
            return
        job = owner[0]
        self._abort(job, None)
        if request.reject_kind == "oom":
            error = ApiError(503, "the KV cache cannot hold this request now (the contiguous engine reserves its "
                                  "whole length up front and admission is reject): retry later")
        else:
            error = ApiError(400, f"the request cannot run: {request.reject_reason}")
        self._post([(job, error)])

    def abort_all(self, error: ApiError) -> None:
        """Shutdown past its grace period: every job fails with ``error`` and its requests are withdrawn.
        Called on the event loop; the withdrawals happen on the engine thread."""
        for job in list(self.jobs):
            if not job.done:
                self.abort(job)
                job._fail(error)
