"""The server through real clients on 127.0.0.1: the official ``openai`` client (streamed and not) and plain HTTP.

A preset has no tokenizer, so these requests send token ids and read each choice's ``token_ids``; the tokens must
equal what the same engine gives in process (greedy). Text and chat run on a tokenizer-bearing model in
``test_text_models.py``; faults (disconnects, a full pool, shutdown) in ``test_faults.py``.
"""

from __future__ import annotations

import json
import re
import time
import urllib.error
import urllib.request

import pytest

from kvbench.engine.config import EngineConfig
from kvbench.engine.sampling import SamplingParams
from kvbench.studies.local_model import build_engine

openai = pytest.importorskip("openai")

PROMPTS = [[5, 9, 2, 7], [11] * 20, [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5]]


def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def http(server, path: str, body: bytes | dict | None = None, method: str | None = None):
    """(status, headers, body bytes) of a plain HTTP request."""
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    request = urllib.request.Request(
        server.url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.headers, err.read()


@pytest.fixture(scope="module")
def expected(tiny_model):
    """Greedy tokens of the same model in process (an engine of its own), 12 per prompt."""
    engine = build_engine(tiny_model, EngineConfig(block_size=16, num_blocks=64, max_len=256))
    return engine.generate(PROMPTS, SamplingParams(max_tokens=12, ignore_eos=True))


def test_completions_with_the_openai_client_equal_the_engine_in_process(server, expected):
    for prompt, tokens in zip(PROMPTS, expected, strict=True):
        answer = client(server).completions.create(
            model="tiny", prompt=prompt, max_tokens=12, temperature=0, extra_body={"ignore_eos": True}
        )
        choice = answer.choices[0]
        assert choice.token_ids == tokens
        assert choice.finish_reason == "length" and choice.text == ""
        assert answer.usage.prompt_tokens == len(prompt) and answer.usage.completion_tokens == 12
        assert answer.usage.total_tokens == len(prompt) + 12 and answer.object == "text_completion"
        assert answer.id.startswith("cmpl-") and answer.model == "tiny"


def test_streamed_completions_with_the_openai_client(server, expected):
    stream = client(server).completions.create(
        model="tiny",
        prompt=PROMPTS[1],
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    *deltas, last = chunks
    assert last.choices == [] and last.usage.completion_tokens == 12 and last.usage.prompt_tokens == 20
    assert [t for c in deltas for t in c.choices[0].token_ids] == expected[1]
    assert all(c.usage is None for c in deltas)
    assert [c.choices[0].finish_reason for c in deltas] == [None] * (len(deltas) - 1) + ["length"]
    assert len({c.id for c in chunks}) == 1
    assert deltas[0].choices[0].prompt_token_ids == PROMPTS[1]  # sent once, on the first event


def test_a_batch_of_prompts_and_n_samples_make_indexed_choices(server):
    body = {
        "prompt": [PROMPTS[0], PROMPTS[2]],
        "max_tokens": 5,
        "n": 3,
        "temperature": 0.8,
        "seed": 7,
        "ignore_eos": True,
    }
    status, _, raw = http(server, "/v1/completions", body)
    answer = json.loads(raw)
    assert status == 200 and [c["index"] for c in answer["choices"]] == list(range(6))
    assert [c["prompt_token_ids"] for c in answer["choices"]] == [PROMPTS[0]] * 3 + [PROMPTS[2]] * 3
    assert all(len(c["token_ids"]) == 5 for c in answer["choices"])
    cached = answer["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert answer["usage"] == {
        "prompt_tokens": len(PROMPTS[0]) + len(PROMPTS[2]),
        "total_tokens": 45,
        "completion_tokens": 30,
        "prompt_tokens_details": {"cached_tokens": cached},
    }
    status, _, again = http(server, "/v1/completions", body)
    assert [c["token_ids"] for c in json.loads(again)["choices"]] == [c["token_ids"] for c in answer["choices"]]
    # the second time each prompt's leading full blocks are cached, counted once per prompt (not per sample)
    block = 16
    expected = sum((len(p) - 1) // block * block for p in (PROMPTS[0], PROMPTS[2]))
    assert json.loads(again)["usage"]["prompt_tokens_details"]["cached_tokens"] == expected


def test_stop_token_ids_end_a_choice_with_its_stop_reason(server, expected):
    stop = expected[0][4]
    first = expected[0].index(stop)
    answer = client(server).completions.create(
        model="tiny", prompt=PROMPTS[0], max_tokens=12, temperature=0, extra_body={"stop_token_ids": [stop]}
    )
    choice = answer.choices[0]
    assert choice.token_ids == expected[0][: first + 1]
    assert choice.finish_reason == "stop" and choice.stop_reason == stop


def test_streamed_events_are_server_sent_events_as_vllm_writes_them(server):
    body = {"prompt": [1, 2, 3], "max_tokens": 3, "temperature": 0, "stream": True}
    status, headers, raw = http(server, "/v1/completions", body)
    assert status == 200 and headers["Content-Type"].startswith("text/event-stream")
    events = raw.decode().split("\n\n")
    assert events[-2:] == ["data: [DONE]", ""]
    bodies = [json.loads(e.removeprefix("data: ")) for e in events[:-2]]
    assert all("usage" not in b for b in bodies)  # no usage unless asked for
    # a token per event, or several in one when the front end reads a step late (the engine runs on)
    assert sum(len(b["choices"][0]["token_ids"]) for b in bodies) == 3 and 1 <= len(bodies) <= 3
    assert [b["choices"][0]["finish_reason"] for b in bodies] == [None] * (len(bodies) - 1) + ["length"]
    _, _, whole = http(server, "/v1/completions", {**body, "stream": False})
    assert "".join(b["choices"][0]["text"] for b in bodies) == json.loads(whole)["choices"][0]["text"]


def test_models_health_version_and_metrics(server):
    status, _, raw = http(server, "/v1/models")
    assert status == 200 and json.loads(raw)["data"][0]["id"] == "tiny"
    assert json.loads(raw)["data"][0]["max_model_len"] == 256
    assert http(server, "/health")[0] == 200
    assert json.loads(http(server, "/version")[2])["version"]
    _, _, before = http(server, "/metrics")
    http(server, "/v1/completions", {"prompt": [1, 2], "max_tokens": 7, "ignore_eos": True})
    server.server.engine.wait_idle(30)
    _, headers, after = http(server, "/metrics")
    assert headers["Content-Type"].startswith("text/plain")

    def value(text: bytes, name: str) -> float:
        match = re.search(rf'^{name}\{{device="cpu",engine="paged"\}} (\S+)$', text.decode(), re.MULTILINE)
        return float(match.group(1))

    assert value(after, "kvbench_generated_tokens_total") - value(before, "kvbench_generated_tokens_total") == 7
    assert value(after, "kvbench_prompt_tokens_total") - value(before, "kvbench_prompt_tokens_total") == 2
    assert value(after, "kvbench_requests_finished_total") - value(before, "kvbench_requests_finished_total") == 1
    assert value(after, "kvbench_kv_cache_blocks_used") == 0 and value(after, "kvbench_requests_running") == 0
    assert value(after, "kvbench_kv_cache_blocks_capacity") == 256
    assert value(after, "kvbench_kv_cache_blocks_free") == 256
    assert "kvbench_block_alloc_latency_seconds_bucket" in after.decode()


def test_the_engine_counts_its_steps_and_their_seconds_by_phase(server):
    """One request of a 2-token prompt and 7 tokens out: one prefill step computing 2 tokens (its first token),
    then 6 decode steps of one token each, every one timed."""

    def steps(text: bytes) -> dict[tuple[str, str], float]:
        found = re.findall(
            r'^kvbench_engine_step(s|_seconds|_tokens)_total\{device="cpu",engine="paged",phase="(\w+)"\} (\S+)$',
            text.decode(),
            re.MULTILINE,
        )
        return {(kind, phase): float(value) for kind, phase, value in found}

    _, _, before = http(server, "/metrics")
    time.sleep(0.5)  # idle: no step's time
    sent = time.perf_counter()
    http(server, "/v1/completions", {"prompt": [1, 2], "max_tokens": 7, "ignore_eos": True})
    server.server.engine.wait_idle(30)
    wall = time.perf_counter() - sent
    _, _, after = http(server, "/metrics")
    start, end = steps(before), steps(after)
    assert len(start) == len(end) == 6  # steps, seconds and tokens of both phases
    grew = {key: end[key] - start[key] for key in end}
    assert grew[("s", "prefill")] == 1 and grew[("_tokens", "prefill")] == 2
    assert grew[("s", "decode")] == 6 and grew[("_tokens", "decode")] == 6
    assert grew[("_seconds", "prefill")] > 0 and grew[("_seconds", "decode")] > 0
    assert grew[("_seconds", "prefill")] + grew[("_seconds", "decode")] < wall  # the idle wait is in no step


@pytest.mark.parametrize(
    "body, status, param, words",
    [
        (b"{not json", 400, None, "not valid JSON"),
        (b'{"prompt": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, None, "not valid JSON"),
        (b'{"prompt": "\\ud800 x", "max_tokens": 2}', 400, None, "lone surrogate"),
        (b"[1, 2]", 400, None, "must be a JSON object"),
        ({"model": "gpt-4", "prompt": [1]}, 404, "model", "does not exist"),
        ({"prompt": [1], "max_tokens": 10**9}, 400, "max_tokens", "cannot be greater than"),
        ({"prompt": [1] * 256, "max_tokens": 1}, 400, "prompt", "maximum context length is 256"),
        ({"prompt": [1], "temperature": -1}, 400, "temperature", "non-negative"),
        ({"prompt": [1], "top_p": 0}, 400, "top_p", "(0, 1]"),
        ({"prompt": [1], "max_tokens": "ten"}, 400, "max_tokens", "must be an integer"),
        ({"prompt": [1], "max_tokens": 0}, 400, "max_tokens", "at least 1"),
        ({"prompt": [1], "n": 2, "temperature": 0}, 400, "n", "greedily"),
        ({"prompt": [512]}, 400, "prompt", "out of the vocabulary"),
        ({"prompt": []}, 400, "prompt", "not empty"),
        ({"prompt": "hello"}, 400, "prompt", "no tokenizer"),
        ({"prompt": [1], "stop": "x"}, 400, "stop", "need a tokenizer"),
        ({"prompt": [1], "logprobs": 2}, 400, "logprobs", "not supported"),
        ({"prompt": [1], "stream_options": {"include_usage": True}}, 400, "stream_options", "when stream is true"),
        ({"messages": [{"role": "user", "content": "hi"}]}, 400, "messages", "chat template"),
    ],
)
def test_bad_requests_get_openai_error_bodies(server, body, status, param, words):
    path = "/v1/chat/completions" if isinstance(body, dict) and "messages" in body else "/v1/completions"
    got, headers, raw = http(server, path, body)
    error = json.loads(raw)["error"]
    assert got == status and error["code"] == status and error["param"] == param
    assert words in error["message"] and "Traceback" not in raw.decode()
    assert headers["Content-Type"].startswith("application/json")


def test_neutral_values_of_unsupported_parameters_are_accepted(server):
    body = {
        "prompt": [1, 2],
        "max_tokens": 2,
        "repetition_penalty": 1.0,
        "logprobs": None,
        "echo": False,
        "presence_penalty": 0,
        "user": "someone",
        "unknown_field": 1,
    }
    assert http(server, "/v1/completions", body)[0] == 200


def test_the_openai_client_raises_its_own_errors(server):
    with pytest.raises(openai.BadRequestError, match="cannot be greater than"):
        client(server).completions.create(model="tiny", prompt=[1], max_tokens=10**6)
    with pytest.raises(openai.NotFoundError):
        client(server).completions.create(model="other", prompt=[1], max_tokens=1)


def test_unknown_paths_and_methods_answer_json(server):
    status, _, raw = http(server, "/v1/nothing")
    assert status == 404 and json.loads(raw)["error"]["code"] == 404
    status, headers, raw = http(server, "/v1/completions", method="GET")
    assert status == 405 and "POST" in headers["Allow"] and json.loads(raw)["error"]["code"] == 405


def test_max_tokens_is_capped_by_the_room_left_under_max_len(server):
    status, _, raw = http(server, "/v1/completions", {"prompt": [1] * 250, "max_tokens": 100, "ignore_eos": True})
    choice = json.loads(raw)["choices"][0]
    assert status == 200 and len(choice["token_ids"]) == 6 and choice["finish_reason"] == "length"
