"""An OpenAI-compatible completions server that streams instantly, for measuring a load generator's own cost.

It answers every ``POST /v1/completions`` (any path) with a pre-built stream of ``--tokens`` token events,
``usage`` and ``[DONE]``, over HTTP/1.1 keep-alive with chunked encoding; ``/v1/models`` lists one model. No
model, no parsing of the JSON body: the server does as little as possible, so the client is what is measured.
``--write separate`` writes each event with its own call (a server that flushes per token), ``together``
writes the whole stream at once.

It is an asyncio protocol, not an HTTP framework, only because a framework's per-request cost would hide the
client's; the client under test uses aiohttp. Listens on 127.0.0.1 only; prints ``PORT <n>`` when ready.

    python benchmarks/instant_server.py --tokens 16 --write together [--cpu 1]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os


def stream_chunks(tokens: int) -> list[bytes]:
    """The response body as HTTP chunks: one per SSE event, then the last chunk."""
    events = []
    for k in range(tokens):
        finish = "length" if k == tokens - 1 else None
        events.append(
            {
                "id": "cmpl-0",
                "object": "text_completion",
                "model": "instant",
                "choices": [{"index": 0, "text": f" t{k}", "logprobs": None, "finish_reason": finish}],
            }
        )
    events.append(
        {
            "id": "cmpl-0",
            "object": "text_completion",
            "model": "instant",
            "choices": [],
            "usage": {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": 8 + tokens},
        }
    )
    data = [b"data: " + json.dumps(e, separators=(",", ":")).encode() + b"\n\n" for e in events]
    data.append(b"data: [DONE]\n\n")
    return [f"{len(d):x}\r\n".encode() + d + b"\r\n" for d in data] + [b"0\r\n\r\n"]


HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n"
    b"Connection: keep-alive\r\n\r\n"
)
MODELS = json.dumps({"object": "list", "data": [{"id": "instant", "object": "model"}]}).encode()


class Instant(asyncio.Protocol):
    def __init__(self, chunks: list[bytes], separate: bool) -> None:
        self.chunks = chunks
        self.together = HEAD + b"".join(chunks)
        self.separate = separate
        self.buffer = b""

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            length = 0
            for line in head.split("\r\n")[1:]:
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            if len(self.buffer) < end + 4 + length:
                return
            self.buffer = self.buffer[end + 4 + length :]
            if head.startswith("GET /v1/models"):
                self.transport.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: "
                    + str(len(MODELS)).encode()
                    + b"\r\n\r\n"
                    + MODELS
                )
            elif head.startswith("GET"):
                self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            elif self.separate:
                self.transport.write(HEAD)
                for chunk in self.chunks:
                    self.transport.write(chunk)
            else:
                self.transport.write(self.together)


async def serve(tokens: int, separate: bool) -> None:
    loop = asyncio.get_running_loop()
    chunks = stream_chunks(tokens)
    server = await loop.create_server(lambda: Instant(chunks, separate), "127.0.0.1", 0, backlog=1024)
    print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--write", choices=("separate", "together"), default="together")
    parser.add_argument("--cpu", type=int, default=None, help="pin the server to this CPU")
    args = parser.parse_args()
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    asyncio.run(serve(args.tokens, args.write == "separate"))


if __name__ == "__main__":
    main()
