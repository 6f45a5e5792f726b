"""The OpenAI-compatible protocol: request bodies, what each event carries, URLs, keys and error texts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.endpoint.openai import (
    DONE,
    api_key_from_env,
    check_base_url,
    check_key_transport,
    error_message,
    headers,
    parse_event,
    payload,
)
from kvbench.endpoint.sse import MalformedStream, SSEDecoder
from kvbench.errors import KvbenchError

DATA = Path(__file__).parent / "data"


def events(name: str):
    decoder = SSEDecoder()
    return [parse_event(d) for d in decoder.feed((DATA / name).read_bytes())]


def test_a_recorded_vllm_completion_stream():
    parsed = events("vllm_completions.sse")
    tokens = [e.text for e in parsed if e.text is not None]
    assert tokens == [" Paris", ".", " The", " United", " States"]
    usage = [e for e in parsed if e.completion_tokens is not None]
    assert [(e.prompt_tokens, e.completion_tokens) for e in usage] == [(5, 5)]
    assert parsed[-1] is DONE
    assert [e.finish_reason for e in parsed if e.finish_reason] == ["length"]


def test_a_recorded_vllm_chat_stream_opens_with_a_role_that_is_no_token():
    parsed = events("vllm_chat.sse")
    assert parsed[0].text is None  # {"role": "assistant", "content": ""}: vLLM's bench times TTFT from it
    assert [e.text for e in parsed if e.text is not None] == ["Hello", ",", " welcome", " to"]
    assert [(e.prompt_tokens, e.completion_tokens) for e in parsed if e.completion_tokens] == [(31, 4)]


@pytest.mark.parametrize(
    ("data", "text", "finish"),
    [
        ('{"choices": [{"text": "", "finish_reason": null}]}', "", None),  # an empty token (bytes held back)
        ('{"choices": [{"text": "", "finish_reason": "stop"}]}', None, "stop"),  # a closing event
        ('{"choices": [{"delta": {"content": ""}, "finish_reason": null}]}', "", None),
        ('{"choices": [{"delta": {}, "finish_reason": "length"}]}', None, "length"),
        ('{"choices": [{"delta": {"reasoning_content": "hmm"}}]}', "hmm", None),
        ('{"choices": [], "usage": null}', None, None),
    ],
)
def test_which_events_are_tokens(data, text, finish):
    event = parse_event(data)
    assert (event.text, event.finish_reason) == (text, finish)


def test_errors_and_malformed_events():
    assert parse_event('{"error": {"message": "out of memory", "code": 500}}').error == "out of memory"
    for bad in ("{not json", "[1, 2]", '{"choices": "x"}', '{"choices": [{"text": 5}]}'):
        with pytest.raises(MalformedStream):
            parse_event(bad)


def test_request_bodies():
    body = payload("completions", "m", [1, 2, 3], None, 16, ignore_eos=True)
    assert body == {
        "model": "m",
        "prompt": [1, 2, 3],
        "max_tokens": 16,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    chat = payload("chat", "m", None, [{"role": "user", "content": "hi"}], 4, ignore_eos=False, temperature=0.0)
    assert chat["messages"] == [{"role": "user", "content": "hi"}] and "ignore_eos" not in chat
    assert chat["temperature"] == 0.0 and chat["max_tokens"] == 4


@pytest.mark.parametrize(
    ("url", "root"),
    [
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/v1/completions", "http://127.0.0.1:8000"),
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000"),
        ("https://host.example/serve/v1/chat/completions", "https://host.example/serve"),
        ("http://[::1]:9000/metrics", "http://[::1]:9000"),
    ],
)
def test_base_urls(url, root):
    assert check_base_url(url) == root


@pytest.mark.parametrize("url", ["127.0.0.1:8000", "ftp://x", "http://", "http://h:99999", "http://h/?q=1"])
def test_bad_base_urls_are_one_line_errors(url):
    with pytest.raises(KvbenchError, match="target URL"):
        check_base_url(url)


def test_the_api_key_comes_from_the_environment_only(monkeypatch):
    monkeypatch.setenv("MY_KEY", " sk-test ")
    assert api_key_from_env("MY_KEY") == "sk-test"
    assert headers("sk-test")["Authorization"] == "Bearer sk-test"
    monkeypatch.setenv("EMPTY_KEY", "")
    assert api_key_from_env("EMPTY_KEY") is None and api_key_from_env(None) is None
    assert "Authorization" not in headers(None)


def test_error_messages_of_error_responses():
    assert error_message(b'{"error": {"message": "model x does not exist", "code": 404}}') == "model x does not exist"
    assert error_message(b'{"detail": [{"msg": "field required"}]}') == "field required"
    assert error_message(b"Too Many Requests") == "Too Many Requests"
    assert error_message(b"") == ""
    assert len(error_message(b"x" * 5000)) < 210


def test_a_key_never_travels_in_clear_text_off_this_machine():
    for url in ("http://127.0.0.1:8000", "http://localhost:8000", "http://[::1]:8000", "https://api.example.com"):
        check_key_transport(url, "sk-test")
    check_key_transport("http://gpu-box.example:8000", None)  # no key, nothing to leak
    with pytest.raises(KvbenchError, match="refusing to send the API key in clear text to gpu-box.example"):
        check_key_transport("http://gpu-box.example:8000", "sk-test")


def test_tokens_without_text_are_tokens_when_the_event_carries_their_ids():
    """kvbench serve with a preset (no tokenizer), or a server returning token ids: ``text`` is "" yet the event
    holds tokens; a stream may also merge the last tokens with the finish reason into one event."""
    merged = parse_event(json.dumps({"choices": [{"text": "", "finish_reason": "length", "token_ids": [27, 271]}]}))
    assert merged.text == "" and merged.finish_reason == "length"
    closing = parse_event(json.dumps({"choices": [{"text": "", "finish_reason": "length", "token_ids": []}]}))
    assert closing.text is None  # no token in it
    chat = parse_event(json.dumps({"choices": [{"delta": {"content": ""}, "finish_reason": "stop", "token_ids": [5]}]}))
    assert chat.text == ""
