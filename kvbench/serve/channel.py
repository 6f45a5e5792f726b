"""The channel between the HTTP front end and its engine process: messages in length-prefixed frames over a
Unix stream socket pair.

Why this encoding: both ends are kvbench, but a message is data, never code, so nothing is unpickled (a frame is
4 bytes of length, big-endian, then one message as JSON in UTF-8, ``serve/engine_messages.py``); JSON holds every
message's parts (token ids, reasons, counts, error text) and encodes a step's message in microseconds (a list of
plain ints per step). Each end decodes frames into the messages it takes, so a frame that is none is refused there.
Why a socket pair: it is inherited by the engine process as one file descriptor, it is duplex, and the front
end reads and writes it through asyncio's transports, so the event loop never blocks on the engine (the engine
process, which may block, uses the plain socket: ``BlockingChannel``). The end of either process closes its end:
the other reads EOF.
"""

from __future__ import annotations

import asyncio
import select
import socket
import struct
from collections.abc import Callable
from typing import Generic, TypeVar

from kvbench.serve.engine_messages import Command, Report, encode

HEADER = struct.Struct(">I")
MAX_FRAME = 1 << 30  # a frame past this is a broken stream, not a message

In = TypeVar("In")  # the messages an end takes


class ChannelClosed(Exception):
    """The other end closed the channel (its process ended)."""


class ChannelError(Exception):
    """The stream holds something that is not a frame of ours."""


def frame(message: Command | Report) -> bytes:
    """One frame: the length of the message's JSON, then the JSON."""
    payload = encode(message)
    return HEADER.pack(len(payload)) + payload


class FrameBuffer(Generic[In]):
    """Bytes as they arrive -> the complete messages among them (a frame may arrive in pieces), each decoded by
    ``decode`` (which raises ``ValueError`` for a frame that holds none)."""

    def __init__(self, decode: Callable[[bytes], In]) -> None:
        self._data = bytearray()
        self._decode = decode

    def feed(self, data: bytes) -> list[In]:
        buffer = self._data
        buffer += data
        messages: list[In] = []
        at, size = 0, len(buffer)
        while size - at >= 4:
            (length,) = HEADER.unpack_from(buffer, at)
            if length > MAX_FRAME:
                raise ChannelError(f"a frame of {length} bytes is not one of ours")
            end = at + 4 + length
            if end > size:
                break
            try:
                messages.append(self._decode(bytes(buffer[at + 4 : end])))
            except ValueError as err:  # broken JSON or UTF-8, or no message of ours
                raise ChannelError(f"a frame that is not a message: {err}") from None
            at = end
        if at:
            del buffer[:at]
        return messages


class BlockingChannel(Generic[In]):
    """The engine process's end: ``send`` writes a frame (blocking while the front end's buffer is full),
    ``receive`` returns the messages that arrived (waiting for one when ``wait``)."""

    def __init__(self, sock: socket.socket, decode: Callable[[bytes], In]) -> None:
        self.sock = sock
        self._frames = FrameBuffer(decode)

    def send(self, message: Command | Report) -> None:
        try:
            self.sock.sendall(frame(message))
        except (BrokenPipeError, ConnectionResetError) as err:
            raise ChannelClosed(str(err)) from None

    def receive(self, wait: bool) -> list[In]:
        """Every message that has arrived; with ``wait``, block until at least one has."""
        messages: list[In] = []
        while True:
            ready = select.select([self.sock], [], [], None if wait and not messages else 0)[0]
            if not ready:
                return messages
            try:
                data = self.sock.recv(1 << 20)
            except ConnectionResetError:
                data = b""
            if not data:
                raise ChannelClosed("the front end closed the channel")
            messages += self._frames.feed(data)
            if messages and not wait:
                return messages

    def close(self) -> None:
        self.sock.close()


class FrameProtocol(asyncio.Protocol, Generic[In]):
    """The front end's end, on its event loop: each arriving message goes to ``on_message``; the end of the
    stream (or a broken one) to ``on_closed`` with the reason."""

    def __init__(
        self,
        decode: Callable[[bytes], In],
        on_message: Callable[[In], None],
        on_closed: Callable[[str | None], None],
    ) -> None:
        self.on_message = on_message
        self.on_closed = on_closed
        self.transport: asyncio.Transport | None = None
        self._frames = FrameBuffer(decode)
        self._closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        try:
            messages = self._frames.feed(data)
        except ChannelError as err:
            self._close(str(err))
            return
        for message in messages:
            self.on_message(message)

    def eof_received(self) -> bool:
        self._close(None)
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._close(str(exc) if exc is not None else None)

    def send(self, message: Command | Report) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame(message))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _close(self, reason: str | None) -> None:
        if not self._closed:
            self._closed = True
            if self.transport is not None:
                self.transport.close()
            self.on_closed(reason)
