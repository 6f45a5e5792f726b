"""The front end's side of the engine: it starts the engine process, hands it jobs and aborts, and routes what
each step sent back to the jobs waiting for it.

Everything here runs on the front end's event loop (but ``wait_idle``, for tests, from any thread). A handler
submits a :class:`Job` (its prompts as token ids, its sampling parameters, ``n``) and waits on ``job.changed``;
each step's message appends the new tokens to their jobs' choices and wakes their handlers, which write them
out: a handler that falls behind finds several tokens waiting and sends them together, so a slow client never
slows the engine. ``release`` (the handler is done: finished, failed, or its client gone) withdraws whatever of
the job still runs, and its KV blocks are back in the pool at the engine's next step.

The engine process (``serve/engine_core.py``) is a child of this one: ``python -m kvbench.serve.engine_core``,
the same interpreter and the same kvbench, with its end of a socket pair; it loads the model itself, so the
front end never holds the weights (it loads the tokenizer, for text in and out). If it fails or is killed, every
job in flight fails with a 500 and the reason, new ones get a 503, and ``dead`` is set: the server stops.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import kvbench
from kvbench.engine.sampling import SamplingParams
from kvbench.errors import KvbenchError
from kvbench.kv.manager import KVLeak
from kvbench.measure.exporter import KvMetrics
from kvbench.serve.channel import FrameProtocol
from kvbench.serve.engine_messages import (
    AbortJob,
    Command,
    Crashed,
    EngineFacts,
    EngineReport,
    IdleReport,
    LoadFailed,
    LoadStatus,
    Ready,
    Report,
    ResetDone,
    ResetPrefixCache,
    StartEngine,
    StepReport,
    StopEngine,
    StoppedReport,
    SubmitJob,
    decode_report,
)
from kvbench.serve.engine_stats import EngineStats, mirror, start_series
from kvbench.serve.protocol import ApiError, ModelInfo
from kvbench.serve.settings import ServeOptions

KILL_AFTER_S = 10.0  # an engine told to stop that has not ended by then is killed


class EngineDied(KvbenchError):
    """The engine process failed or was killed: the server cannot go on (exit code 1: the input was fine)."""

    exit_code = 1


@dataclass
class ChoiceState:
    """One choice's tokens as the front end has received them."""

    tokens: list[int]
    unread: int = 0  # tokens not yet taken by the handler
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    done: bool = False
    cached_tokens: int | None = None  # prompt tokens its first admission found in the prefix cache (a prompt's first)


class Job:
    """One HTTP request's generation: ``prompts`` x ``n`` choices (the paged engine forks the samples of a prompt
    from one request, sharing its prompt blocks; the contiguous one runs a request per choice)."""

    def __init__(
        self, prompts: list[list[int]], params: list[SamplingParams], n: int, fork: bool, wake_per_token: bool = True
    ) -> None:
        self.id = -1  # given at submission
        self.prompts = prompts
        self.params = params
        self.n = n
        self.fork = fork and n > 1
        self.wake_per_token = wake_per_token  # else tokens come with a choice's end, and the handler wakes at the last
        self.choices = [ChoiceState([]) for _ in range(len(prompts) * n)]
        self.error: ApiError | None = None
        self.changed = asyncio.Event()
        self.open = len(self.choices)  # choices not ended yet
        # set by a streaming handler while it waits: called as tokens arrive, it writes them itself (True) or
        # declines, and the handler is woken (False)
        self.sink: Callable[[], bool] | None = None

    @property
    def done(self) -> bool:
        return self.error is not None or self.open == 0

    def cached_tokens(self) -> int:
        """Prompt tokens served from the prefix cache, each prompt once (as its prompt tokens are counted)."""
        return sum(self.choices[index * self.n].cached_tokens or 0 for index in range(len(self.prompts)))

    def _push(
        self, choice: int, tokens: list[int], finish: str | None, stop: str | int | None, cached: int | None = None
    ) -> bool:
        state = self.choices[choice]
        if state.done:
            return False
        if cached is not None:
            state.cached_tokens = cached
        state.tokens += tokens
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


@dataclass(frozen=True)
class EngineInfo:
    """The engine as its process reported it once loaded, and the model as the front end serves it."""

    model: ModelInfo  # the served model, with the tokenizer this process loaded
    facts: EngineFacts  # the engine process's own report: engine, device, KV pool, threads, pid, event addresses


class EngineClient:
    """The engine process and its jobs, from the front end's event loop."""

    def __init__(
        self, options: ServeOptions, with_metrics: bool = True, on_status: Callable[[str], Any] | None = None
    ) -> None:
        self.options = options
        self.with_metrics = with_metrics
        self.on_status = on_status
        self.info: EngineInfo | None = None
        self.metrics: KvMetrics | None = None
        self.stats = EngineStats()
        self.jobs: dict[int, Job] = {}  # submitted and not yet released by their handler
        self.error: str | None = None  # why the engine process ended, if it failed
        self.leak: str | None = None  # the drained check's complaint at the last idle report or the stop
        self.dead = asyncio.Event()  # the engine process ended without being told to
        self.process: asyncio.subprocess.Process | None = None
        self._channel: FrameProtocol[Report] | None = None
        self._next_job = 0
        self._sent = 0  # messages sent to the engine (an idle report says how many it has taken)
        self._idle = threading.Event()
        self._ready: asyncio.Future[EngineFacts] | None = None
        self._stopped: asyncio.Future | None = None
        self._stopping = False
        self._resets: dict[int, asyncio.Future[bool]] = {}  # reset requests sent, by id, until the engine answers

    # -- start and stop -------------------------------------------------------------------------------------
    async def start(self) -> EngineInfo:
        """Start the engine process and wait until it has loaded the model (the tokenizer loads here meanwhile).
        Settings it refuses raise ``KvbenchError`` with its reason; a process that ends raises ``EngineDied``."""
        loop = asyncio.get_running_loop()
        self._ready = loop.create_future()
        self._stopped = loop.create_future()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            source = str(Path(kvbench.__file__).resolve().parents[1])  # the same kvbench as this process
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))}
            # created on this thread, which lives as long as the server (the kernel's parent-death signal follows
            # the thread that forked)
            self.process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "kvbench.serve.engine_core",
                str(theirs.fileno()),
                str(os.getpid()),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env=env,
            )
        finally:
            theirs.close()
        try:
            _, self._channel = await loop.create_unix_connection(
                lambda: FrameProtocol(decode_report, self._on_message, self._on_closed), sock=ours
            )
            self._channel.send(StartEngine(self.options, self.with_metrics))
            tokenizer = loop.run_in_executor(None, _load_tokenizer, self.options.model)
            try:
                facts = await self._ready
            except BaseException:
                tokenizer.cancel()
                raise
            model = ModelInfo(
                name=facts.name,
                max_len=facts.max_len,
                vocab_size=facts.vocab_size,
                tokenizer=await tokenizer,
                parallel_sampling=facts.parallel_sampling,
            )
        except BaseException:
            await self._kill()
            raise
        self.info = EngineInfo(model, facts)
        if self.with_metrics:
            self.metrics = KvMetrics(device=facts.device_name)
            start_series(self.metrics, facts.engine, self.stats)
        return self.info

    async def stop(self, timeout: float = 30.0) -> None:
        """Tell the engine to stop once its work is done (the caller withdraws what still runs first) and wait
        for its process to end; one that does not end in ``timeout`` seconds is killed."""
        if self.process is None:
            return
        assert self._stopped is not None  # set when the process starts
        if self.error is None and not self._stopped.done():
            self._stopping = True
            self._send(StopEngine())
            try:
                await asyncio.wait_for(asyncio.shield(self._stopped), timeout)
            except TimeoutError:
                self.error = f"the engine process did not stop within {timeout:g}s"
        try:
            await asyncio.wait_for(self.process.wait(), KILL_AFTER_S)
        except TimeoutError:
            await self._kill()
        if self._channel is not None:
            self._channel.close()
        if self.error is None and self.process.returncode != 0:
            self.error = _exit_reason(self.process.returncode)

    async def _kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.kill()
            await self.process.wait()
        if self._channel is not None:
            self._channel.close()

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.returncode is None and self.error is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    # -- jobs -----------------------------------------------------------------------------------------------
    def submit(self, job: Job) -> None:
        if self.error is not None:
            raise ApiError(503, f"the engine process has stopped ({self.error}); the server is shutting down")
        job.id, self._next_job = self._next_job, self._next_job + 1
        self.jobs[job.id] = job
        self._send(SubmitJob(job.id, job.prompts, job.params, job.n, job.fork, job.wake_per_token))

    async def reset_prefix_cache(self) -> bool:
        """Empty the engine's prefix cache between steps: False when it refuses (a request holds blocks, or the
        engine has no prefix cache)."""
        if self.error is not None:
            raise ApiError(503, f"the engine process has stopped ({self.error})")
        reset_id = self._sent  # unique: it grows with every message sent
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._resets[reset_id] = future
        self._send(ResetPrefixCache(reset_id))
        return await future

    def release(self, job: Job) -> None:
        """The handler is done with ``job``: withdraw whatever of it still runs (a client gone, a stop string)."""
        self.jobs.pop(job.id, None)
        job.sink = None
        if job.error is None and job.open:
            self.abort(job)

    def abort(self, job: Job, choices: Iterable[int] | None = None) -> None:
        """Withdraw a job (or some of its choices): their blocks are freed before the engine's next step."""
        if self.error is None:
            self._send(AbortJob(job.id, None if choices is None else list(choices)))

    def abort_all(self, error: ApiError) -> None:
        """Shutdown past its grace period: every job fails with ``error`` and its requests are withdrawn."""
        for job in list(self.jobs.values()):
            if not job.done:
                self.abort(job)
                job._fail(error)

    def wait_idle(self, timeout: float = 10.0) -> bool:
        """Block until the engine has reported itself idle after taking every message sent (tests, any thread)."""
        return self._idle.wait(timeout)

    def check_drained(self) -> None:
        """The KV manager's drained check as the engine ran it at its last idle report or its stop (raises
        ``KVLeak``); meaningful once ``wait_idle`` returned True, or after ``stop``."""
        if self.leak is not None:
            raise KVLeak(self.leak)

    def _send(self, message: Command) -> None:
        self._idle.clear()
        self._sent += 1
        assert self._channel is not None, "start() comes first"
        self._channel.send(message)

    # -- the engine's messages ------------------------------------------------------------------------------
    def _on_message(self, message: Report) -> None:
        if isinstance(message, EngineReport):
            self._take_tokens(message)
            for failure in message.fail:
                job = self.jobs.get(failure.job)
                if job is not None:
                    job._fail(ApiError(failure.status, failure.message))
            if message.stats is not None:
                self._take_stats(message.stats)
        if not isinstance(message, StepReport):
            self._on_control(message)

    def _take_tokens(self, message: EngineReport) -> None:
        """New tokens and ended choices; each job with news is woken once per message."""
        jobs = self.jobs
        woken: dict[int, Job] = {}
        out = message.out
        if out:
            for at in range(0, len(out), 3):
                job = jobs.get(out[at])
                if job is not None:
                    state = job.choices[out[at + 1]]
                    if not state.done:
                        state.tokens.append(out[at + 2])
                        state.unread += 1
                        woken[job.id] = job
        for end in message.end:
            job = jobs.get(end.job)
            if job is not None and job._push(end.choice, end.tokens, end.finish, end.stop, end.cached):
                woken[job.id] = job
        for job in woken.values():
            sink = job.sink
            if sink is None or job.done or not sink():
                job.changed.set()

    def _on_control(self, message: Report) -> None:
        if isinstance(message, ResetDone):
            _resolve(self._resets.pop(message.id, None), message.ok)
        elif isinstance(message, IdleReport):
            self.leak = message.leak
            if message.seq == self._sent:
                self._idle.set()
        elif isinstance(message, StoppedReport):
            self.leak = message.leak
            self._idle.set()
            _resolve(self._stopped, None)
        elif isinstance(message, Ready):
            _resolve(self._ready, message.info)
        elif isinstance(message, LoadStatus):
            if self.on_status is not None:
                self.on_status(message.text)
        elif isinstance(message, LoadFailed):  # refused or failed while loading
            error_type = KvbenchError if message.exit_code == 2 else EngineDied
            _fail(self._ready, error_type(message.message))
        elif isinstance(message, Crashed):
            self._died(f"the engine failed: {message.error}")

    def _take_stats(self, now: EngineStats) -> None:
        if self.metrics is not None and self.info is not None:
            mirror(self.metrics, self.info.facts.engine, self.stats, now, now.alloc)
        self.stats = now

    def _on_closed(self, reason: str | None) -> None:
        """The channel ended: expected after a stop; otherwise the engine process died."""
        if self._stopped is not None and self._stopped.done():
            return
        asyncio.get_running_loop().create_task(self._ended(reason))

    async def _ended(self, reason: str | None) -> None:
        assert self.process is not None  # a channel ends only after the process started
        try:
            await asyncio.wait_for(self.process.wait(), 5.0)
        except TimeoutError:  # the channel broke but the process lives on: it cannot be reached, so it goes
            await self._kill()
        why = _exit_reason(self.process.returncode)
        if reason:
            why += f" ({reason})"
        self._died(f"the engine process ended: {why}")

    def _died(self, reason: str) -> None:
        if self.error is None:
            self.error = reason
        error = ApiError(500, self.error)
        for job in list(self.jobs.values()):
            job._fail(error)
        self._idle.set()
        _fail(self._ready, EngineDied(self.error))
        for future in self._resets.values():
            _fail(future, error)
        self._resets.clear()
        _resolve(self._stopped, None)
        if not self._stopping:
            self.dead.set()


def _load_tokenizer(model: str) -> Any:
    from kvbench.models.tokenizers import load_tokenizer

    return load_tokenizer(model)


def _exit_reason(code: int | None) -> str:
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _resolve(future: asyncio.Future | None, value: Any) -> None:
    if future is not None and not future.done():
        future.set_result(value)


def _fail(future: asyncio.Future | None, error: BaseException) -> None:
    if future is not None and not future.done():
        future.set_exception(error)
