"""Fuzzed request bodies: whatever a client sends, ``kvbench serve`` answers a generation or a 4xx error body,
never a traceback, a 500 or a dead engine.

``parse_generation`` is fuzzed alone (fast, thousands of shapes) with JSON-like values under the real parameter
names, and each generation it accepts must be one the engine can run (every count within its bounds, every
integer within the engine's int64 tensors). Then raw bodies go through the real aiohttp app and engine process
on 127.0.0.1: JSON of the same shapes (NaN and Infinity as Python's json writes them, lone surrogates escaped),
JSON cut or spliced with garbage, and arbitrary bytes. Output is clamped to a few tokens, so a body that is valid
costs milliseconds.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kvbench.serve.protocol import MAX_N, ApiError, Generation, ModelInfo, parse_generation

from .conftest import assert_idle_and_drained, running_server

PRESET = ModelInfo(name="tiny", max_len=64, vocab_size=512)
INT64_MAX = 2**63 - 1

PARAMS = (
    "prompt",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "best_of",
    "temperature",
    "top_p",
    "top_k",
    "seed",
    "stop",
    "stop_token_ids",
    "ignore_eos",
    "stream",
    "stream_options",
    "logprobs",
    "model",
    "echo",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "min_p",
    "min_tokens",
    "response_format",
    "add_generation_prompt",
    "include_stop_str_in_output",
    "skip_special_tokens",
    "return_token_ids",
    "logit_bias",
    "tools",
    "suffix",
)

# ints past every bound the protocol and the engine know of (int32, float's 2**53, int64, uint64); Python's json
# reads at most 4,300 digits, so a larger int never reaches the parser from a request
HUGE = st.builds(
    lambda sign, power, plus: sign * (2**power + plus) if power < 100 else sign * 10**power,
    st.sampled_from([1, -1]),
    st.sampled_from([31, 53, 63, 64, 100, 4000]),
    st.sampled_from([-1, 0, 1]),
)
INTS = st.integers(-3, 600) | st.integers() | HUGE
FLOATS = st.floats() | st.sampled_from([0.0, -0.0, 5e-324, 1e-300, 1e-6, 0.5, 1.0, 1e308, math.nan, math.inf])
SURROGATES = st.sampled_from(["\ud800", "a\udfffb", "\udbff\udc00x"])
PLAIN_TEXT = st.text(max_size=12) | st.sampled_from(["", "tiny", "none", "text", "user", "assistant", "<|eot|>"])


def json_values(surrogates: bool) -> st.SearchStrategy:
    text = PLAIN_TEXT | SURROGATES if surrogates else PLAIN_TEXT
    keys = st.sampled_from(PARAMS + ("role", "content", "type", "text", "include_usage")) | text
    scalars = st.none() | st.booleans() | INTS | FLOATS | text
    return st.recursive(
        scalars,
        lambda children: st.lists(children, max_size=4) | st.dictionaries(keys, children, max_size=4),
        max_leaves=12,
    )


def bodies(surrogates: bool, vocab: int, tokenizer: bool = True) -> st.SearchStrategy:
    """Request bodies: mostly a valid body with a few fields replaced (by a plausible value or by anything) or
    deleted, so the later checks are reached too; sometimes any JSON value at all."""
    anything = json_values(surrogates)
    text = PLAIN_TEXT | SURROGATES if surrogates else PLAIN_TEXT
    ids = st.lists(st.integers(0, vocab - 1), min_size=1, max_size=8)
    any_ids = st.lists(st.integers(-1, vocab) | INTS, max_size=70)
    part = st.fixed_dictionaries({"type": st.sampled_from(["text", "image_url"]) | anything, "text": text | anything})
    message = st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant"]), "content": text | st.lists(part, max_size=3)}
    )
    valid = st.fixed_dictionaries(
        {
            "prompt": st.one_of(ids, st.lists(ids, min_size=1, max_size=3), *([text] if tokenizer else [])),
            "messages": st.lists(message, min_size=1, max_size=3),
        },
        optional={
            "model": st.just("tiny"),
            "max_tokens": st.integers(1, 8),
            "n": st.integers(1, 3),
            "temperature": st.floats(0, 2) | st.sampled_from([1e-5, 1.00001e-5, 1e-300, 5e-324, 1e308]),
            "top_p": st.floats(0.01, 1) | st.sampled_from([5e-324, 1e-45, 1e-300, 0.999999999]),
            "top_k": st.integers(-1, 40) | st.sampled_from([vocab - 1, vocab, vocab + 1, 2**31, INT64_MAX]),
            "seed": st.integers(0, INT64_MAX),
            "stop_token_ids": st.lists(st.integers(0, vocab - 1), max_size=3),
            "ignore_eos": st.booleans(),
            "stream": st.just(True),
            "stream_options": st.fixed_dictionaries(
                {}, optional={"include_usage": st.booleans(), "continuous_usage_stats": st.booleans()}
            ),
            **({"stop": st.lists(st.text(min_size=1, max_size=4), max_size=2)} if tokenizer else {}),
            "repetition_penalty": st.just(1.0),
            "logprobs": st.none(),
        },
    )
    plausible = {
        "prompt": any_ids | st.lists(any_ids | text, max_size=4) | text,
        "messages": st.lists(st.fixed_dictionaries({}, optional={"role": anything, "content": anything}), max_size=3),
        "n": st.integers(-1, MAX_N + 1),
        "temperature": FLOATS,
        "top_p": FLOATS,
        "stop": text | st.lists(text, max_size=3),
        "stop_token_ids": any_ids,
        "stream_options": st.dictionaries(
            st.sampled_from(["include_usage", "continuous_usage_stats"]) | text, st.booleans() | anything, max_size=2
        ),
        "model": text,
        "response_format": st.just({"type": "text"}),
    }
    replaced = st.sampled_from(PARAMS).flatmap(
        lambda name: st.tuples(st.just(name), plausible.get(name, INTS) | anything)
    )
    changes = st.lists(replaced | st.tuples(text, anything), max_size=3)
    deleted = st.sets(st.sampled_from(PARAMS), max_size=2)

    def mutate(body: dict, changes: list, deleted: set) -> dict:
        body = {**body, **dict(changes)}
        for name in deleted:
            body.pop(name, None)
        return body

    valid = valid.map(lambda body: {**body, "stream": True} if "stream_options" in body else body)
    mutated = st.builds(mutate, valid, changes, deleted)
    return st.one_of(mutated, mutated, mutated, anything)


def check_generation(generation: Generation, model: ModelInfo) -> None:
    """What the engine takes for granted of every generation the protocol lets through."""
    assert 1 <= generation.n <= MAX_N
    assert generation.prompts and len(generation.prompts) == len(generation.params)
    for ids, params in zip(generation.prompts, generation.params, strict=True):
        assert ids and all(type(token) is int and 0 <= token < model.vocab_size for token in ids)
        assert type(params.max_tokens) is int and 1 <= params.max_tokens <= model.max_len - len(ids)
        assert math.isfinite(params.temperature) and params.temperature >= 0
        assert 0 < params.top_p <= 1
        # the sampler builds int64 tensors of these: a larger int is an overflow in the engine process
        assert type(params.top_k) is int and -1 <= params.top_k <= INT64_MAX, params.top_k
        assert params.seed is None or 0 <= params.seed <= INT64_MAX
        assert all(0 <= token < model.vocab_size for token in params.stop_token_ids)
    assert all(isinstance(stop, str) and stop for stop in generation.stop_strings)


def parse_or_refuse(body, kind, model: ModelInfo) -> Generation | None:
    try:
        generation = parse_generation(body, kind, model)
    except ApiError as err:
        assert 400 <= err.status < 500, (err.status, err.message)
        assert err.message and json.dumps(err.body())
        return None
    check_generation(generation, model)
    return generation


# top_k is an int64 in the sampler: one past it passed the checks and killed the engine process (500, then 503)
@settings(max_examples=300, deadline=None)
@given(
    body=bodies(surrogates=True, vocab=PRESET.vocab_size, tokenizer=False), kind=st.sampled_from(["completion", "chat"])
)
@example(body={"prompt": [1], "top_k": 2**63}, kind="completion")
def test_any_body_is_a_runnable_generation_or_a_4xx_never_another_exception(body, kind):
    parse_or_refuse(body, kind, PRESET)


@pytest.fixture(scope="module")
def chat_model(tiny_gguf):
    """The tiny GGUF's tokenizer (byte-level BPE with a chat template) as the served model's."""
    from kvbench.models.tokenizers import load_tokenizer

    tokenizer = load_tokenizer(str(tiny_gguf[0]))
    assert tokenizer.chat_template
    return ModelInfo(name="tiny", max_len=64, vocab_size=len(tokenizer), tokenizer=tokenizer)


# No lone surrogate here: the app refuses a body holding one before it is parsed (a 400, fuzzed end to end below),
# and the tokenizer cannot encode one.
@settings(max_examples=200, deadline=None)
@given(body=bodies(surrogates=False, vocab=300), kind=st.sampled_from(["completion", "chat"]))
@example(body={"messages": [{"role": "user", "content": "hi"}], "stop": ["x", "x"]}, kind="chat")
@example(body={"messages": [{"role": "assistant", "content": [{"type": "text", "text": ""}]}]}, kind="chat")
def test_any_body_on_a_model_with_a_chat_template_is_a_runnable_generation_or_a_4xx(chat_model, body, kind):
    parse_or_refuse(body, kind, chat_model)


# -- end to end ---------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fuzz_server(tiny_model):
    with running_server(tiny_model, max_len=64) as server:
        yield server


def post(server, path: str, data: bytes) -> tuple[int, bytes]:
    request = urllib.request.Request(
        server.url + path, data=data, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # a hang fails here
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def clamped(body, kind, model: ModelInfo):
    """A body that would run: a few output tokens of a few choices, whatever it asked for."""
    if not isinstance(body, dict):
        return body
    try:
        generation = parse_generation(body, kind, model)
    except Exception:  # noqa: BLE001 - the server's answer to it is what is tested
        return body
    body = {**body, "max_tokens": min(4, max(p.max_tokens for p in generation.params))}
    body.pop("max_completion_tokens", None)
    if generation.num_choices > 8:
        body["n"], body["prompt"] = 1, generation.prompts[:8]
    return body


KINDS = st.sampled_from(["completion", "completion", "chat"])  # the preset has no chat template: mostly completions
# ("json", body, kind, cut, junk): a fuzzed body as JSON (NaN and Infinity as Python writes them, surrogates as
# \ud800 escapes), whole or cut at ``cut`` and followed by ``junk``; ("raw", bytes, kind): any bytes at all
RAW_BODIES = st.tuples(
    st.just("json"),
    bodies(surrogates=True, vocab=512, tokenizer=False),
    KINDS,
    st.none() | st.integers(0, 400),
    st.binary(max_size=8),
) | st.tuples(st.just("raw"), st.binary(max_size=200), KINDS)


PATHS = {"completion": "/v1/completions", "chat": "/v1/chat/completions"}
NORMAL = json.dumps({"prompt": [1, 2, 3], "max_tokens": 2, "temperature": 0}).encode()


# An int longer than Python's json reads (4,300 digits) was a 500: json_input.loads raised ValueError, not the
# JSONDecodeError the app refuses with a 400.
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(case=RAW_BODIES)
@example(case=("raw", b'{"prompt": [1], "max_tokens": ' + b"1" * 5000 + b"}", "completion"))
@example(case=("raw", b'{"prompt": [1], "max_tokens": 2, "temperature": NaN}', "completion"))
@example(case=("json", {"prompt": [1], "max_tokens": 1, "top_k": 2**63}, "completion", None, b""))
def test_any_raw_body_is_answered_never_a_500_and_the_server_keeps_serving(fuzz_server, case):
    if case[0] == "raw":
        _, data, kind = case
    else:
        _, body, kind, cut, junk = case
        data = json.dumps(clamped(body, kind, fuzz_server.server.info.model)).encode()
        if cut is not None:
            data = data[: cut % (len(data) + 1)] + junk
    status, answer = post(fuzz_server, PATHS[kind], data)
    assert status < 500, answer[:300]
    if status != 200:
        error = json.loads(answer)["error"]
        assert error["code"] == status and "Traceback" not in error["message"]
    assert post(fuzz_server, "/v1/completions", NORMAL)[0] == 200  # the engine lives on
    assert_idle_and_drained(fuzz_server)
