"""The OpenAI API as ``kvbench serve`` speaks it: request bodies checked and turned into a generation, and the
response bodies, stream chunks and error bodies, shaped as vLLM's OpenAI-compatible server shapes them.

Everything here is plain data (no HTTP, no engine): a request body (a dict) and what the server knows of its
model go in, an :class:`Generation` or an :class:`ApiError` comes out. Parameters the engines do not implement
are refused with a 400 when they ask for something (``logprobs``, penalties, ``echo``, tools), and accepted at
their neutral value, so clients that always send them (``vllm bench serve`` sends ``repetition_penalty: 1.0``)
work. Unknown fields are ignored, as vLLM ignores them.
"""

from __future__ import annotations

import json
import math
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal, overload

from kvbench.engine.sampling import SamplingParams
from kvbench.errors import KvbenchError

Kind = Literal["completion", "chat"]
MAX_N = 128  # choices per prompt: a bound on what one request may fork
_ERROR_TYPES = {
    400: "BadRequestError",
    404: "NotFoundError",
    405: "MethodNotAllowed",
    408: "RequestTimeout",
    413: "RequestTooLarge",
    429: "TooManyRequests",
    500: "InternalServerError",
    503: "ServiceUnavailableError",
}


class ApiError(Exception):
    """An error answered as an OpenAI error body: ``{"error": {"message", "type", "param", "code"}}``."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        return {
            "error": {
                "message": self.message,
                "type": _ERROR_TYPES.get(self.status, "Error"),
                "param": self.param,
                "code": self.status,
            }
        }


def bad(message: str, param: str | None = None) -> ApiError:
    return ApiError(400, message, param)


@dataclass(frozen=True)
class ModelInfo:
    """What the protocol needs to know of the served model."""

    name: str  # the served model name (the ``model`` field requests give)
    max_len: int  # prompt + output tokens of one request
    vocab_size: int
    tokenizer: Any = None  # None: a preset with random weights (token-id prompts only)
    parallel_sampling: bool = True  # n > 1 forks one prefill (the paged engine); else n separate requests
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def has_chat_template(self) -> bool:
        return self.tokenizer is not None and bool(getattr(self.tokenizer, "chat_template", None))


@dataclass
class Generation:
    """One request's work, checked: prompts as token ids, one ``SamplingParams`` per prompt, ``n`` choices each."""

    kind: Kind
    request_id: str
    model: str
    prompts: list[list[int]]
    params: list[SamplingParams]  # per prompt (max_tokens is capped by each prompt's room under max-len)
    n: int = 1
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    stop_strings: tuple[str, ...] = ()
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    return_token_ids: bool = False
    created: int = field(default_factory=lambda: int(time.time()))

    @property
    def num_choices(self) -> int:
        return len(self.prompts) * self.n

    def prompt_of(self, choice: int) -> list[int]:
        return self.prompts[choice // self.n]


# -- reading a body -----------------------------------------------------------------------------------------
def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@overload
def _int(body: dict, name: str, default: int, minimum: int | None = None) -> int: ...
@overload
def _int(body: dict, name: str, default: None, minimum: int | None = None) -> int | None: ...
def _int(body: dict, name: str, default: int | None, minimum: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value):
        raise bad(f"{name} must be an integer, got {value!r}", name)
    if minimum is not None and value < minimum:
        raise bad(f"{name} must be at least {minimum}, got {value}", name)
    return value


def _number(body: dict, name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise bad(f"{name} must be a finite number, got {value!r}", name)
    return float(value)


def _bool(body: dict, name: str, default: bool) -> bool:
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise bad(f"{name} must be true or false, got {value!r}", name)
    return value


def _refuse_unsupported(body: dict, kind: Kind) -> None:
    """Parameters the engines do not implement: accepted at their neutral value, refused otherwise."""
    neutral = {"presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "min_p": 0, "min_tokens": 0}
    for name, value in neutral.items():
        given = body.get(name)
        if given is not None and given != value:
            raise bad(f"{name} is not supported by kvbench serve (only {value} is accepted)", name)
    for name in (
        "logprobs",
        "top_logprobs",
        "echo",
        "prompt_logprobs",
        "suffix",
        "logit_bias",
        "tools",
        "tool_choice",
        "functions",
        "function_call",
        "guided_json",
        "guided_regex",
        "guided_choice",
        "structured_outputs",
        "prompt_embeds",
    ):
        given = body.get(name)
        if given not in (None, False, 0, "", {}, [], "none"):
            raise bad(f"{name} is not supported by kvbench serve", name)
    response_format = body.get("response_format")
    if response_format not in (None, {"type": "text"}):
        raise bad("response_format other than text is not supported by kvbench serve", "response_format")


def _stop_strings(body: dict, model: ModelInfo) -> tuple[str, ...]:
    stop = body.get("stop")
    if stop is None:
        return ()
    items = [stop] if isinstance(stop, str) else stop
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise bad(f"stop must be a string or a list of strings, got {stop!r}", "stop")
    if any(item == "" for item in items):
        raise bad("stop strings must not be empty", "stop")
    if items and model.tokenizer is None:
        raise bad(
            f"stop strings need a tokenizer; the model {model.name} has none (a preset with random "
            "weights): use stop_token_ids",
            "stop",
        )
    return tuple(dict.fromkeys(items))


def _token_ids(values: list, model: ModelInfo, param: str) -> list[int]:
    for token in values:
        if not _is_int(token):
            raise bad(f"{param} must hold integer token ids, got {token!r}", param)
        if not 0 <= token < model.vocab_size:
            raise bad(f"token id {token} is out of the vocabulary (0..{model.vocab_size - 1})", param)
    return list(values)


def _encode(model: ModelInfo, text: str, param: str, special: bool = True) -> list[int]:
    if model.tokenizer is None:
        raise bad(
            f"the model {model.name} has no tokenizer (a preset with random weights): send the prompt as token ids",
            param,
        )
    ids = list(model.tokenizer(text, add_special_tokens=special)["input_ids"])
    return _token_ids(ids, model, param)  # a tokenizer larger than the model's embeddings is refused here


def _completion_prompts(body: dict, model: ModelInfo) -> list[list[int]]:
    """``prompt``: a string, a list of strings, a list of token ids, or a list of such lists."""
    prompt = body.get("prompt")
    if prompt is None or prompt == "" or prompt == []:
        raise bad("prompt must be given and not empty", "prompt")
    if isinstance(prompt, str):
        items: list = [prompt]
    elif isinstance(prompt, list) and all(_is_int(token) for token in prompt):
        items = [prompt]
    elif isinstance(prompt, list):
        items = prompt
    else:
        raise bad(f"prompt must be a string, a list of strings or token ids; got {type(prompt).__name__}", "prompt")
    prompts = []
    for item in items:
        if isinstance(item, str):
            ids = _encode(model, item, "prompt")
        elif isinstance(item, list):
            ids = _token_ids(item, model, "prompt")
        else:
            raise bad(f"prompt must be a string, a list of strings or token ids; got a list holding {item!r}", "prompt")
        if not ids:
            raise bad("prompt must be given and not empty", "prompt")
        prompts.append(ids)
    return prompts


def _chat_prompt(body: dict, model: ModelInfo) -> list[int]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {role, content} objects", "messages")
    if not model.has_chat_template:
        what = "no tokenizer (a preset with random weights)" if model.tokenizer is None else "no chat template"
        raise bad(
            f"chat completions need a tokenizer with a chat template; the model {model.name} has {what}: "
            "use /v1/completions",
            "messages",
        )
    plain = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad(f"messages[{index}] must be an object with a string role", "messages")
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text is understood
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise bad(f"messages[{index}].content: only text parts are supported", "messages")
                texts.append(part["text"])
            content = "".join(texts)
        elif content is None:
            content = ""
        elif not isinstance(content, str):
            raise bad(f"messages[{index}].content must be a string or a list of text parts", "messages")
        plain.append({**message, "content": content})
    generation_prompt = _bool(body, "add_generation_prompt", True)
    try:
        text = model.tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=generation_prompt)
    except Exception as err:  # noqa: BLE001 - a template's own complaint (roles must alternate, ...) is the answer
        raise bad(
            f"the chat template refused the messages: {str(err).splitlines()[0] if str(err) else err!r}", "messages"
        ) from None
    ids = _encode(model, text, "messages", special=False)  # the template wrote the special tokens itself
    if not ids:
        raise bad("the messages render to an empty prompt", "messages")
    return ids


def _check_model(body: dict, model: ModelInfo) -> None:
    name = body.get("model")
    if name is not None and name != model.name:
        raise ApiError(404, f"The model `{name}` does not exist. Valid models: {model.name}.", "model")


def parse_generation(body: Any, kind: Kind, model: ModelInfo) -> Generation:
    """Check a ``/v1/completions`` or ``/v1/chat/completions`` body; raises :class:`ApiError`."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    _check_model(body, model)
    _refuse_unsupported(body, kind)
    stream = _bool(body, "stream", False)
    options = body.get("stream_options")
    if options is not None:
        if not stream:
            raise bad("stream_options can only be given when stream is true", "stream_options")
        if not isinstance(options, dict):
            raise bad("stream_options must be an object", "stream_options")
    options = options or {}
    include_usage = _bool(options, "include_usage", False)
    continuous = _bool(options, "continuous_usage_stats", False)
    prompts = _completion_prompts(body, model) if kind == "completion" else [_chat_prompt(body, model)]
    n = _int(body, "n", 1, minimum=1)
    if n > MAX_N:
        raise bad(f"n must be at most {MAX_N}, got {n}", "n")
    best_of = _int(body, "best_of", None, minimum=1)
    if best_of is not None and best_of != n:
        raise bad("best_of other than n is not supported by kvbench serve", "best_of")
    max_tokens = _int(body, "max_tokens", None, minimum=1)
    if kind == "chat":
        max_tokens = _int(body, "max_completion_tokens", max_tokens, minimum=1)
        which = "max_completion_tokens" if body.get("max_completion_tokens") is not None else "max_tokens"
    else:
        max_tokens = 16 if max_tokens is None else max_tokens  # the OpenAI (and vLLM) default of completions
        which = "max_tokens"
    if max_tokens is not None and max_tokens > model.max_len:
        raise bad(
            f"{which}={max_tokens} cannot be greater than the maximum context length of {model.max_len} "
            "tokens; request fewer output tokens",
            which,
        )
    temperature = _number(body, "temperature", 1.0)
    if temperature < 0:
        raise bad(f"temperature must be non-negative, got {temperature}", "temperature")
    top_p = _number(body, "top_p", 1.0)
    if not 0 < top_p <= 1:
        raise bad(f"top_p must be in (0, 1], got {top_p}", "top_p")
    top_k = _int(body, "top_k", 0)
    if top_k < -1:
        raise bad(f"top_k must be -1 or 0 (disabled) or at least 1, got {top_k}", "top_k")
    top_k = min(top_k, model.vocab_size)  # more than the vocabulary keeps every token (the sampler's int64 too)
    seed = _int(body, "seed", None)
    if seed is not None and not 0 <= seed < 2**63:
        raise bad(f"seed must be between 0 and 2**63 - 1, got {seed}", "seed")
    stop_ids = body.get("stop_token_ids") or []
    if not isinstance(stop_ids, list):
        raise bad("stop_token_ids must be a list of token ids", "stop_token_ids")
    stop_ids = _token_ids(stop_ids, model, "stop_token_ids")
    ignore_eos = _bool(body, "ignore_eos", False)
    params = []
    for ids in prompts:
        if len(ids) >= model.max_len:
            raise bad(
                f"This model's maximum context length is {model.max_len} tokens. However, your prompt "
                f"contains {len(ids)} input tokens, which leaves no room for an output token; shorten the "
                "prompt",
                "prompt" if kind == "completion" else "messages",
            )
        room = model.max_len - len(ids)
        try:
            params.append(
                SamplingParams(
                    temperature=temperature,
                    top_k=top_k,
                    top_p=top_p,
                    seed=seed,
                    max_tokens=room if max_tokens is None else min(max_tokens, room),
                    ignore_eos=ignore_eos,
                    stop_token_ids=tuple(stop_ids),
                )
            )
        except KvbenchError as err:  # the engine's own checks: the same words
            raise bad(str(err)) from None
    if n > 1 and params[0].is_greedy:
        raise bad(f"n must be 1 when sampling greedily (temperature 0 or top_k 1), got {n}", "n")
    prefix = "cmpl" if kind == "completion" else "chatcmpl"
    return Generation(
        kind=kind,
        request_id=f"{prefix}-{uuid.uuid4().hex}",
        model=model.name,
        prompts=prompts,
        params=params,
        n=n,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous,
        stop_strings=_stop_strings(body, model),
        include_stop_str_in_output=_bool(body, "include_stop_str_in_output", False),
        skip_special_tokens=_bool(body, "skip_special_tokens", True),
        return_token_ids=_bool(body, "return_token_ids", False) or model.tokenizer is None,
    )


# -- answers ------------------------------------------------------------------------------------------------
@dataclass
class ChoiceResult:
    """One choice as the response reports it."""

    text: str
    token_ids: list[int]
    finish_reason: str | None
    stop_reason: str | int | None = None


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int | None = None) -> dict[str, Any]:
    """OpenAI's ``usage``; with ``cached_tokens``, the prompt tokens the prefix cache served, in
    ``prompt_tokens_details`` as vLLM reports them."""
    body: dict[str, Any] = {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
    }
    if cached_tokens is not None:
        body["prompt_tokens_details"] = {"cached_tokens": cached_tokens}
    return body


def prompt_tokens(generation: Generation) -> int:
    """Prompt tokens of the request: each prompt once, whatever ``n`` is (as vLLM counts them)."""
    return sum(len(ids) for ids in generation.prompts)


def response_body(
    generation: Generation, choices: list[ChoiceResult], cached_tokens: int | None = None
) -> dict[str, Any]:
    """The non-streamed answer: ``text_completion`` or ``chat.completion``."""
    completion_tokens = sum(len(choice.token_ids) for choice in choices)
    rows = []
    for index, choice in enumerate(choices):
        row: dict[str, Any] = {"index": index}
        if generation.kind == "chat":
            row["message"] = {"role": "assistant", "content": choice.text}
        else:
            row["text"] = choice.text
        row.update(logprobs=None, finish_reason=choice.finish_reason, stop_reason=choice.stop_reason)
        if generation.return_token_ids:
            row["token_ids"] = choice.token_ids
            row["prompt_token_ids"] = generation.prompt_of(index)
        rows.append(row)
    return {
        "id": generation.request_id,
        "object": "chat.completion" if generation.kind == "chat" else "text_completion",
        "created": generation.created,
        "model": generation.model,
        "choices": rows,
        "usage": usage(prompt_tokens(generation), completion_tokens, cached_tokens),
    }


def chunk_body(generation: Generation, rows: list[dict[str, Any]], usage_now: dict | None = None) -> dict[str, Any]:
    """One streamed event: ``rows`` are choice deltas (see :func:`delta_row`); no rows and a usage: the last event."""
    body: dict[str, Any] = {
        "id": generation.request_id,
        "object": "chat.completion.chunk" if generation.kind == "chat" else "text_completion",
        "created": generation.created,
        "model": generation.model,
        "choices": rows,
    }
    if usage_now is not None:
        body["usage"] = usage_now
    return body


def role_row(index: int) -> dict[str, Any]:
    """A chat choice's first stream event, before its text (as vLLM sends it)."""
    return {"index": index, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}


def delta_row(
    generation: Generation,
    index: int,
    text: str,
    token_ids: list[int],
    finish_reason: str | None,
    stop_reason: str | int | None,
    first: bool,
) -> dict[str, Any]:
    """A choice's part of a stream event: its new text (and token ids when asked for), and its end."""
    row: dict[str, Any] = {"index": index}
    if generation.kind == "chat":
        row["delta"] = {"content": text}
    else:
        row["text"] = text
    row.update(logprobs=None, finish_reason=finish_reason, stop_reason=stop_reason)
    if generation.return_token_ids:
        row["token_ids"] = token_ids
        if first:
            row["prompt_token_ids"] = generation.prompt_of(index)
    return row


def models_body(model: ModelInfo) -> dict[str, Any]:
    return {
        "object": "list",
        "data": [
            {
                "id": model.name,
                "object": "model",
                "created": model.created,
                "owned_by": "kvbench",
                "root": model.name,
                "parent": None,
                "max_model_len": model.max_len,
            }
        ],
    }


class StreamEncoder:
    """Stream events of one generation as bytes, built from pieces made once per request: a streamed token
    costs a few string joins instead of a dict and a full ``json.dumps`` (the tests hold every event it writes
    equal to :func:`chunk_body` of :func:`delta_row`)."""

    def __init__(self, generation: Generation) -> None:
        self.generation = generation
        head = {
            "id": generation.request_id,
            "object": "chat.completion.chunk" if generation.kind == "chat" else "text_completion",
            "created": generation.created,
            "model": generation.model,
        }
        self._head = "data: " + _compact(head)[:-1] + ',"choices":['
        self._text_key = '"delta":{"content":' if generation.kind == "chat" else '"text":'
        self._text_end = "}" if generation.kind == "chat" else ""

    def delta(
        self,
        index: int,
        text: str,
        token_ids: list[int],
        finish_reason: str | None,
        stop_reason: str | int | None,
        first: bool,
        usage_now: dict | None = None,
    ) -> bytes:
        generation = self.generation
        parts = [
            self._head,
            '{"index":',
            str(index),
            ",",
            self._text_key,
            _compact(text) if text else '""',
            self._text_end,
            ',"logprobs":null,"finish_reason":',
            "null" if finish_reason is None else '"' + finish_reason + '"',
            ',"stop_reason":',
            "null" if stop_reason is None else _compact(stop_reason),
        ]
        if generation.return_token_ids:
            parts += [',"token_ids":[', ",".join(map(str, token_ids)), "]"]
            if first:
                parts += [',"prompt_token_ids":[', ",".join(map(str, generation.prompt_of(index))), "]"]
        parts.append("}]")
        if usage_now is not None:
            parts += [',"usage":', _compact(usage_now)]
        parts.append("}\n\n")
        return "".join(parts).encode("utf-8")

    def event(self, body: dict[str, Any]) -> bytes:
        return ("data: " + _compact(body) + "\n\n").encode("utf-8")


def _compact(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
