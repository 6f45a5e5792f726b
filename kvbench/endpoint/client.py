"""One streamed request to an OpenAI-compatible server, timed token by token, through aiohttp.

The clock is read once per chunk of bytes that arrives (before it is parsed), so parsing never shows up in a
latency, and several events that arrived together share one time, as they did on the wire. Whatever goes
wrong ends as a failed :class:`RequestRecord` with its reason; only cancellation propagates (the load patterns
record it).

Token counts come from the stream's ``usage``; where a server sends none they are filled in after the point
(``tokens.fill_token_counts``), so no tokenizer runs while requests are timed.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvbench import json_input
from kvbench.endpoint.conversation import Conversation
from kvbench.endpoint.http_body import read_body
from kvbench.endpoint.openai import (
    APIS,
    DEFAULT_API_KEY_ENV,
    DONE,
    check_base_url,
    error_message,
    headers,
    parse_event,
    payload,
)
from kvbench.endpoint.record import RequestRecord
from kvbench.endpoint.sse import MalformedStream, SSEDecoder
from kvbench.errors import KvbenchError
from kvbench.measure.http_fetch import within

ERROR_BODY_BYTES = 4096  # what is read of an error response, for its reason
DRAIN_S = 1.0  # how long the end of a body may take after [DONE]


@dataclass(frozen=True)
class Target:
    """An OpenAI-compatible server. The API key is named by an environment variable, never held here, so no
    result, log or ``repr`` can carry it."""

    url: str  # the server's root, http://HOST:PORT
    api: str = "completions"  # "completions" | "chat"
    model: str | None = None  # the name requests carry; None: the first model the server lists
    api_key_env: str | None = DEFAULT_API_KEY_ENV
    metrics_url: str | None = None  # where its /metrics is; None: URL/metrics
    name: str | None = None  # a label (two targets side by side)
    kv_events: str | None = None  # the ZMQ address of its KV event stream (vLLM's --kv-events-config endpoint)
    kv_events_replay: str | None = None  # and of its replay socket
    kv_events_bind: bool = False  # kvbench listens on ``kv_events`` and the server connects to it (vLLM on tcp)

    def __post_init__(self) -> None:
        object.__setattr__(self, "url", check_base_url(self.url))
        if self.api not in APIS:
            raise KvbenchError(f"unknown API {self.api!r}; choose {' or '.join(APIS)}")
        if self.metrics_url is not None and not self.metrics_url.startswith(("http://", "https://")):
            raise KvbenchError(f"metrics URL {self.metrics_url!r}: expected http://HOST:PORT/metrics")

    @property
    def endpoint(self) -> str:
        return self.url + APIS[self.api]

    @property
    def scrape_url(self) -> str:
        return self.metrics_url or self.url + "/metrics"

    def describe(self) -> dict[str, Any]:
        """What a result records of the target (the key's variable name at most, never the key)."""
        return {
            "name": self.name,
            "url": self.url,
            "api": self.api,
            "endpoint": self.endpoint,
            "model": self.model,
            "metrics_url": self.scrape_url,
            "api_key_env": self.api_key_env,
            "kv_events": self.kv_events,
            "kv_events_replay": self.kv_events_replay,
            "kv_events_bind": self.kv_events_bind,
        }


@dataclass(frozen=True)
class RequestLimits:
    """Per-request limits: a request that breaks one fails with its reason, and the point goes on."""

    timeout_s: float = 600.0  # the whole request, first byte to last
    stall_s: float = 60.0  # no byte arrives for this long
    connect_s: float = 10.0  # no connection within this long

    def __post_init__(self) -> None:
        for name in ("timeout_s", "stall_s", "connect_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise KvbenchError(
                    f"request {name.removesuffix('_s')} limit must be a positive number of seconds, got {value!r}"
                )

    def client_timeout(self) -> aiohttp.ClientTimeout:
        return aiohttp.ClientTimeout(total=self.timeout_s, sock_connect=self.connect_s, sock_read=self.stall_s)


def open_session(limits: RequestLimits | None = None) -> aiohttp.ClientSession:
    """A session for a point's load: no pool limit (the load pattern bounds what is in flight; a pool limit
    would queue requests inside the client and count the wait as server time), no proxy from the environment
    (a benchmark of a local server must not go through one), keep-alive."""
    limits = limits or RequestLimits()
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0, keepalive_timeout=60, enable_cleanup_closed=True)
    return aiohttp.ClientSession(
        connector=connector, timeout=limits.client_timeout(), trust_env=False, auto_decompress=False
    )


STREAM_BYTES_PER_TOKEN = 16 << 10  # an event is a few hundred bytes; a stream past this per token is not one
TEMPLATE_TOKENS = 1024  # what a chat template and special tokens may add to a prompt, generously


def most_prompt_tokens(body: dict[str, Any]) -> int:
    """The most tokens the prompt ``body`` sends can count: its ids, or one per UTF-8 byte of its text (a
    tokenizer never splits finer than bytes), plus what a template may add. A count above it is impossible."""
    prompt = body.get("prompt", body.get("messages"))
    if isinstance(prompt, list) and all(isinstance(item, int) for item in prompt):
        return len(prompt) + TEMPLATE_TOKENS
    return len(json.dumps(prompt, ensure_ascii=False).encode("utf-8")) + TEMPLATE_TOKENS


def impossible_counts(record: RequestRecord, body: dict[str, Any], texts: int = 0) -> str | None:
    """Why the counts a server reported for ``body`` cannot be true (then the request is set aside), or None.
    ``texts``: the events that carried text, each at least one token."""
    asked = body.get("max_tokens")
    if record.output_tokens_from == "usage" and record.output_tokens is not None and record.output_tokens < texts:
        return (
            f"the server reports {record.output_tokens:,} output tokens after streaming {texts:,} events of text: "
            "impossible, set aside"
        )
    if record.output_tokens_from == "usage" and isinstance(asked, int) and (record.output_tokens or 0) > asked:
        return (
            f"the server reports {record.output_tokens:,} output tokens for max_tokens {asked}: impossible, set aside"
        )
    bound = most_prompt_tokens(body)
    if record.prompt_tokens_from == "usage" and (record.prompt_tokens or 0) > bound:
        return (
            f"the server reports {record.prompt_tokens:,} prompt tokens for a prompt that holds at most {bound:,}: "
            "impossible, set aside"
        )
    cached, prompt = record.cached_tokens, record.prompt_tokens
    if cached is not None and prompt is not None and cached > prompt:
        return f"the server reports {cached:,} cached tokens of a {prompt:,}-token prompt: impossible, set aside"
    return None


@dataclass
class EndpointClient:
    target: Target
    model: str
    session: aiohttp.ClientSession
    limits: RequestLimits = field(default_factory=RequestLimits)
    api_key: str | None = field(default=None, repr=False)
    temperature: float | None = None
    extra_body: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        self._headers = headers(self.api_key)
        self._timeout = self.limits.client_timeout()
        self._url = self.target.endpoint

    def body(self, conversation: Conversation, turn: int, answers: Sequence[str]) -> dict[str, Any]:
        spec = conversation.turns[turn]
        if self.target.api == "chat":
            return payload(
                "chat",
                self.model,
                None,
                conversation.chat_messages(turn, answers),
                spec.max_tokens,
                spec.ignore_eos,
                self.temperature,
                self.extra_body,
            )
        return payload(
            "completions",
            self.model,
            conversation.completion_prompt(turn, answers),
            None,
            spec.max_tokens,
            spec.ignore_eos,
            self.temperature,
            self.extra_body,
        )

    async def send(
        self, conversation: Conversation, turn: int, answers: Sequence[str], record: RequestRecord | None = None
    ) -> RequestRecord:
        """Send turn ``turn`` of ``conversation`` (``answers``: the texts of its earlier turns) and time it."""
        record = record or RequestRecord(conversation.index, turn)
        body = self.body(conversation, turn, answers)
        spec = conversation.turns[turn]
        if spec.prompt_len is not None and turn == 0 and not conversation.system:
            record.prompt_tokens, record.prompt_tokens_from = spec.prompt_len, "workload"
        try:
            await self._stream(body, record)
        except asyncio.CancelledError:
            raise
        except Exception as err:  # noqa: BLE001 - every failure is recorded with its reason, none escapes
            kind, message = failure_of(err, self.limits)
            record.fail(kind, message)
        finally:
            record.end = time.perf_counter()
        if record.prompt_tokens is None:  # counted after the point, with a tokenizer if there is one
            record.prompt_input = body.get("messages") or body.get("prompt")
        return record

    async def _stream(self, body: dict[str, Any], record: RequestRecord) -> None:
        times = record.token_times
        parts: list[str] = []
        decoder = SSEDecoder()
        clock = time.perf_counter
        start = record.start = clock()
        async with self.session.post(
            self._url, json=body, headers=self._headers, timeout=self._timeout, allow_redirects=False
        ) as response:
            if response.status != 200:
                text, _ = await read_body(response, ERROR_BODY_BYTES)
                record.fail("http", error_message(text) or (response.reason or "error"), response.status)
                return
            if response.content_type != "text/event-stream":
                raise MalformedStream(
                    f"the server answered {response.content_type or 'without a content type'}, "
                    "not an event stream (does it stream?)"
                )
            done = False
            asked = body.get("max_tokens")
            most_events = 2 * asked + 16 if isinstance(asked, int) else None  # a server streams at most one per token
            most_bytes = (asked if isinstance(asked, int) else 4096) * STREAM_BYTES_PER_TOKEN + (1 << 20)
            received = 0
            async for chunk in _chunks(response.content, self.limits.stall_s):
                now = clock() - start
                received += len(chunk)
                if received > most_bytes:
                    raise MalformedStream(
                        f"the server streamed more than {most_bytes >> 20} MiB for max_tokens {asked}: cut off"
                    )
                for data in decoder.feed(chunk):
                    event = parse_event(data)
                    if event is DONE:
                        done = True
                        break
                    if event.text is not None:
                        times.append(now)
                        parts.append(event.text)
                        if most_events is not None and len(times) > most_events:
                            raise MalformedStream(
                                f"the server streamed more than {most_events} token events for max_tokens {asked}: "
                                "cut off"
                            )
                    if event.finish_reason is not None:
                        record.finish_reason = event.finish_reason
                    if event.completion_tokens is not None:
                        record.output_tokens, record.output_tokens_from = event.completion_tokens, "usage"
                    if event.prompt_tokens is not None:
                        record.prompt_tokens, record.prompt_tokens_from = event.prompt_tokens, "usage"
                    if event.cached_tokens is not None:
                        record.cached_tokens = event.cached_tokens
                    if event.error is not None:
                        record.fail("server_error", event.error)
                        return
                if done:
                    break
            if done:
                await _drain(response)
            else:
                done = "[DONE]" in decoder.close()
        record.text = "".join(parts)
        impossible = impossible_counts(record, body, sum(1 for part in parts if part))
        if impossible is not None:
            record.fail("malformed", impossible)
            return
        if not times:
            record.fail(
                "malformed",
                "the stream ended without a token"
                if done or record.finish_reason
                else "the stream ended before any token or its end",
            )
        elif not done and record.finish_reason is None:
            record.fail("disconnect", f"the stream ended after {len(times)} token event(s) without its end ([DONE])")
        else:
            record.ok = True
            record.ttft, record.latency = times[0], times[-1]


async def _drain(response: aiohttp.ClientResponse) -> None:
    """Read the body's end after ``[DONE]`` (it follows at once), so the connection goes back to the pool
    instead of being closed: a new connection per request would be load the server does not get from a real
    client. A server that never ends the body costs its connection, not the completed request."""
    content = response.content

    async def rest() -> None:
        seen = 0
        while not content.at_eof() and seen <= ERROR_BODY_BYTES:
            seen += len(await content.readany())

    try:
        await asyncio.wait_for(rest(), DRAIN_S)
    except asyncio.CancelledError:
        raise
    except Exception:  # noqa: BLE001 - the request is complete; only the connection's reuse is lost
        response.close()
        return
    if not content.at_eof():  # more than an end follows [DONE]: not worth reading
        response.close()


async def _chunks(content: aiohttp.StreamReader, stall_s: float) -> AsyncIterator[bytes]:
    """The body's bytes as they come, each read under the stall deadline of its own: aiohttp's socket-read
    timeout stops once the connection is lost, and a body cut by a malformed chunk then waited for the whole
    request's deadline instead of failing as a stall."""
    clock = asyncio.get_running_loop().time
    while True:
        began = clock()
        try:
            chunk = await within(content.readany(), stall_s)  # a point's end (a cancellation) goes through
        except (asyncio.TimeoutError, TimeoutError):
            if clock() - began < stall_s:  # the request's own deadline, which aiohttp enforces: not a stall
                raise
            raise aiohttp.ServerTimeoutError(f"no data for {stall_s:g} s") from None
        if not chunk:
            return
        yield chunk


def failure_of(err: BaseException, limits: RequestLimits) -> tuple[str, str]:
    """The failure kind and a one-line message for an exception raised while a request ran."""
    if isinstance(err, aiohttp.ConnectionTimeoutError):
        return "timeout", f"no connection within {limits.connect_s:g} s"
    if isinstance(err, aiohttp.ServerTimeoutError):  # the socket read limit
        return "stall", f"no data for {limits.stall_s:g} s"
    if isinstance(err, (asyncio.TimeoutError, TimeoutError)):
        return "timeout", f"not finished within {limits.timeout_s:g} s"
    if isinstance(err, MalformedStream):
        return "malformed", str(err)
    if isinstance(err, aiohttp.ClientConnectorError):
        return "connect", f"cannot connect: {err.os_error.strerror or err.os_error}" if err.os_error else str(err)
    if isinstance(err, aiohttp.ClientPayloadError):
        return "disconnect", "the connection closed mid-stream (the response body was cut short)"
    if isinstance(err, aiohttp.ServerDisconnectedError):
        return "disconnect", "the server closed the connection before answering"
    if isinstance(err, RuntimeError) and "Connection closed" in str(err):  # aiohttp's word for a body cut short
        return "disconnect", "the connection closed mid-stream (the response body was cut short)"
    if isinstance(err, (aiohttp.ClientOSError, ConnectionError)):
        return "disconnect", f"the connection broke ({_short(err)})"
    if isinstance(err, aiohttp.ClientResponseError):  # an unreadable status line or headers
        return "malformed", f"not an HTTP response the client can read ({_short(err)})"
    return "client", f"{type(err).__name__}: {_short(err)}"


def _short(err: BaseException) -> str:
    text = " ".join(str(err).split()) or type(err).__name__
    return text if len(text) <= 160 else text[:160] + "..."


async def list_models(
    session: aiohttp.ClientSession, target: Target, api_key: str | None, timeout_s: float = 10.0
) -> list[str]:
    """The model names ``GET /v1/models`` lists; a one-line error when the server cannot be asked."""
    url = target.url + "/v1/models"
    try:
        async with session.get(
            url, headers=headers(api_key), allow_redirects=False, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as response:
            text, cut = await read_body(response, 1 << 20)
            if cut:
                raise KvbenchError(f"{url} answered more than 1 MiB: not an OpenAI model list")
            if response.status != 200:
                raise KvbenchError(
                    f"{url}: HTTP {response.status} {error_message(text) or response.reason or ''}".strip()
                )
    except (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError) as err:
        kind, message = failure_of(err, RequestLimits(timeout_s=timeout_s))
        raise KvbenchError(f"cannot reach {url}: {message}") from None
    try:
        data = json_input.loads(text)
        names = [str(item["id"]) for item in data["data"]]
    except (ValueError, KeyError, TypeError):
        raise KvbenchError(f"{url} did not answer with an OpenAI model list") from None
    return names
