"""A small OpenAI-compatible server for the endpoint tests, well-behaved or misbehaving on purpose.

It streams ``/v1/completions`` and ``/v1/chat/completions`` (one SSE event per token, ``usage`` at the end,
``[DONE]``), serves vLLM-named ``/metrics`` (running and waiting requests, KV usage, preemptions, a prefix cache
simulated over 16-token blocks, prompt and generation token counters, a TTFT histogram), ``/v1/models`` and
``POST /reset_prefix_cache``. Faults are planned per request by arrival order (``faults``: a cycle of fault names,
"" for a normal request): ``500``, ``429``, ``stall`` (stops after ``fault_tokens`` tokens), ``close`` (drops the
connection after ``fault_tokens`` tokens), ``malformed`` (an event that is not JSON), ``badchunk`` (a chunk size
that is no number, then the connection closes), ``nested`` (an event nested 100,000 levels deep), ``error_event``
(an error inside the stream), ``no_done`` (ends without ``[DONE]`` or a finish reason), ``json`` (answers without
streaming). ``metrics_fail_after``: /metrics answers 503 after that many scrapes; ``metrics_stall_after``: it stops
answering. ``done_stall``: a complete stream whose body never ends.
``refuse_ignore_eos``: a request with ``ignore_eos`` gets a 400.

Run in a thread of the test process (:func:`serve_in_thread`) or as a process that can be killed
(``python fake_server.py CONFIG_JSON`` prints ``PORT <n>``). Listens on 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from aiohttp import web

BLOCK = 16
NESTED = b"[" * 100_000 + b"]" * 100_000  # JSON nested past any parser's recursion


@dataclass
class FakeConfig:
    ttft_s: float = 0.0
    itl_s: float = 0.0
    tokens: int | None = None  # tokens per answer; None: max_tokens
    usage: bool = True
    faults: list[str] = field(default_factory=list)
    fault_tokens: int = 2
    stall_s: float = 30.0
    metrics_fail_after: int | None = None
    offer_reset: bool = True
    capacity_blocks: int = 1000
    model: str = "fake-model"
    api_key: str | None = None  # when set, requests must carry it
    chunk_all: bool = False  # write the whole stream at once (the benchmark's instant server)
    refuse_ignore_eos: bool = False  # answer 400 to a request with ignore_eos, as a strict server does
    metrics_stall_after: int | None = None  # /metrics stops answering after that many scrapes
    token_text_bytes: int = 0  # padding on each token's text (a server whose events are huge)
    prompt_tokens_claim: int | None = None  # the usage's prompt_tokens, whatever the prompt was
    completion_tokens_claim: int | None = None  # the usage's completion_tokens, whatever was streamed
    models_nested: bool = False  # /v1/models answers JSON nested 100,000 levels deep
    announce: bool = False  # print "REQUEST <n>" as each completion request arrives (a process's stdout)


class FakeState:
    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.count = 0
        self.running = 0
        self.max_running = 0
        self.preemptions = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.ttft_sum = 0.0
        self.ttft_count = 0
        self.held_blocks = 0
        self.cached: set[tuple] = set()
        self.scrapes = 0
        self.resets = 0
        self.bodies: list[dict] = []
        self.headers: list[dict] = []
        self.peers: set[int] = set()  # the client ports requests came from (connections used)

    def prompt_ids(self, body: dict) -> list:
        if "messages" in body:
            text = "\n".join(f"{m['role']}: {m['content']}" for m in body["messages"])
            return text.split()
        prompt = body["prompt"]
        return list(prompt) if isinstance(prompt, list) else prompt.split()

    def prefix_lookup(self, ids: list) -> int:
        """Tokens of whole 16-token blocks whose prefix was seen before (vLLM counts hits in tokens)."""
        hits = 0
        for end in range(BLOCK, len(ids) + 1, BLOCK):
            key = tuple(ids[:end])
            if key in self.cached:
                hits = end
            else:
                self.cached.add(key)
        return hits


def metrics_text(state: FakeState) -> str:
    labels = f'engine="0",model_name="{state.config.model}"'
    usage = min(1.0, state.held_blocks / state.config.capacity_blocks)
    lines = [
        "# TYPE vllm:kv_cache_usage_perc gauge",
        f"vllm:kv_cache_usage_perc{{{labels}}} {usage}",
        "# TYPE vllm:num_requests_running gauge",
        f"vllm:num_requests_running{{{labels}}} {state.running}",
        "# TYPE vllm:num_requests_waiting gauge",
        f"vllm:num_requests_waiting{{{labels}}} 0",
        "# TYPE vllm:num_preemptions counter",
        f"vllm:num_preemptions_total{{{labels}}} {state.preemptions}",
        "# TYPE vllm:prefix_cache_queries counter",
        f"vllm:prefix_cache_queries_total{{{labels}}} {state.prefix_queries}",
        "# TYPE vllm:prefix_cache_hits counter",
        f"vllm:prefix_cache_hits_total{{{labels}}} {state.prefix_hits}",
        "# TYPE vllm:prompt_tokens counter",
        f"vllm:prompt_tokens_total{{{labels}}} {state.prompt_tokens}",
        "# TYPE vllm:generation_tokens counter",
        f"vllm:generation_tokens_total{{{labels}}} {state.generation_tokens}",
        "# TYPE vllm:time_to_first_token_seconds histogram",
        f'vllm:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {state.ttft_count}',
        f"vllm:time_to_first_token_seconds_count{{{labels}}} {state.ttft_count}",
        f"vllm:time_to_first_token_seconds_sum{{{labels}}} {state.ttft_sum}",
        "# TYPE vllm:cache_config_info gauge",
        f'vllm:cache_config_info{{block_size="{BLOCK}",engine="0",'
        f'num_gpu_blocks="{state.config.capacity_blocks + 1}"}} 1',
    ]
    return "\n".join(lines) + "\n"


def build_app(config: FakeConfig) -> tuple[web.Application, FakeState]:
    state = FakeState(config)
    app = web.Application()

    async def completions(request: web.Request) -> web.StreamResponse:
        if config.api_key is not None and request.headers.get("Authorization") != f"Bearer {config.api_key}":
            return web.json_response({"error": {"message": "bad key"}}, status=401)
        body = await request.json()
        if config.refuse_ignore_eos and "ignore_eos" in body:
            return web.json_response({"error": {"message": "Unrecognized request argument: ignore_eos"}}, status=400)
        state.bodies.append(body)
        state.headers.append(dict(request.headers))
        state.peers.add(request.transport.get_extra_info("peername")[1])
        number = state.count
        state.count += 1
        if config.announce:
            print(f"REQUEST {number}", flush=True)
        fault = config.faults[number % len(config.faults)] if config.faults else ""
        if fault in ("500", "429"):
            return web.json_response({"error": {"message": f"planned {fault}", "code": int(fault)}}, status=int(fault))
        chat = request.path.endswith("chat/completions")
        ids = state.prompt_ids(body)
        total = config.tokens or int(body.get("max_tokens") or 16)
        if fault == "json":
            return web.json_response({"choices": [{"text": "x"}]})
        received = time.perf_counter()
        state.running += 1
        state.max_running = max(state.max_running, state.running)
        blocks = (len(ids) + total + BLOCK - 1) // BLOCK
        state.held_blocks += blocks
        hits = state.prefix_lookup(ids)
        state.prefix_queries += len(ids)
        state.prefix_hits += hits
        state.prompt_tokens += len(ids)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        try:
            await response.prepare(request)
            if chat:  # the role announcement, before any token (to check it is not taken for one)
                await response.write(
                    b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n'
                )
            if config.ttft_s:
                await asyncio.sleep(config.ttft_s)
            out: list[bytes] = []

            def event(data: Any) -> bytes:
                return b"data: " + (data if isinstance(data, bytes) else json.dumps(data).encode()) + b"\n\n"

            for k in range(total):
                if (
                    fault in ("stall", "close", "malformed", "nested", "error_event", "badchunk")
                    and k == config.fault_tokens
                ):
                    if fault == "stall":
                        await response.write(b"".join(out))
                        await asyncio.sleep(config.stall_s)
                        return response
                    if fault == "close":
                        await response.write(b"".join(out))
                        request.transport.abort()
                        return response
                    if fault == "badchunk":  # a chunk size that is no number, then the connection closes
                        await response.write(b"".join(out))
                        request.transport.write(b"zz\r\nxx\r\n")
                        request.transport.close()
                        return response
                    if fault == "malformed":
                        out.append(b"data: {not json\n\n")
                        break
                    if fault == "nested":
                        out.append(event(NESTED))
                        break
                    out.append(event({"error": {"message": "planned error inside the stream", "code": 500}}))
                    break
                text = f" w{number}_{k}" + "x" * config.token_text_bytes
                finish = "length" if k == total - 1 and fault != "no_done" else None
                if chat:
                    chunk = {"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}]}
                else:
                    chunk = {"choices": [{"index": 0, "text": text, "finish_reason": finish}]}
                out.append(event(chunk))
                state.generation_tokens += 1
                if k == 0:
                    state.ttft_sum += time.perf_counter() - received
                    state.ttft_count += 1
                if not config.chunk_all:
                    await response.write(b"".join(out))
                    out.clear()
                    if config.itl_s and k < total - 1:
                        await asyncio.sleep(config.itl_s)
            if fault != "no_done":
                if config.usage:
                    out.append(
                        event(
                            {
                                "choices": [],
                                "usage": {
                                    "prompt_tokens": config.prompt_tokens_claim or len(ids),
                                    "completion_tokens": total
                                    if config.completion_tokens_claim is None
                                    else config.completion_tokens_claim,
                                    "total_tokens": len(ids) + total,
                                },
                            }
                        )
                    )
                out.append(b"data: [DONE]\n\n")
            await response.write(b"".join(out))
            if fault == "done_stall":  # the stream is complete, but the body never ends
                await asyncio.sleep(config.stall_s)
            await response.write_eof()
            return response
        finally:
            state.running -= 1
            state.held_blocks -= blocks

    async def metrics(request: web.Request) -> web.Response:
        state.scrapes += 1
        if config.metrics_fail_after is not None and state.scrapes > config.metrics_fail_after:
            return web.Response(status=503, text="gone")
        if config.metrics_stall_after is not None and state.scrapes > config.metrics_stall_after:
            await asyncio.sleep(config.stall_s)
        return web.Response(text=metrics_text(state), content_type="text/plain")

    async def models(request: web.Request) -> web.Response:
        if config.models_nested:
            return web.Response(body=NESTED, content_type="application/json")
        return web.json_response({"object": "list", "data": [{"id": config.model, "object": "model"}]})

    async def reset(request: web.Request) -> web.Response:
        if not config.offer_reset:
            raise web.HTTPNotFound()
        state.resets += 1
        state.cached.clear()
        return web.json_response({"success": True})

    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", completions)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/v1/models", models)
    app.router.add_post("/reset_prefix_cache", reset)
    return app, state


class ThreadServer:
    """The fake server on its own event loop in a thread; ``url`` is its root."""

    def __init__(self, config: FakeConfig) -> None:
        self.config = config
        self.loop = asyncio.new_event_loop()
        self.app, self.state = build_app(config)
        self.runner = web.AppRunner(self.app, shutdown_timeout=0.5, access_log=None)
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.url = ""

    def __enter__(self) -> ThreadServer:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(10)
        return self

    async def _stop(self) -> None:
        await self.runner.cleanup()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in others:  # handlers still stalling on purpose
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)

    async def _start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = self.runner.addresses[0][1]
        self.url = f"http://127.0.0.1:{port}"

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self._stop(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


def serve_in_thread(**settings: Any) -> ThreadServer:
    return ThreadServer(FakeConfig(**settings))


def config_json(**settings: Any) -> str:
    return json.dumps(asdict(FakeConfig(**settings)))


async def _main(config: FakeConfig) -> None:
    app, _ = build_app(config)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"PORT {runner.addresses[0][1]}", flush=True)
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(_main(FakeConfig(**json.loads(sys.argv[1]))))
