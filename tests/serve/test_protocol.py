"""Request checking and response shapes, without a server: defaults as OpenAI and vLLM set them, the limits of
max-len, and the fast stream encoder held to the plain dict builders event by event."""

from __future__ import annotations

import json

import pytest

from kvbench.serve.protocol import (
    ApiError,
    ChoiceResult,
    Generation,
    ModelInfo,
    StreamEncoder,
    chunk_body,
    delta_row,
    parse_generation,
    response_body,
)

PRESET = ModelInfo(name="tiny", max_len=64, vocab_size=512)


def test_completion_defaults_are_openais():
    generation = parse_generation({"prompt": [1, 2, 3]}, "completion", PRESET)
    params = generation.params[0]
    assert params.max_tokens == 16 and params.temperature == 1.0 and params.top_p == 1.0
    assert params.seed is None and not params.ignore_eos
    assert generation.n == 1 and not generation.stream and generation.request_id.startswith("cmpl-")
    assert generation.return_token_ids  # a model without a tokenizer has no text: its token ids are the answer


def test_max_tokens_is_capped_by_each_prompts_room():
    generation = parse_generation({"prompt": [[1] * 60, [2] * 10], "max_tokens": 20}, "completion", PRESET)
    assert [p.max_tokens for p in generation.params] == [4, 20]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": [1] * 64}, "prompt"),
        ({"prompt": [1], "max_tokens": 65}, "max_tokens"),
        ({"prompt": [1], "seed": -1}, "seed"),
        ({"prompt": [1], "top_k": -2}, "top_k"),
        ({"prompt": [1], "n": 129, "temperature": 1}, "n"),
        ({"prompt": [1], "best_of": 3}, "best_of"),
        ({"prompt": [1], "stop_token_ids": [600]}, "stop_token_ids"),
        ({"prompt": [1], "ignore_eos": "yes"}, "ignore_eos"),
        ({"prompt": [1], "stream": 1}, "stream"),
        ({"prompt": [1.5]}, "prompt"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"prompt": [1], "response_format": {"type": "json_object"}}, "response_format"),
        ({"prompt": [1], "frequency_penalty": 0.5}, "frequency_penalty"),
    ],
)
def test_bad_parameters_name_themselves(body, param):
    with pytest.raises(ApiError) as caught:
        parse_generation(body, "completion", PRESET)
    assert caught.value.status == 400 and caught.value.param == param


def test_an_error_body_is_openais():
    error = ApiError(503, "busy")
    assert error.body() == {"error": {"message": "busy", "type": "ServiceUnavailableError", "param": None, "code": 503}}


def _generation(kind: str, return_ids: bool) -> Generation:
    generation = parse_generation(
        {"prompt": [[4, 5], [6]], "n": 2, "temperature": 0.7, "max_tokens": 3}, "completion", PRESET
    )
    generation.kind = kind
    generation.return_token_ids = return_ids
    return generation


@pytest.mark.parametrize("kind", ["completion", "chat"])
@pytest.mark.parametrize("return_ids", [False, True])
@pytest.mark.parametrize(
    "text, finish, stop, first, usage_now",
    [
        ("", None, None, True, None),
        ('héllo "quoted"\n\\', None, None, False, {"prompt_tokens": 2, "total_tokens": 3, "completion_tokens": 1}),
        ("end", "stop", "</s>", False, None),
        ("", "stop", 17, False, None),
        ("x", "length", None, True, None),
    ],
)
def test_the_stream_encoder_writes_the_events_the_dict_builders_describe(
    kind, return_ids, text, finish, stop, first, usage_now
):
    generation = _generation(kind, return_ids)
    raw = StreamEncoder(generation).delta(3, text, [7, 8], finish, stop, first, usage_now)
    assert raw.startswith(b"data: ") and raw.endswith(b"\n\n")
    expected = chunk_body(generation, [delta_row(generation, 3, text, [7, 8], finish, stop, first)], usage_now)
    assert json.loads(raw[6:]) == expected
    if return_ids and first:
        assert expected["choices"][0]["prompt_token_ids"] == [6]  # choice 3 is the second prompt's second sample


def test_a_response_counts_usage_over_choices_and_prompts_once():
    generation = _generation("completion", True)
    body = response_body(generation, [ChoiceResult("", [1, 2, 3], "length")] * 4)
    assert body["usage"] == {"prompt_tokens": 3, "total_tokens": 15, "completion_tokens": 12}
    assert [c["prompt_token_ids"] for c in body["choices"]] == [[4, 5], [4, 5], [6], [6]]
