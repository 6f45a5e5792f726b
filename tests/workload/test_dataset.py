"""Datasets: ShareGPT and prompt JSONL read record by record, bad records counted, vLLM-like filtering and seeded
sampling, token counts with and without a tokenizer."""

from __future__ import annotations

import json

import pytest

from kvbench.errors import KvbenchError
from kvbench.workload.dataset import TokenCounter, builtin_datasets, read_dataset, sample_dataset


def _sharegpt(path, items) -> str:
    path.write_text(json.dumps(items))
    return str(path)


def _conversation(prompt: str, answer: str | None = None, roles=("human", "gpt")) -> dict:
    turns = [{"from": roles[0], "value": prompt}]
    if answer is not None:
        turns.append({"from": roles[1], "value": answer})
    return {"conversations": turns}


WORDS = "one two three four five six seven eight nine ten"


def test_sharegpt_takes_the_first_human_turn_and_the_answer_after_it(tmp_path):
    items = [
        {
            "conversations": [
                {"from": "system", "value": "be brief"},
                {"from": "human", "value": "hello there"},
                {"from": "gpt", "value": "hi"},
                {"from": "human", "value": "more"},
            ]
        },
        {"messages": [{"role": "user", "content": "question"}, {"role": "assistant", "content": "answer"}]},
        _conversation("no answer yet"),
    ]
    dataset = read_dataset(_sharegpt(tmp_path / "d.json", items))
    assert dataset.format == "sharegpt" and dataset.total == 3
    assert [(r.prompt, r.answer) for r in dataset.records] == [
        ("hello there", "hi"),
        ("question", "answer"),
        ("no answer yet", None),
    ]


def test_bad_records_are_counted_not_fatal(tmp_path):
    items = [
        _conversation(WORDS, WORDS),
        7,
        {"id": 1},
        {"conversations": [{"from": "gpt", "value": "only me"}]},
        _conversation("   ", WORDS),
    ]
    dataset = read_dataset(_sharegpt(tmp_path / "d.json", items))
    assert len(dataset.records) == 1
    assert dict(dataset.skipped) == {
        "not a JSON object": 1,
        "no conversations": 1,
        "no human turn": 1,
        "empty human turn": 1,
    }


@pytest.mark.parametrize(
    "text, message",
    [
        ("this is not json", "is not JSON"),
        ('[{"conversations": [', "is not valid JSON"),
        ("[]", "holds no records"),
        ('[{"conversations": [{"from": "gpt", "value": "x"}]}]', "none of its 1 records can be used (1 no human"),
        ("{not json\n{also not}\n", "is not JSON"),
    ],
)
def test_unusable_files_are_one_line_errors(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(KvbenchError, match=message.replace("(", r"\(")):
        read_dataset(path)


def test_jsonl_prompts_with_optional_output_lengths(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text(
        '{"prompt": "a b c d e", "output_len": 9}\n\n{"prompt": "f g h i j"}\nnot json\n'
        '{"prompt": ""}\n{"prompt": "k", "output_len": -1}\n'
    )
    dataset = read_dataset(path)
    assert dataset.format == "jsonl" and dataset.total == 5
    assert [(r.prompt, r.output_len) for r in dataset.records] == [("a b c d e", 9), ("f g h i j", None)]
    assert dict(dataset.skipped) == {"not valid JSON": 1, "no prompt": 1, "output_len not a positive integer": 1}
    sample = sample_dataset(path, TokenCounter(), max_len=64)
    assert sample.pairs == [(5, 9)] and sample.dropped == {"without an answer length": 1}
    eos = sample_dataset(path, TokenCounter(), max_len=64, need_output=False)
    assert [r.output_len for r in eos.requests] == [9, None]


def test_filtering_like_vllm_and_a_note_of_what_was_dropped(tmp_path):
    long = " ".join(["word"] * 60)
    items = [
        _conversation(WORDS, WORDS),
        _conversation("hi", WORDS),
        _conversation(WORDS, "ok"),
        _conversation(long, long),
        _conversation(WORDS),
    ]
    sample = sample_dataset(_sharegpt(tmp_path / "d.json", items), TokenCounter(), max_len=100)
    assert sample.pairs == [(10, 10)]
    assert sample.dropped == {"shorter than 4 tokens": 2, "longer than max-len 100": 1, "without an answer length": 1}
    assert "1 requests from 1 of the 5 records" in sample.note() and "2 shorter than 4 tokens" in sample.note()
    with pytest.raises(KvbenchError, match="no record is left after filtering"):
        sample_dataset(_sharegpt(tmp_path / "d.json", items), TokenCounter(), max_len=12)


def test_seeded_sampling_with_and_without_replacement(tmp_path):
    items = [_conversation(f"{WORDS} {'x ' * i}", WORDS) for i in range(10)]
    path = _sharegpt(tmp_path / "d.json", items)
    a = sample_dataset(path, TokenCounter(), 512, count=5, seed=1)
    assert a.pairs == sample_dataset(path, TokenCounter(), 512, count=5, seed=1).pairs
    assert a.pairs != sample_dataset(path, TokenCounter(), 512, count=5, seed=2).pairs
    assert len({p for p, _ in a.pairs}) == 5 and not a.with_replacement
    many = sample_dataset(path, TokenCounter(), 512, count=25, seed=1)
    assert len(many.requests) == 25 and many.with_replacement and "with replacement" in many.note()
    assert many.pairs[:5] == a.pairs  # the points of a sweep take prefixes of one list
    assert sorted(many.pairs[:10]) == sorted(sample_dataset(path, TokenCounter(), 512).pairs)  # each once first
    assert [p for p, _ in sample_dataset(path, TokenCounter(), 512).pairs] == [10 + i for i in range(10)]


class FakeTokenizer:
    """Characters as tokens; a chat template that wraps the prompt."""

    chat_template = "yes"
    name_or_path = "fake"

    def apply_chat_template(self, messages, tokenize, add_generation_prompt):
        assert not tokenize and add_generation_prompt
        return f"<u>{messages[0]['content']}</u><a>"

    def __call__(self, texts, add_special_tokens):
        assert not add_special_tokens  # the template writes its own markers
        return {"input_ids": [[ord(c) for c in text] for text in texts]}


def test_tokenizer_counts_through_the_chat_template(tmp_path):
    path = _sharegpt(tmp_path / "d.json", [_conversation("abcd", "xyzw")])
    sample = sample_dataset(path, TokenCounter(FakeTokenizer()), 64)
    request = sample.requests[0]
    assert request.prompt_len == len("<u>abcd</u><a>") and request.output_len == 4
    assert request.prompt_token_ids == [ord(c) for c in "<u>abcd</u><a>"]
    assert "chat template" in sample.counted_by


def test_the_shipped_sample_has_a_spread_of_lengths():
    path = builtin_datasets()["real-chat"]
    dataset = read_dataset(path)
    assert 45 <= dataset.total <= 60 and not dataset.skipped
    sample = sample_dataset(path, TokenCounter(), 2048)
    outputs = sorted(o for _, o in sample.pairs)
    assert outputs[0] < 10 and outputs[-1] > 300  # one-word answers and essays
    assert max(p for p, _ in sample.pairs) > 100  # and prompts that paste text
    assert read_dataset("real-chat").path == path


def test_the_note_reads_the_same_from_a_runs_recorded_dataset():
    """Reports rebuild the note from ``meta.dataset`` (the sample is gone by then): the same sentence."""
    from kvbench.workload.dataset import left_out, sample_note

    sample = sample_dataset("real-chat", TokenCounter(), 1024, 10, 0)
    assert sample_note(sample.as_dict()) == sample.note()
    assert left_out(sample.as_dict()) == "4 shorter than 4 tokens" and left_out({"dropped_records": {}}) == ""
