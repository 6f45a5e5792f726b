"""The OpenAI-compatible HTTP API as a load generator speaks it: the two streamed endpoints, their request
bodies, and what one event of their streams carries.

- ``completions`` (``POST /v1/completions``): ``prompt`` is text or a list of token ids (vLLM and SGLang take
  ids, so a request list replays exactly the tokens kvbench's own engines run).
- ``chat`` (``POST /v1/chat/completions``): ``messages``; the server applies its chat template.

Both are streamed with ``stream_options.include_usage`` so the last event reports the token counts the server
counted. ``max_tokens`` is sent for both endpoints (every OpenAI-compatible server reads it for chat too);
``ignore_eos`` (a vLLM and SGLang extension) only when asked for.

A token event is one whose choice carries generated text (``text``, or ``delta.content`` /
``delta.reasoning_content``), possibly empty (a token whose characters are held back). Chat streams open with
a role-only delta (``{"role": "assistant", "content": ""}``), which is not a token: ``vllm bench serve`` times
its first token from that event; here TTFT waits for the first token. An empty closing event (only a
``finish_reason``) is no token either. A server that reports an error inside the stream (``{"error": {...}}``)
ends the request as failed.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from kvbench import json_input
from kvbench.endpoint.sse import MalformedStream
from kvbench.errors import KvbenchError

APIS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"


def check_base_url(url: str) -> str:
    """``http(s)://host[:port]`` without a trailing slash, or a one-line error. A URL that already names an API
    path (``.../v1/completions``) is cut back to the server's root."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise KvbenchError(f"target URL {url!r}: expected http://HOST:PORT (the server's root)")
    if parts.query or parts.fragment:
        raise KvbenchError(f"target URL {url!r}: expected http://HOST:PORT without a query")
    try:
        parts.port  # noqa: B018 - a port out of range raises here
    except ValueError:
        raise KvbenchError(f"target URL {url!r}: the port is not a number from 1 to 65535") from None
    path = parts.path.rstrip("/")
    for suffix in (*APIS.values(), "/v1", "/metrics"):
        if path.endswith(suffix):
            path = path[: -len(suffix)]
            break
    return f"{parts.scheme}://{parts.netloc}{path}"


def api_key_from_env(name: str | None) -> str | None:
    """The API key from the environment variable ``name`` (a key is never a command-line value, which shell
    history and process lists keep, and never part of a result); None when unset or empty."""
    if not name:
        return None
    value = os.environ.get(name, "").strip()
    return value or None


def check_key_transport(url: str, api_key: str | None) -> None:
    """An API key travels only over https, or to this machine (loopback): over plain http to another host anyone
    on the path could read it."""
    if not api_key:
        return
    parts = urlsplit(url)
    if parts.scheme == "https" or is_loopback(parts.hostname or ""):
        return
    raise KvbenchError(
        f"refusing to send the API key in clear text to {parts.hostname}: use an https URL, or unset "
        "the key's environment variable"
    )


def is_loopback(host: str) -> bool:
    import ipaddress

    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def headers(api_key: str | None) -> dict[str, str]:
    out = {"Accept": "text/event-stream"}
    if api_key:
        out["Authorization"] = f"Bearer {api_key}"
    return out


def payload(
    api: str,
    model: str,
    prompt: str | list[int] | None,
    messages: list[dict[str, str]] | None,
    max_tokens: int,
    ignore_eos: bool,
    temperature: float | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The JSON body of one streamed request."""
    body: dict[str, Any] = {"model": model}
    if api == "chat":
        if messages is None:
            raise ValueError("a chat request needs messages")
        body["messages"] = messages
    else:
        if prompt is None:
            raise ValueError("a completions request needs a prompt")
        body["prompt"] = prompt
    body.update(max_tokens=max_tokens, stream=True, stream_options={"include_usage": True})
    if ignore_eos:
        body["ignore_eos"] = True
    if temperature is not None:
        body["temperature"] = temperature
    if extra:
        body.update(extra)
    return body


@dataclass(frozen=True, slots=True)
class Event:
    """What one ``data:`` event of a completion stream says."""

    text: str | None = None  # generated text (a token event), None when the event carries none
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # from ``usage``
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # ``usage.prompt_tokens_details.cached_tokens`` (vLLM, SGLang, OpenAI)
    error: str | None = None  # an error the server reported inside the stream
    done: bool = False  # ``[DONE]``: the stream is complete


DONE = Event(done=True)
_EMPTY = Event()


def parse_event(data: str) -> Event:
    """One event's data; :class:`MalformedStream` when it is not the JSON object the protocol promises."""
    if data == "[DONE]":
        return DONE
    try:
        chunk = json_input.loads(data)
    except ValueError:
        raise MalformedStream(f"an event is not JSON: {_clip(data)}") from None
    if not isinstance(chunk, dict):
        raise MalformedStream(f"an event is not a JSON object: {_clip(data)}")
    if "error" in chunk and chunk["error"]:
        return Event(error=_error_text(chunk["error"]))
    choices = chunk.get("choices")
    text = finish = None
    if choices:
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise MalformedStream(f"an event's choices are not a list of objects: {_clip(data)}")
        choice = choices[0]
        finish = choice.get("finish_reason")
        token_ids = choice.get("token_ids")  # kvbench serve, vLLM with return_token_ids: tokens without text
        carries_tokens = isinstance(token_ids, list) and len(token_ids) > 0
        delta = choice.get("delta")
        if isinstance(delta, dict):
            text = delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
            if text is None and "role" not in delta and finish is None and "content" in delta:
                text = delta["content"]  # an empty token (e.g. half of a character held back)
            elif text == "" and ("role" in delta or finish is not None) and not carries_tokens:
                text = None  # the role announcement, or a closing event without a token
            if text is None and carries_tokens:
                text = ""
        else:
            text = choice.get("text")
            if text == "" and finish is not None and not carries_tokens:
                text = None  # a closing event without a token
            elif text is None and carries_tokens:
                text = ""
        if text is not None and not isinstance(text, str):
            raise MalformedStream(f"an event's generated text is not a string: {_clip(data)}")
    usage = chunk.get("usage")
    prompt_tokens = completion_tokens = cached_tokens = None
    if isinstance(usage, dict):
        prompt_tokens, completion_tokens, cached_tokens = usage_counts(usage)
    if text is None and finish is None and prompt_tokens is None and completion_tokens is None:
        return _EMPTY
    return Event(text, finish if isinstance(finish, str) else None, prompt_tokens, completion_tokens, cached_tokens)


def usage_counts(usage: dict[str, Any]) -> tuple[int | None, int | None, int | None]:
    """(prompt, completion, cached prompt) tokens of a ``usage`` object; None for what it does not say (a server
    that reports no details says nothing of its cache: unknown, never 0)."""
    details = usage.get("prompt_tokens_details")
    cached = usage_count(details.get("cached_tokens")) if isinstance(details, dict) else None
    return usage_count(usage.get("prompt_tokens")), usage_count(usage.get("completion_tokens")), cached


def usage_count(value: Any) -> int | None:
    """A token count of a ``usage`` object, or None when it is not a non-negative integer."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def error_message(body: bytes) -> str:
    """The one-line reason an error response gives (OpenAI's ``{"error": {"message": ...}}``, FastAPI's
    ``{"detail": ...}``, or the text itself)."""
    text = body.decode("utf-8", "replace").strip()
    try:
        data = json_input.loads(text)
    except ValueError:
        return _clip(text) if text else ""
    if isinstance(data, dict):
        for key in ("error", "detail", "message"):
            if data.get(key):
                return _error_text(data[key])
    return _clip(text)


def _error_text(error: Any) -> str:
    if isinstance(error, dict):
        error = error.get("message") or error.get("msg") or json.dumps(error)
    elif isinstance(error, list) and error:  # FastAPI's validation errors
        error = "; ".join(_error_text(item) for item in error[:3])
    return _clip(str(error))


def _clip(text: str, limit: int = 200) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[:limit] + "..."
