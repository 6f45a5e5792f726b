"""The HTTP application of ``kvbench serve`` (aiohttp): OpenAI routes, health, models and live metrics.

A generation handler checks its body (``protocol``), hands a :class:`~kvbench.serve.engine_client.Job` to the
engine process and waits on it: a non-streamed answer once every choice has ended, or server-sent events as tokens
arrive (several tokens in one event when the client reads more slowly than the engine writes). Whatever ends a
handler early (the client disconnects: aiohttp cancels the handler; a stop string; an error) withdraws the
rest of its job from the engine, so its KV blocks return to the pool at the next step.

Every error is an OpenAI error body (``{"error": {...}}``) with its status, never a traceback; unknown paths and
methods too. Headers of a stream are sent with its first event, so a request the engine refuses (the contiguous
engine's ``reject`` admission when the pool is full) still gets its status (503), streamed or not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from kvbench import __version__, json_input
from kvbench.measure.exporter import KvMetrics
from kvbench.serve.connections import ConnectionLimits, read_body
from kvbench.serve.engine_client import EngineClient, Job
from kvbench.serve.protocol import (
    ApiError,
    ChoiceResult,
    Generation,
    Kind,
    ModelInfo,
    StreamEncoder,
    chunk_body,
    models_body,
    parse_generation,
    prompt_tokens,
    response_body,
    role_row,
    usage,
)
from kvbench.serve.text import TextStream

log = logging.getLogger("kvbench.serve")
MAX_BODY_BYTES = 32 * 1024**2
DONE = b"data: [DONE]\n\n"


@dataclass
class ServerState:
    """What the handlers share: the model, the engine, the metrics, and whether new work is refused."""

    model: ModelInfo
    engine: EngineClient
    metrics: KvMetrics | None = None
    draining: bool = False
    limits: ConnectionLimits = ConnectionLimits()


STATE = web.AppKey("state", ServerState)


def _dumps(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def error_response(error: ApiError, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=_dumps(error.body()), status=error.status, content_type="application/json", headers=headers
    )


@web.middleware
async def _errors(request: web.Request, handler) -> web.StreamResponse:
    """Every failure becomes an OpenAI error body with its status."""
    try:
        return await handler(request)
    except ApiError as err:
        # a 503 may be retried; after a 408 the rest of the body may still come, so the connection ends
        headers = {503: {"Retry-After": "1"}, 408: {"Connection": "close"}}.get(err.status)
        return error_response(err, headers)
    except web.HTTPException as err:
        if err.status < 400:
            raise
        headers = {name: value for name, value in err.headers.items() if name.lower() == "allow"}
        return error_response(ApiError(err.status, f"{err.reason}: {request.method} {request.path}"), headers)
    except (asyncio.CancelledError, ConnectionResetError):
        raise
    except Exception as err:  # noqa: BLE001 - a bug answers 500 with its reason; the traceback goes to the log
        log.exception("internal error on %s %s", request.method, request.path)
        return error_response(ApiError(500, f"internal error: {err!r}"))


async def _body(request: web.Request) -> Any:
    raw = await read_body(request, request.app[STATE].limits)
    try:
        return json_input.loads(raw)  # which refuses a lone surrogate ("\\ud800") too: it is no text
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ApiError(400, f"the request body is not valid JSON: {err}") from None


async def completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "completion")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    return await _generate(request, "chat")


async def _generate(request: web.Request, kind: Kind) -> web.StreamResponse:
    state = request.app[STATE]
    if state.draining:
        raise ApiError(503, "the server is shutting down and admits no new request")
    generation = parse_generation(await _body(request), kind, state.model)
    job = Job(
        generation.prompts,
        generation.params,
        generation.n,
        fork=state.model.parallel_sampling,
        wake_per_token=generation.stream or bool(generation.stop_strings),
    )
    reader = _ChoiceReader(generation, job, state.model.tokenizer)
    state.engine.submit(job)
    try:
        if generation.stream:
            return await _stream(request, state, generation, job, reader)
        return await _complete(state, generation, job, reader)
    except ConnectionResetError:  # the client left while its answer was being written: nobody to tell
        raise asyncio.CancelledError() from None
    finally:
        state.engine.release(job)  # withdraws what still runs: a client gone, a handler failed


class _ChoiceReader:
    """Turns a job's new tokens into each choice's text and counted tokens (stop strings applied)."""

    def __init__(self, generation: Generation, job: Job, tokenizer: Any) -> None:
        self.generation = generation
        self.job = job
        self.texts = [
            TextStream(
                tokenizer,
                generation.prompt_of(i),
                generation.stop_strings,
                generation.include_stop_str_in_output,
                generation.skip_special_tokens,
            )
            for i in range(generation.num_choices)
        ]
        self.counted = [0] * generation.num_choices  # tokens of each choice that count (the answer's)
        self.started = [False] * generation.num_choices
        self.reported = [False] * generation.num_choices  # its end was sent
        self.shown = [0] * generation.num_choices  # counted tokens already sent in stream events

    def new_tokens(self, index: int) -> list[int]:
        """Counted tokens of a choice not yet sent in a stream event."""
        start, self.shown[index] = self.shown[index], self.counted[index]
        return self.job.choices[index].tokens[start : self.counted[index]]

    def read(self, engine: EngineClient) -> list[int]:
        """Take every choice's unread tokens; returns the choices that changed."""
        changed = []
        for index, choice in enumerate(self.job.choices):
            if not choice.unread and (not choice.done or self.reported[index]):
                continue
            new = choice.tokens[len(choice.tokens) - choice.unread :] if choice.unread else []
            choice.unread = 0
            text = self.texts[index]
            if new:
                was = text.stopped
                self.counted[index] += text.add(new, final=choice.done)
                if text.stopped is not None and was is None:
                    self.job.end_choice(index, "stop", text.stopped)
                    engine.abort(self.job, [index])
            if choice.done and text.stopped is None:
                text.finish()
            changed.append(index)
        return changed

    def result(self, index: int) -> ChoiceResult:
        choice = self.job.choices[index]
        text = self.texts[index]
        stop = text.stopped if text.stopped is not None else choice.stop_reason
        finish = "stop" if text.stopped is not None else choice.finish_reason
        return ChoiceResult(text.text, choice.tokens[: self.counted[index]], finish, stop)


async def _complete(state: ServerState, generation: Generation, job: Job, reader: _ChoiceReader) -> web.Response:
    while not job.done:
        await job.changed.wait()
        job.changed.clear()
        if generation.stop_strings:
            reader.read(state.engine)
    if job.error is not None:
        raise job.error
    reader.read(state.engine)
    body = response_body(generation, [reader.result(i) for i in range(generation.num_choices)], job.cached_tokens())
    return web.Response(body=_dumps(body), content_type="application/json")


async def _stream(
    request: web.Request, state: ServerState, generation: Generation, job: Job, reader: _ChoiceReader
) -> web.StreamResponse:
    response: web.StreamResponse | None = None
    encoder = StreamEncoder(generation)
    direct: _DirectEvents | None = None
    while True:
        await job.changed.wait()
        job.changed.clear()
        job.sink = None  # the handler writes from here until it waits again
        if direct is not None and direct.error is not None:
            raise direct.error
        if job.error is not None:
            if response is None:
                raise job.error  # nothing sent yet: the error has its own status
            await response.write(encoder.event(job.error.body()) + DONE)
            return response
        parts = _events(state, generation, job, reader, encoder)
        if response is None:
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
            if request.version >= (1, 1):
                response.enable_chunked_encoding()  # as aiohttp would; said here so that direct writes frame alike
            await response.prepare(request)
        if job.done:
            if generation.include_usage:
                last = usage(prompt_tokens(generation), sum(reader.counted), job.cached_tokens())
                parts.append(encoder.event(chunk_body(generation, [], last)))
            parts.append(DONE)
            await response.write(b"".join(parts))
            await response.write_eof()
            return response
        if parts:
            await response.write(b"".join(parts))  # the first write sends the headers too
            if direct is None and response.chunked and request.transport is not None:
                direct = _DirectEvents(request.transport, state, generation, job, reader, encoder)
        if direct is not None:
            job.sink = direct  # the next tokens are written as they arrive, without waking this handler


def _events(
    state: ServerState, generation: Generation, job: Job, reader: _ChoiceReader, encoder: StreamEncoder
) -> list[bytes]:
    """The stream events of what arrived since the last call: each changed choice's delta (a chat choice's role
    row first)."""
    parts = []
    for index in reader.read(state.engine):
        ended = job.choices[index].done
        finish = stop = None
        if ended:
            result = reader.result(index)
            finish, stop = result.finish_reason, result.stop_reason
        first = not reader.started[index]
        reader.started[index] = True
        reader.reported[index] = ended
        if first and generation.kind == "chat":
            parts.append(encoder.event(chunk_body(generation, [role_row(index)])))
        now = usage(len(generation.prompt_of(index)), reader.counted[index]) if generation.continuous_usage else None
        parts.append(
            encoder.delta(index, reader.texts[index].take(ended), reader.new_tokens(index), finish, stop, first, now)
        )
    return parts


class _DirectEvents:
    """A stream's events written as the engine's step message arrives, from the engine client's callback: no
    handler task woken and no awaited write per token (most of the front end's cost per streamed token). The
    response is prepared and chunked already; each write is one HTTP chunk straight to the transport. It
    declines (the handler is woken instead) when the job ended or failed, when the client is gone, or when the
    client reads so slowly that the transport's buffer is full: the handler's awaited write waits for it."""

    HIGH_WATER = 64 * 1024  # bytes queued for the client past which the handler's write (which drains) takes over

    def __init__(
        self,
        transport: asyncio.Transport,
        state: ServerState,
        generation: Generation,
        job: Job,
        reader: _ChoiceReader,
        encoder: StreamEncoder,
    ) -> None:
        self.transport = transport
        self.args = (state, generation, job, reader, encoder)
        self.job = job
        self.error: Exception | None = None  # a failure while writing: the handler raises it

    def __call__(self) -> bool:
        transport = self.transport
        if self.job.done or transport.is_closing() or transport.get_write_buffer_size() > self.HIGH_WATER:
            return False
        try:
            data = b"".join(_events(*self.args))
        except Exception as err:  # noqa: BLE001 - the handler answers it (an internal error), not the callback
            self.error = err
            return False
        if data:
            transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        return not self.job.done  # a stop string ended the last open choice: the handler writes the end


async def models(request: web.Request) -> web.Response:
    return web.Response(body=_dumps(models_body(request.app[STATE].model)), content_type="application/json")


async def health(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.draining:
        raise ApiError(503, "the server is shutting down")
    if not state.engine.alive:
        raise ApiError(503, f"the engine process has stopped: {state.engine.error or 'not running'}")
    return web.Response(status=200)


async def reset_prefix_cache(request: web.Request) -> web.Response:
    """Empty the prefix cache, as vLLM's route does: ``{"success": false}`` while a request holds blocks."""
    state = request.app[STATE]
    if state.draining:
        raise ApiError(503, "the server is shutting down")
    done = await state.engine.reset_prefix_cache()
    return web.Response(body=_dumps({"success": done}), content_type="application/json")


async def version(request: web.Request) -> web.Response:
    return web.Response(body=_dumps({"version": __version__}), content_type="application/json")


async def metrics(request: web.Request) -> web.Response:
    state = request.app[STATE]
    if state.metrics is None:
        raise ApiError(404, "metrics are off")
    from prometheus_client import CONTENT_TYPE_LATEST

    return web.Response(body=state.metrics.exposition().encode("utf-8"), headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(state: ServerState) -> web.Application:
    app = web.Application(middlewares=[_errors], client_max_size=MAX_BODY_BYTES)
    app[STATE] = state
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/version", version)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/reset_prefix_cache", reset_prefix_cache)
    return app


def log_to_stderr(level: int = logging.INFO) -> None:
    """kvbench serve's own log lines (errors of handlers, shutdown) on stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%H:%M:%S"))
    log.addHandler(handler)
    log.setLevel(level)
    log.propagate = False
