"""HTTP servers that misbehave on purpose, on 127.0.0.1 and a free port, for the tests of kvbench's HTTP client
(``kvbench.measure.http_fetch``) and of the commands that scrape (``diagnose --metrics-url``, ``watch --metrics-url``).

``RawServer(handler)`` accepts connections in a thread and hands each (socket, request bytes, stop event) to
``handler``, which writes whatever bytes it likes: a stalled body, a bad status line, a Content-Length it does
not keep, a redirect loop. Leaving the ``with`` block stops the server and every handler still writing.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable

Handler = Callable[[socket.socket, bytes, threading.Event], None]


class RawServer:
    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.stop = threading.Event()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.1)
        self.port = self.listener.getsockname()[1]
        self.requests: list[bytes] = []
        self._threads: list[threading.Thread] = []

    def url(self, path: str = "/metrics") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self) -> RawServer:
        thread = threading.Thread(target=self._accept, daemon=True)
        thread.start()
        self._threads.append(thread)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.listener.close()
        for thread in self._threads:
            thread.join(timeout=5)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                connection, _ = self.listener.accept()
            except (TimeoutError, OSError):
                continue
            thread = threading.Thread(target=self._serve, args=(connection,), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _serve(self, connection: socket.socket) -> None:
        with connection:
            connection.settimeout(5)
            request = b""
            try:
                while b"\r\n\r\n" not in request:
                    chunk = connection.recv(4096)
                    if not chunk:
                        return
                    request += chunk
                self.requests.append(request)
                self.handler(connection, request, self.stop)
            except OSError:  # the client gave up: what these servers are for
                pass


def path_of(request: bytes) -> str:
    return request.split(b" ", 2)[1].decode("ascii", "replace")


def respond(
    body: str | bytes, status: str = "200 OK", headers: dict[str, str] | None = None, content_length: int | None = None
) -> Handler:
    """A plain answer; ``content_length`` may lie about the body."""
    data = body.encode() if isinstance(body, str) else body

    def handler(connection: socket.socket, _request: bytes, _stop: threading.Event) -> None:
        head = {
            "Content-Type": "text/plain; version=0.0.4",
            "Content-Length": str(len(data) if content_length is None else content_length),
            "Connection": "close",
            **(headers or {}),
        }
        connection.sendall(
            f"HTTP/1.1 {status}\r\n".encode()
            + b"".join(f"{k}: {v}\r\n".encode() for k, v in head.items())
            + b"\r\n"
            + data
        )

    return handler


def trickle(line: bytes = b"# still here\n", every_s: float = 2.0) -> Handler:
    """Headers at once, then one line of body every ``every_s`` seconds, for ever (each read is quick)."""

    def handler(connection: socket.socket, _request: bytes, stop: threading.Event) -> None:
        connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked\r\n\r\n")
        while not stop.wait(every_s):
            connection.sendall(f"{len(line):x}\r\n".encode() + line + b"\r\n")

    return handler


def raw(data: bytes) -> Handler:
    """Exactly ``data`` on the wire (a malformed status line, ...), then the connection closed."""

    def handler(connection: socket.socket, _request: bytes, _stop: threading.Event) -> None:
        connection.sendall(data)

    return handler


def redirects(targets: dict[str, str], status: str = "302 Found") -> Handler:
    """``path -> Location``; a path not listed is a 404."""

    def handler(connection: socket.socket, request: bytes, stop: threading.Event) -> None:
        path = path_of(request)
        if path in targets:
            respond("", status, {"Location": targets[path]})(connection, request, stop)
        else:
            respond("not here", "404 Not Found")(connection, request, stop)

    return handler
