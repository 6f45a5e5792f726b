"""Text and chat through the server, on a model with a tokenizer and a chat template (a tiny GGUF file the tests
write), loaded the way ``kvbench serve --model FILE.gguf`` loads it. The tokenizer is the oracle: the prompt ids are
its encoding, the answer text its decoding of the answer's tokens, and streamed text joins to the same answer."""

from __future__ import annotations

import pytest

from kvbench.serve.lifecycle import Server, ServerThread
from kvbench.serve.settings import ServeOptions

from .conftest import assert_idle_and_drained

openai = pytest.importorskip("openai")

CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say the word 'there'."}]


@pytest.fixture(scope="module")
def text_server(tiny_gguf):
    options = ServeOptions(
        model=str(tiny_gguf[0]),
        device="cpu",
        kv_memory_bytes=2**20,
        kv_memory_text="1MiB",
        max_len=256,
        threads=1,
        served_model_name="tiny-chat",
    )
    server = ServerThread(Server(options, "127.0.0.1", 0, metrics=False)).start()
    yield server, server.server.info.model.tokenizer
    server.stop()


@pytest.fixture()
def chat_server(text_server):
    yield text_server
    assert_idle_and_drained(text_server[0])


def _client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


def test_chat_answers_text_that_is_the_tokenizers_decoding(chat_server):
    server, tokenizer = chat_server
    answer = _client(server).chat.completions.create(
        model="tiny-chat",
        messages=CHAT,
        max_tokens=20,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = answer.choices[0]
    prompt = tokenizer(
        tokenizer.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True), add_special_tokens=False
    )["input_ids"]
    assert choice.prompt_token_ids == prompt and answer.usage.prompt_tokens == len(prompt)
    assert choice.message.role == "assistant" and answer.object == "chat.completion"
    assert choice.message.content == tokenizer.decode(choice.token_ids, skip_special_tokens=True)
    assert len(choice.token_ids) == 20 and choice.finish_reason == "length"


def test_streamed_chat_joins_to_the_same_answer(chat_server):
    server, _ = chat_server
    client = _client(server)
    whole = client.chat.completions.create(
        model="tiny-chat", messages=CHAT, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
    )
    chunks = list(
        client.chat.completions.create(
            model="tiny-chat",
            messages=CHAT,
            max_tokens=24,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert chunks[0].object == "chat.completion.chunk"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == 24 == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"


def test_text_prompts_are_encoded_and_answers_decoded(chat_server):
    server, tokenizer = chat_server
    answer = _client(server).completions.create(
        model="tiny-chat",
        prompt="the weather is",
        max_tokens=16,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    choice = answer.choices[0]
    assert choice.prompt_token_ids == tokenizer("the weather is")["input_ids"]
    assert choice.text == tokenizer.decode(choice.token_ids, skip_special_tokens=True)
    streamed = _client(server).completions.create(
        model="tiny-chat",
        prompt="the weather is",
        max_tokens=16,
        temperature=0,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    assert "".join(c.choices[0].text for c in streamed) == choice.text


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_ends_the_answer_where_vllm_ends_it(chat_server, stream):
    server, tokenizer = chat_server
    client = _client(server)
    free = client.completions.create(
        model="tiny-chat",
        prompt="the weather is",
        max_tokens=40,
        temperature=0,
        extra_body={"return_token_ids": True, "ignore_eos": True},
    ).choices[0]
    text = free.text
    stop = next(
        text[i : i + 2]
        for i in range(3, len(text) - 2)
        if text[i : i + 2].strip() and "\ufffd" not in text[i : i + 2] and text[i : i + 2] not in text[: i + 1]
    )
    at = text.index(stop)
    body = dict(
        model="tiny-chat",
        prompt="the weather is",
        max_tokens=40,
        temperature=0,
        stop=[stop],
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    if stream:
        chunks = list(client.completions.create(**body, stream=True, stream_options={"include_usage": True}))
        got = "".join(c.choices[0].text for c in chunks if c.choices)
        last = [c for c in chunks if c.choices][-1].choices[0]
        finish, stop_reason, tokens = last.finish_reason, last.stop_reason, chunks[-1].usage.completion_tokens
    else:
        choice = client.completions.create(**body).choices[0]
        got, finish, stop_reason, tokens = choice.text, choice.finish_reason, choice.stop_reason, len(choice.token_ids)
    assert got == text[:at] and finish == "stop" and stop_reason == stop
    # the answer counts the tokens up to the one whose text completed the stop string (text is read once it
    # does not end inside a character: random weights spell broken UTF-8 too)
    decoded = [tokenizer.decode(free.token_ids[:k]) for k in range(len(free.token_ids) + 1)]
    assert tokens == next(k for k, piece in enumerate(decoded) if stop in piece and not piece.endswith("\ufffd"))


def test_chat_refuses_messages_it_cannot_render(chat_server):
    server, _ = chat_server
    with pytest.raises(openai.BadRequestError, match="only text parts"):
        _client(server).chat.completions.create(
            model="tiny-chat",
            max_tokens=2,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}],
        )
