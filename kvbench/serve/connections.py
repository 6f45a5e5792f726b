"""What one client may hold of the server: open connections, time to send its headers, time to send its body.

aiohttp by itself keeps a connection whose headers never end for an hour and has no cap on open connections, so
a few hundred idle sockets (or one slow client per file descriptor) would starve real requests. Here a connection
past the cap is answered 503 and closed at once, headers must be complete within ``header_timeout_s`` of opening
(or of the previous answer on a kept-alive connection: aiohttp's keep-alive deadline covers both), and a body must
arrive within ``body_timeout_s`` (``read_body``), so a body shorter than its Content-Length ends in a 408.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from aiohttp import web
from aiohttp.web_protocol import RequestPayloadError

from kvbench.measure.http_fetch import within
from kvbench.serve.protocol import ApiError


def _busy_answer() -> bytes:
    body = json.dumps(ApiError(503, "the server holds too many open connections").body()).encode()
    head = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    return f"{head}Connection: close\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body


BUSY_ANSWER = _busy_answer()


@dataclass(frozen=True)
class ConnectionLimits:
    """The server's limits on clients (the defaults hold every benchmark here, whose clients open at most a few
    hundred connections and send a request as soon as one is open)."""

    max_connections: int = 1024
    header_timeout_s: float = 15.0
    body_timeout_s: float = 30.0


async def read_body(request: web.BaseRequest, limits: ConnectionLimits) -> bytes:
    """The request's body; a 408 when it has not all arrived within the limit."""
    try:
        return await within(request.read(), limits.body_timeout_s)  # a body already here is read at once
    except (TimeoutError, asyncio.TimeoutError):
        raise ApiError(408, f"the request body did not arrive within {limits.body_timeout_s:g}s") from None
    except RequestPayloadError as err:  # a body aiohttp cannot decode (gzip that is not): the client's, a 400
        said = " ".join(str(err).split()).removeprefix("400, message: ")
        raise ApiError(400, f"the request body cannot be read: {said}") from None


class _Counted(asyncio.Protocol):
    """aiohttp's protocol for one connection, refused at once when the server already holds its limit."""

    def __init__(self, inner: asyncio.Protocol, site: LimitedSite) -> None:
        self._inner = inner
        self._site = site
        self._admitted = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        site = self._site
        if site.open_connections >= site.limits.max_connections:
            site.refused_connections += 1
            assert isinstance(transport, asyncio.Transport)
            transport.write(BUSY_ANSWER)
            transport.close()
            return
        self._admitted = True
        site.open_connections += 1
        self._inner.connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._admitted:
            self._admitted = False
            self._site.open_connections -= 1
            self._inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._admitted:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._admitted else None

    def pause_writing(self) -> None:
        if self._admitted:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._admitted:
            self._inner.resume_writing()


class LimitedSite(web.BaseSite):
    """A TCP site whose connections are counted against ``limits.max_connections``."""

    def __init__(self, runner: web.AppRunner, host: str, port: int, limits: ConnectionLimits) -> None:
        super().__init__(runner)
        self._app_runner = runner
        self._address = (host, port)
        self.limits = limits
        self.open_connections = 0
        self.refused_connections = 0
        self._listener: asyncio.Server | None = None

    @property
    def name(self) -> str:
        host, port = self._address
        return f"http://{f'[{host}]' if ':' in host else host}:{port}"

    @property
    def port(self) -> int:
        """The port bound (the one picked when 0 was asked for)."""
        assert self._listener is not None and self._listener.sockets, "start() comes first"
        return int(self._listener.sockets[0].getsockname()[1])

    async def start(self) -> None:
        await super().start()
        factory = self._app_runner.server
        assert factory is not None, "the runner is set up first"
        host, port = self._address
        loop = asyncio.get_running_loop()
        self._listener = await loop.create_server(lambda: _Counted(factory(), self), host, port, reuse_address=True)

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.close()
        await super().stop()
