"""Server-sent events (the HTML living standard's ``text/event-stream``), decoded incrementally from the bytes
of a streamed HTTP response as they arrive.

Only what OpenAI-compatible servers use is kept: the ``data`` field of each event (several ``data:`` lines of one
event are joined with newlines), comments (``: ping``) and other fields (``event:``, ``id:``, ``retry:``) are
skipped, and an event without data is no event. Lines may end in LF, CRLF or CR, split anywhere across chunks.

An event that never ends (no blank line within :data:`MAX_EVENT_BYTES`) or that is not UTF-8 is a
:class:`MalformedStream`: the stream cannot be trusted from there on.
"""

from __future__ import annotations

MAX_EVENT_BYTES = 4 << 20  # one event of a token stream is a few hundred bytes; this is not a stream of events


class MalformedStream(ValueError):
    """The response is not a well-formed event stream (or not the one the protocol promises)."""


class SSEDecoder:
    """Feed it the response's chunks; each call returns the data of the events the chunk completed."""

    __slots__ = ("_buffer", "_pending_cr")

    def __init__(self) -> None:
        self._buffer = b""
        self._pending_cr = False  # the last chunk ended in CR: a LF at the start of the next one belongs to it

    def feed(self, chunk: bytes) -> list[str]:
        if not chunk:  # nothing new: a pending CR still waits for the LF that may follow it
            return []
        if self._pending_cr:
            self._pending_cr = False
            if chunk.startswith(b"\n"):
                chunk = chunk[1:]
        if b"\r" in chunk:
            self._pending_cr = chunk.endswith(b"\r")
            chunk = chunk.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        buffer = self._buffer + chunk if self._buffer else chunk
        if b"\n\n" not in buffer:
            if len(buffer) > MAX_EVENT_BYTES:
                raise MalformedStream(f"an event longer than {MAX_EVENT_BYTES >> 20} MiB without an end")
            self._buffer = buffer
            return []
        *events, self._buffer = buffer.split(b"\n\n")
        if len(self._buffer) > MAX_EVENT_BYTES:  # the rest, after the events this chunk completed, is held too
            raise MalformedStream(f"an event longer than {MAX_EVENT_BYTES >> 20} MiB without an end")
        out = []
        for event in events:
            data = _event_data(event)
            if data is not None:
                out.append(data)
        return out

    def close(self) -> list[str]:
        """At the end of the response: the data of a last event that lacks its closing blank line, when it is
        a whole ``data: [DONE]`` (which some servers send so); any other unfinished event is discarded, as the
        standard says, and the caller learns from the missing end that the stream was cut."""
        rest, self._buffer = self._buffer, b""
        data = _event_data(rest.rstrip(b"\n")) if rest.strip() else None
        return [data] if data == "[DONE]" else []

    @property
    def pending(self) -> bool:
        """Bytes of an unfinished event are waiting."""
        return bool(self._buffer.strip())


def _event_data(event: bytes) -> str | None:
    if event.startswith(b"data: ") and b"\n" not in event:  # the common case: one data line
        payload = event[6:]
    else:
        lines = []
        for line in event.split(b"\n"):
            if line.startswith(b"data:"):
                value = line[5:]
                lines.append(value[1:] if value.startswith(b" ") else value)
            elif line == b"data":  # a field name without a colon: the empty value
                lines.append(b"")
        if not lines:
            return None
        payload = b"\n".join(lines)
    try:
        return payload.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedStream("an event is not UTF-8 text") from None
