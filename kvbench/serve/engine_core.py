"""The engine process of ``kvbench serve``: the model, the engine session and its loop, beside the HTTP front end.

Why a process of its own: on a small model an engine step is mostly Python, and so is the HTTP work; in one
process they take turns on one interpreter lock, so the front end's per-token work came out of the engine's
time. Here the engine steps on one core while the front end (parsing, tokenizing, decoding, server-sent events)
runs on another, as vLLM's API server and EngineCore processes do.

The loop: take the front end's messages (new jobs, aborts, a stop) between steps, so a request joins the batch at
the next step and a withdrawn one leaves it (its KV blocks back in the pool) before the next; step; send one
message with the step's tokens (a flat ``[job, choice, token, ...]`` list), the choices that ended (with their
finish and stop reasons), the jobs the engine refused, and at most every ``STATS_EVERY_S`` the counts ``/metrics``
serves (with the block allocation latencies timed since the last ones). Idle, it reports so once (with the KV
manager's drained check) and waits for the next message.

It ends when the front end says stop (after the work left, and the drained check, are done), when the channel
closes (the front end ended), or with its parent process (Linux: ``PR_SET_PDEATHSIG``; elsewhere the closed
channel, between steps). It ignores SIGINT and SIGTERM: a Ctrl-C at the terminal, or a stop sent to the whole
process group, reaches the front end, which drains its requests for the grace period before it stops the engine.
A failure in a step is sent as the reason, in one line with where it was raised (the traceback is written to
stderr only with ``KVBENCH_DEBUG=1``), and the process exits 1.

Run as ``python -m kvbench.serve.engine_core FD PARENT_PID``: FD is its end of the channel; the first message
is the server's settings (``StartEngine``; the messages both ways are in ``serve/engine_messages.py``).
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import replace

from kvbench import env_settings
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import Request, RequestStatus, make_request
from kvbench.engine.step_totals import StepTotals
from kvbench.errors import KvbenchError
from kvbench.kv.manager import KVLeak, assert_drained
from kvbench.kv.paged import CacheEvent, PagedManager
from kvbench.measure.exporter import online_fragmentation
from kvbench.serve.channel import BlockingChannel, ChannelClosed
from kvbench.serve.engine_messages import (
    AbortJob,
    ChoiceEnd,
    Command,
    Crashed,
    EngineFacts,
    IdleReport,
    JobFailure,
    LoadFailed,
    LoadStatus,
    LoopReport,
    Ready,
    ResetDone,
    ResetPrefixCache,
    StartEngine,
    StepReport,
    StopEngine,
    StoppedReport,
    SubmitJob,
    decode_command,
)
from kvbench.serve.engine_stats import EngineStats
from kvbench.serve.kv_event_publisher import KvEventPublisher, wire_events
from kvbench.serve.settings import ServedEngine

FINISH_REASONS = {"length": "length", "eos": "stop", "stop": "stop"}  # the engine's stop reason -> OpenAI's
STATS_EVERY_S = 0.05  # the counts for /metrics go out at most this often while stepping (always when idle)
SEND_BUFFER_BYTES = 4 * 1024**2  # asked of the kernel (which may cap it): steps of tokens queued for the front end
PR_SET_PDEATHSIG = 1


class CoreJob:
    """One HTTP request's engine requests: the live one serving each choice."""

    __slots__ = ("id", "wake", "live", "cached")

    def __init__(self, job_id: int, wake: bool) -> None:
        self.id = job_id
        self.wake = wake  # every token goes out as sampled; else a choice's tokens go out when it ends
        self.live: dict[int, Request] = {}  # first choice of the request -> the request
        self.cached: dict[int, int] = {}  # first choice -> prompt tokens its first admission found cached


class EngineCore:
    """The loop over one engine session, talking to the front end through ``channel``."""

    def __init__(
        self,
        engine: LLMEngine,
        channel: BlockingChannel[Command],
        timed: bool = True,
        publisher: KvEventPublisher | None = None,
    ) -> None:
        self.engine = engine
        self.channel = channel
        self.publisher = publisher
        self.alloc_seconds: list[float] = []
        if timed:  # each block allocation call timed, for the latency histogram
            engine.alloc_observer = self.alloc_seconds.append
        self.session = engine.session(keep_history=False)
        self.session.on_tokens = self._on_tokens
        self.manager = self.session.scheduler.manager
        self._events: list[CacheEvent] | None = None  # the manager's changes to its cached set, when published
        if publisher is not None:
            assert isinstance(self.manager, PagedManager), "the server refuses KV events without a prefix cache"
            self.manager.events = self._events = []
        self.jobs: dict[int, CoreJob] = {}
        self._owners: dict[int, tuple[CoreJob, int]] = {}  # engine request id -> (job, its first choice)
        self.handled = 0  # messages taken from the front end so far (an idle report says how many)
        self.tokens = 0  # emitted so far
        self.prompt_tokens = 0  # of the requests whose first token is out (forked samples share their parent's)
        self.stopping = False
        self._reported_idle = False
        self._idle_counts_out = False  # the last counts sent are an idle report's
        self._stats_at = 0.0
        self.steps = StepTotals()
        self._stepped = 0  # requests given a token by the current step
        self._out: list[int] = []  # this step's tokens: job, choice, token, job, choice, token, ...
        self._ends: list[ChoiceEnd] = []  # the choices that ended since the last message
        self._fails: list[JobFailure] = []  # the jobs refused since the last message

    # -- the loop -------------------------------------------------------------------------------------------
    def run(self, pending: Sequence[Command] = ()) -> int:
        """Serve until told to stop (0) or the channel closes (0); a failure is reported and returns 1."""
        session, channel = self.session, self.channel
        scheduler = session.scheduler
        try:
            for message in pending:
                self._handle(message)
            while True:
                if not session.has_work:
                    if self.stopping:
                        self._send(StoppedReport(leak=self._leak(), stats=self.stats()))
                        return 0
                    if not self._reported_idle:
                        self._send(IdleReport(seq=self.handled, leak=self._leak(), stats=self.stats()))
                        self._reported_idle = True
                        self._idle_counts_out = True
                idle = not session.has_work
                start = time.perf_counter()  # busy, a step's time includes taking the messages that came
                for message in channel.receive(wait=idle):
                    self._handle(message)
                if not session.has_work:
                    continue
                if idle:  # the wait for work is no part of the step
                    start = time.perf_counter()
                self._reported_idle = False
                clock, queried, cached = session.clock, scheduler.prefill_tokens, scheduler.cached_tokens
                self._stepped = 0
                session.step()
                self._publish_events()
                self._handle_ended(session.take_ended())
                now = time.perf_counter()
                if self._idle_counts_out or now - self._stats_at >= STATS_EVERY_S:
                    # the first step after an idle report says so at once: else /metrics would show the idle
                    # counts (nothing running) for the first STATS_EVERY_S of every burst of work
                    self._idle_counts_out = False
                    self._send(StepReport(stats=self.stats(now)))
                elif self._out or self._ends or self._fails:
                    self._send(StepReport())
                # the step, its tokens sent: a decode step moved the session's clock, a prefill step admitted prompts
                if session.clock > clock:
                    self.steps = self.steps.add(True, time.perf_counter() - start, self._stepped)
                elif scheduler.prefill_tokens > queried:
                    computed = scheduler.prefill_tokens - queried - (scheduler.cached_tokens - cached)
                    self.steps = self.steps.add(False, time.perf_counter() - start, computed)
        except ChannelClosed:  # the front end is gone: nobody to serve
            return 0
        except BaseException as err:  # noqa: BLE001 - a failed step ends the engine with its reason
            if env_settings.read("KVBENCH_DEBUG"):
                traceback.print_exc()
            try:
                channel.send(Crashed(crash_reason(err)))
            except (ChannelClosed, OSError):
                pass
            return 1

    def _send(self, report: LoopReport) -> None:
        """``report`` with the tokens, ends and refusals since the last one."""
        report.out, self._out = self._out, []
        report.end, self._ends = self._ends, []
        report.fail, self._fails = self._fails, []
        self.channel.send(report)

    def _publish_events(self) -> None:
        if self.publisher is not None and self._events:
            self.publisher.publish(wire_events(self._events, self.manager.block_size))
            self._events.clear()

    def stats(self, now: float | None = None) -> EngineStats:
        """What /metrics, the progress line and the tests read of the engine (counts since it started), with the
        allocation latencies timed since the last call."""
        self._stats_at = time.perf_counter() if now is None else now
        session = self.session
        scheduler = session.scheduler
        manager = scheduler.manager
        pool = manager.pool
        alloc, self.alloc_seconds[:] = list(self.alloc_seconds), []
        return EngineStats(
            used=pool.num_used,
            free=pool.num_free,
            capacity=pool.num_blocks,
            block_size=pool.block_size,
            fragmentation=online_fragmentation(scheduler.used_slots(session.clock), scheduler.held_slots()),
            running=len(scheduler.running),
            waiting=len(scheduler.waiting),
            preemptions=scheduler.num_preemptions,
            finished=scheduler.num_finished,
            aborted=scheduler.num_aborted,
            tokens=self.tokens,
            prompt_tokens=self.prompt_tokens,
            peak_running=session.peak_running,
            prefix_queries=scheduler.prefill_tokens if manager.enable_prefix_caching else 0,
            prefix_hits=scheduler.cached_tokens,
            cached_blocks=manager.num_cached_blocks,
            alloc=alloc,
            steps=self.steps,
        )

    def _leak(self) -> str | None:
        """The KV manager's drained check while idle: None, or what leaked."""
        try:
            assert_drained(self.session.scheduler.manager, f"the {self.engine.name} server")
        except KVLeak as err:
            return str(err)
        return None

    # -- the front end's messages ---------------------------------------------------------------------------
    def _handle(self, message: Command) -> None:
        self.handled += 1
        self._reported_idle = False
        if isinstance(message, SubmitJob):
            self._submit(message)
        elif isinstance(message, AbortJob):
            job = self.jobs.get(message.job)
            if job is not None:
                self._abort(job, message.choices)
        elif isinstance(message, StopEngine):
            self.stopping = True
        elif isinstance(message, ResetPrefixCache):
            self._reset(message.id)
        else:
            raise KvbenchError(f"the front end sent a {type(message).__name__} message after the start")

    def _submit(self, message: SubmitJob) -> None:
        session = self.session
        job = CoreJob(message.job, message.wake)
        self.jobs[job.id] = job
        now = session.now()
        n = message.n
        fork = message.fork and n > 1
        for index, (ids, params) in enumerate(zip(message.prompts, message.params, strict=True)):
            if fork:  # the paged engine forks the samples of a prompt from one, sharing its prompt blocks
                requests = [(index * n, make_request(0, ids, params, num_samples=n))]
            else:
                requests = [
                    (
                        index * n + sample,  # the seeds a fork would give its samples
                        make_request(
                            0,
                            ids,
                            replace(params, seed=params.seed + sample)
                            if params.seed is not None and sample
                            else params,
                        ),
                    )
                    for sample in range(n)
                ]
            for first, request in requests:
                request.request_id = session.next_id  # ids come from the session: forks take theirs from it too
                self._owners[request.request_id] = (job, first)
                job.live[first] = request
                if not session.submit(request, now):
                    self._reject(request)
                    return

    def _reset(self, reset_id: int) -> None:
        """Empty the prefix cache (refused while a request holds blocks, as vLLM refuses) and say so."""
        done = self.manager.reset_prefix_cache()
        self._publish_events()
        self._send(ResetDone(id=reset_id, ok=done))

    def _abort(self, job: CoreJob, choices: list[int] | None) -> None:
        for choice, request in list(job.live.items()):
            if choices is None or choice in choices:
                self.session.abort(request)
                del job.live[choice]
                self._owners.pop(request.request_id, None)
        if not job.live:
            self.jobs.pop(job.id, None)

    # -- the engine's results -------------------------------------------------------------------------------
    def _on_tokens(self, emitted: list[tuple[Request, int]]) -> None:
        """The session's hook after each step: every token to its job's choice."""
        out, owners = self._out, self._owners
        self._stepped += len(emitted)
        ended = []
        for request, token in emitted:
            owner = owners.get(request.request_id)
            if owner is None:
                if request.parent_id is None or request.parent_id not in owners:
                    continue  # withdrawn already
                owner = owners[request.parent_id]  # a sample forked from its parent this step
                owners[request.request_id] = owner
                owner[0].live[owner[1] + request.sample_index] = request
            job, first = owner
            choice = first + request.sample_index
            if request.parent_id is None and len(request.output_token_ids) == 1:
                self.prompt_tokens += request.prompt_len  # its prefill is done
                job.cached.setdefault(first, request.num_cached_tokens)
            if request.stop_reason is None:
                if job.wake:
                    out += (job.id, choice, token)
                continue
            ended.append(request)  # forgotten after the loop: a sample forked this step finds its parent
            stop = request.output_token_ids[-1] if request.stop_reason == "stop" else None
            self._ends.append(
                ChoiceEnd(
                    job.id,
                    choice,
                    [token] if job.wake else request.output_token_ids,
                    FINISH_REASONS[request.stop_reason],
                    stop,
                    job.cached.get(choice),
                )
            )
        for request in ended:
            job, first = owners.pop(request.request_id)
            del job.live[first + request.sample_index]
            if not job.live:
                self.jobs.pop(job.id, None)
        self.tokens += len(emitted)

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
            status, message = (
                503,
                (
                    "the KV cache cannot hold this request now (the contiguous engine reserves its "
                    "whole length up front and admission is reject): retry later"
                ),
            )
        else:
            status, message = 400, f"the request cannot run: {request.reject_reason}"
        self._fails.append(JobFailure(job.id, status, message))


# -- the process ----------------------------------------------------------------------------------------------
def crash_reason(err: BaseException) -> str:
    """A failure in one line: the exception and where it was raised (the full traceback with ``KVBENCH_DEBUG=1``
    in the environment)."""
    frames = traceback.extract_tb(err.__traceback__)
    where = f" (at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno} in {frames[-1].name})" if frames else ""
    text = " ".join(str(err).split())  # a message of several lines stays one line
    return f"{type(err).__name__}: {text}{where}"


def _die_with_parent(parent_pid: int) -> None:
    """Never outlive the front end: the kernel kills this process when its parent ends (Linux)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        except (OSError, AttributeError):  # no prctl: the closed channel ends the loop instead
            pass
    if os.getppid() != parent_pid:  # the parent ended before the line above
        os._exit(0)


def ready_info(served: ServedEngine, engine: LLMEngine, publisher: KvEventPublisher | None = None) -> EngineFacts:
    """What the front end needs of the engine it serves (the tokenizer it loads itself)."""
    config = served.config
    return EngineFacts(
        name=served.info.name,
        max_len=served.info.max_len,
        vocab_size=served.info.vocab_size,
        parallel_sampling=served.info.parallel_sampling,
        engine=engine.name,
        device_name=served.device_name,
        budget_source=served.budget_source,
        threads=served.threads,
        heap=policy.describe() if (policy := engine.runner.heap_policy) else None,
        num_blocks=config.num_blocks,
        block_size=config.block_size,
        reserve=config.reserve,
        admission=config.admission,
        pid=os.getpid(),
        kv_events=publisher.endpoint if publisher else None,
        kv_events_replay=publisher.replay_endpoint if publisher else None,
    )


def main(argv: list[str]) -> int:
    from kvbench.serve.settings import load_served_engine

    fd, parent_pid = int(argv[0]), int(argv[1])
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    sock = socket.socket(fileno=fd)
    try:  # room for many steps' messages: a front end busy for a moment never holds up the next step
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, SEND_BUFFER_BYTES)
    except OSError:
        pass
    channel = BlockingChannel(sock, decode_command)
    try:
        start, *pending = channel.receive(wait=True)
        try:
            if not isinstance(start, StartEngine):
                raise KvbenchError(f"the front end sent a {type(start).__name__} message before the start")
            options = start.options
            served = load_served_engine(options, lambda text: channel.send(LoadStatus(text)))
        except KvbenchError as err:
            channel.send(LoadFailed(str(err), err.exit_code))
            return err.exit_code
        except Exception as err:  # noqa: BLE001 - a loader's failure is one line for the front end to print
            if env_settings.read("KVBENCH_DEBUG"):
                traceback.print_exc()
            channel.send(LoadFailed(f"the engine process failed while loading: {crash_reason(err)}", 1))
            return 1
        publisher = None
        if options.kv_events is not None:
            try:
                publisher = KvEventPublisher(options.kv_events, options.kv_events_replay)
            except OSError as err:
                channel.send(LoadFailed(str(err), 2))
                return 2
        core = EngineCore(served.engine, channel, timed=start.metrics, publisher=publisher)
        channel.send(Ready(info=ready_info(served, served.engine, publisher), stats=core.stats()))
    except ChannelClosed:
        return 0
    try:
        return core.run(pending)
    finally:
        if publisher is not None:
            publisher.close()


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # nothing to save, and the interpreter's last collection over torch's objects takes seconds
