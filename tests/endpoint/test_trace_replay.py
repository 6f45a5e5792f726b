"""A hash-id trace replayed over HTTP: the synthesised prompts reach the server at their arrival times, and each
answer's cached tokens are read in vLLM's shape, or left unknown (never 0) when the server does not say."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

from aiohttp import web

from kvbench.endpoint.trace_replay import replay_trace, usage_counts
from kvbench.workload.prefix_trace import PrefixTrace, TraceRequest, prompt_token_ids


@contextmanager
def completions_server(report_cached: bool) -> Iterator[tuple[str, list[tuple[float, list[int]]]]]:
    """A server on 127.0.0.1 that answers /v1/completions at once, counting as cached the leading 16-token blocks
    of each prompt that an earlier prompt had."""
    seen: set[tuple[int, ...]] = set()
    received: list[tuple[float, list[int]]] = []
    ready = threading.Event()
    state: dict = {}

    async def complete(request: web.Request) -> web.Response:
        body = await request.json()
        prompt = body["prompt"]
        received.append((time.perf_counter(), prompt))
        cached = 0
        for end in range(16, len(prompt), 16):
            if tuple(prompt[:end]) not in seen:
                break
            cached = end
        seen.update(tuple(prompt[:end]) for end in range(16, len(prompt) + 1, 16))
        usage: dict = {"prompt_tokens": len(prompt), "completion_tokens": body["max_tokens"]}
        if report_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": cached}
        return web.json_response({"choices": [{"text": "x"}], "usage": usage})

    async def serve() -> None:
        app = web.Application()
        app.router.add_post("/v1/completions", complete)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        state["port"] = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        state["stop"] = asyncio.Event()
        ready.set()
        await state["stop"].wait()
        await runner.cleanup()

    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield f"http://127.0.0.1:{state['port']}", received
    finally:
        loop.call_soon_threadsafe(state["stop"].set)
        thread.join(timeout=10)


def trace() -> PrefixTrace:
    rows = [(0.0, (1, 2, 3)), (0.2, (1, 2, 4)), (0.4, (5,)), (0.6, (1, 2, 3, 6))]
    return PrefixTrace(tuple(TraceRequest(t, 16 * len(ids), 3, ids) for t, ids in rows), 16, "test")


def test_the_prompts_arrive_on_time_and_their_cached_tokens_are_read():
    with completions_server(report_cached=True) as (url, received):
        replayed = replay_trace(url, trace(), vocab_size=1000, model="m")
    assert [r.error for r in replayed] == [None] * 4
    assert [r.cached_tokens for r in replayed] == [0, 32, 0, 48]
    assert [r.prompt_tokens for r in replayed] == [48, 48, 16, 64]
    sent = sorted(received)
    assert [prompt for _, prompt in sent] == [prompt_token_ids(r, 16, 1000) for r in trace().requests]
    offsets = [t - sent[0][0] for t, _ in sent]
    assert all(abs(offset - expected) < 0.15 for offset, expected in zip(offsets, (0.0, 0.2, 0.4, 0.6), strict=True))


def test_a_server_that_does_not_say_leaves_cached_tokens_unknown():
    with completions_server(report_cached=False) as (url, _):
        replayed = replay_trace(url, trace(), vocab_size=1000, model="m")
    assert [r.cached_tokens for r in replayed] == [None] * 4


def test_usage_counts_in_odd_shapes():
    assert usage_counts(b'{"usage": {"prompt_tokens": 5, "prompt_tokens_details": {"cached_tokens": 4}}}') == (5, 4)
    assert usage_counts(b'{"usage": {"prompt_tokens": 5, "prompt_tokens_details": null}}') == (5, None)
    assert usage_counts(b'{"usage": {"prompt_tokens": -1}}') == (None, None)
    assert usage_counts(b"[" * 10_000) == (None, None)
    assert usage_counts(b"\xff") == (None, None)
