"""A server's life: start (the engine process, the HTTP site), serve until told to stop, and stop gracefully.

Stopping (SIGTERM, Ctrl-C, or ``ServerThread.stop``): new requests are refused with 503 and ``/health`` turns
503 at once; requests in flight run on for up to the grace period; what is left then is withdrawn from the
engine and answered with a 503 error (a streamed one gets an error event and ``[DONE]``), so no request ends
without an answer. Then the HTTP site closes, the engine process ends, and the KV manager's drained check (run
by the engine as it stops) is checked: a leaked block is an error, never silence. A second signal skips what is
left of the grace period. An engine process that fails or is killed stops the server too: the requests in flight
get a 500 with the reason, and ``serve_until_signalled`` raises ``EngineDied`` (exit code 1).
"""

from __future__ import annotations

import asyncio
import errno
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kvbench.errors import KvbenchError
from kvbench.serve.app import ServerState, build_app, log
from kvbench.serve.connections import ConnectionLimits, LimitedSite
from kvbench.serve.engine_client import EngineClient, EngineDied, EngineInfo
from kvbench.serve.protocol import ApiError
from kvbench.serve.settings import ServeOptions


@dataclass
class ShutdownReport:
    """How a stop went: requests that finished in the grace period, and those withdrawn after it."""

    finished_in_grace: int
    aborted: int
    seconds: float


def listen_error(host: str, port: int, err: OSError) -> KvbenchError:
    if err.errno == errno.EADDRINUSE:
        return KvbenchError(f"port {port} on {host} is already in use")
    return KvbenchError(f"cannot listen on {host}:{port}: {err.strerror or err}")


def check_listenable(host: str, port: int) -> None:
    """Bind ``host:port`` for a moment, so that an address this machine does not have (or a port in use) is
    refused before the model loads, and before any warning about who could reach it."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as err:
        raise KvbenchError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the site binds it
        try:
            probe.bind(address)
        except OSError as err:
            raise listen_error(host, port, err) from None


class Server:
    """The engine process and the HTTP site on one event loop."""

    def __init__(
        self,
        options: ServeOptions,
        host: str = "127.0.0.1",
        port: int = 8000,
        metrics: bool = True,
        on_status: Callable[[str], Any] | None = None,
        limits: ConnectionLimits = ConnectionLimits(),
    ) -> None:
        self.options = options
        self.host = host
        self.port = port
        self.limits = limits
        self.engine = EngineClient(options, metrics, on_status)
        self.state: ServerState | None = None
        self._runner: web.AppRunner | None = None
        self.site: LimitedSite | None = None
        self._stopped: ShutdownReport | None = None

    @property
    def info(self) -> EngineInfo:
        info = self.engine.info
        assert info is not None, "start() comes first"
        return info

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Start the engine process, then bind the HTTP site once the model is loaded (``port`` 0 picks a free
        one)."""
        engine = self.engine
        info = await engine.start()
        self.state = ServerState(info.model, engine, engine.metrics, limits=self.limits)
        runner = web.AppRunner(
            build_app(self.state),
            handler_cancellation=True,
            access_log=None,
            shutdown_timeout=5.0,
            keepalive_timeout=self.limits.header_timeout_s,  # also bounds the wait for a new connection's headers
        )
        await runner.setup()
        site = LimitedSite(runner, self.host, self.port, self.limits)
        try:
            await site.start()
        except OSError as err:
            await runner.cleanup()
            await engine.stop()
            raise listen_error(self.host, self.port, err) from None
        self._runner = runner
        self.site = site
        self.port = site.port  # the one picked for port 0

    async def shutdown(self, grace_s: float, hurry: asyncio.Event | None = None) -> ShutdownReport:
        """Stop admitting, let requests in flight finish for ``grace_s`` (or until ``hurry`` is set), withdraw
        the rest with a 503, close the site and the engine process, and check that every KV block is back. An
        engine that died raises ``EngineDied`` once the site is closed."""
        start = time.perf_counter()
        state, engine = self.state, self.engine
        if self._stopped is not None:  # stopped already: the same report
            return self._stopped
        assert state is not None, "start() comes first"
        state.draining = True
        before = len(engine.jobs)
        deadline = start + grace_s
        while engine.jobs and engine.alive and time.perf_counter() < deadline and not (hurry and hurry.is_set()):
            await asyncio.sleep(0.02)
        aborted = len(engine.jobs)
        if aborted:
            engine.abort_all(ApiError(503, "the server shut down before this request finished"))
        until = time.perf_counter() + 5.0  # the handlers write their error answers
        while engine.jobs and time.perf_counter() < until:
            await asyncio.sleep(0.01)
        if self._runner is not None:
            await self._runner.cleanup()
        await engine.stop()
        if engine.error is not None:
            raise EngineDied(engine.error)
        engine.check_drained()
        self._stopped = ShutdownReport(before - aborted, aborted, time.perf_counter() - start)
        return self._stopped


async def serve_until_signalled(
    server: Server, grace_s: float, on_ready: Callable[[Server], None] | None = None, log_interval_s: float = 10.0
) -> ShutdownReport:
    """Run ``server`` until SIGTERM or SIGINT, then shut it down gracefully (a second signal hurries it). For the
    command line: the process is about to exit, so both signals are ignored once the server has stopped."""
    await server.start()
    loop = asyncio.get_running_loop()
    stop, hurry = asyncio.Event(), asyncio.Event()

    def on_signal(name: str) -> None:
        if stop.is_set():
            log.warning("%s again: withdrawing the requests still running", name)
            hurry.set()
        else:
            log.info("%s: no new requests; finishing those in flight (up to %gs)", name, grace_s)
            stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig.name)
    if on_ready is not None:
        on_ready(server)
    reporter = asyncio.create_task(_report_periodically(server, log_interval_s)) if log_interval_s > 0 else None
    stopping, dying = asyncio.create_task(stop.wait()), asyncio.create_task(server.engine.dead.wait())
    try:
        await asyncio.wait([stopping, dying], return_when=asyncio.FIRST_COMPLETED)
        # an engine that died: shutdown answers the requests in flight (500) and raises EngineDied, whose reason
        # is the one line the command prints
        return await server.shutdown(grace_s, hurry)
    finally:
        for task in (reporter, stopping, dying):
            if task is not None:
                task.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):  # stopped: one more signal changes nothing, the process exits
            loop.remove_signal_handler(sig)
            signal.signal(sig, signal.SIG_IGN)


async def _report_periodically(server: Server, every_s: float) -> None:
    """A line of what the engine did, every ``every_s`` seconds in which it did something."""
    engine = server.engine
    last_tokens, last_time = engine.stats.tokens, time.perf_counter()
    while True:
        await asyncio.sleep(every_s)
        now, stats = time.perf_counter(), engine.stats
        if stats.tokens == last_tokens and not engine.jobs:
            continue
        log.info(
            "generation %.1f tok/s; requests running %d, waiting %d; KV blocks used %d of %d (%.0f%%)",
            (stats.tokens - last_tokens) / (now - last_time),
            stats.running,
            stats.waiting,
            stats.used,
            stats.capacity,
            100 * stats.usage,
        )
        last_tokens, last_time = stats.tokens, now


class ServerThread:
    """A server on an event loop of its own thread (tests, benchmarks): ``start()``, ``url``, ``stop()``."""

    def __init__(self, server: Server) -> None:
        self.server = server
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="kvbench-serve-loop", daemon=True)

    def start(self, timeout: float = 300.0) -> ServerThread:
        self._thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(timeout)
        except BaseException:
            self._close_loop()
            raise
        return self

    @property
    def url(self) -> str:
        return self.server.url

    def call(self, function: Callable, *args):
        """Run ``function(*args)`` on the server's event loop and return its result."""

        async def run():
            return function(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(timeout=30)

    def stop(self, grace_s: float = 5.0) -> ShutdownReport:
        try:
            return asyncio.run_coroutine_threadsafe(self.server.shutdown(grace_s), self.loop).result(grace_s + 60)
        finally:
            self._close_loop()

    def _close_loop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=10)
        self.loop.close()
