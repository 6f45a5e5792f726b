"""JSONL request files: exact replay of prompt token ids and output lengths, one-line errors for bad lines."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.errors import KvbenchError
from kvbench.workload.requests_file import load_requests_jsonl, write_requests_jsonl


def _write(path, *lines: str):
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_reads_output_len_and_max_tokens_and_ignores_prompt_text(tmp_path):
    path = _write(
        tmp_path / "reqs.jsonl",
        json.dumps({"prompt_token_ids": [1, 2, 3], "output_len": 4}),
        "",
        json.dumps({"prompt_token_ids": [7], "max_tokens": 2, "prompt": "hello", "id": "abc"}),
        json.dumps({"prompt_token_ids": [0, 5], "output_len": 3, "max_tokens": 3}),
        json.dumps({"prompt_token_ids": [9], "output_len": 6.0, "max_tokens": None}),
    )
    assert load_requests_jsonl(path) == [([1, 2, 3], 4), ([7], 2), ([0, 5], 3), ([9], 6)]
    assert load_requests_jsonl(str(path), vocab_size=10) == load_requests_jsonl(path)


def test_write_then_load_round_trips_exactly(tmp_path):
    items = [([1, 2, 3], 4), ((5, 6), 1), (list(range(300)), 128)]
    path = write_requests_jsonl(tmp_path / "sub" / "trace.jsonl", items)
    assert path == tmp_path / "sub" / "trace.jsonl"
    assert load_requests_jsonl(path) == [(list(ids), n) for ids, n in items]
    assert not [p for p in path.parent.iterdir() if p.name != "trace.jsonl"]  # no temporary file left
    write_requests_jsonl(path, [([8], 2)])  # overwrites atomically
    assert load_requests_jsonl(path) == [([8], 2)]


def test_writer_takes_tensors_and_arrays(tmp_path):
    import numpy as np
    import torch

    path = write_requests_jsonl(tmp_path / "t.jsonl", [(torch.tensor([3, 4]), 2), (np.array([5]), 1)])
    assert load_requests_jsonl(path) == [([3, 4], 2), ([5], 1)]


@settings(max_examples=30, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 2**31), min_size=1, max_size=20), st.integers(1, 10**6)),
        min_size=1,
        max_size=10,
    )
)
def test_round_trip_property(tmp_path_factory, items):
    path = tmp_path_factory.mktemp("rt") / "r.jsonl"
    write_requests_jsonl(path, items)
    assert load_requests_jsonl(path) == items


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(KvbenchError, match="requests file not found"):
        load_requests_jsonl(tmp_path / "nope.jsonl")
    with pytest.raises(KvbenchError, match="not a file"):
        load_requests_jsonl(tmp_path)


def test_empty_file_is_a_clear_error(tmp_path):
    with pytest.raises(KvbenchError, match="holds no requests"):
        load_requests_jsonl(_write(tmp_path / "e.jsonl", "", "  "))


def test_bad_json_names_the_line(tmp_path):
    path = _write(tmp_path / "r.jsonl", json.dumps({"prompt_token_ids": [1], "output_len": 1}), "{oops")
    with pytest.raises(KvbenchError, match=r"r\.jsonl:2: not valid JSON"):
        load_requests_jsonl(path)


def test_non_utf8_is_a_clear_error(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_bytes(b"\xff\xfe{}\n")
    with pytest.raises(KvbenchError, match="cannot read requests file"):
        load_requests_jsonl(path)


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ([1, 2], "expected a JSON object"),
        ({"output_len": 3}, "prompt_token_ids is missing"),
        ({"prompt_token_ids": [1]}, r"output_len \(or max_tokens\) is missing"),
        ({"prompt_token_ids": [1], "output_len": None}, "is missing"),
        ({"prompt_token_ids": "1 2 3", "output_len": 3}, "must be a list"),
        ({"prompt_token_ids": [], "output_len": 3}, "is empty"),
        ({"prompt_token_ids": [1, -2], "output_len": 3}, "position 1 is negative"),
        ({"prompt_token_ids": [1, 2.5], "output_len": 3}, "position 1 is not an integer"),
        ({"prompt_token_ids": [True], "output_len": 3}, "position 0 is not an integer"),
        ({"prompt_token_ids": [1], "output_len": 0}, "output_len must be a positive integer"),
        ({"prompt_token_ids": [1], "output_len": -4}, "output_len must be a positive integer"),
        ({"prompt_token_ids": [1], "output_len": 2.5}, "output_len must be a positive integer"),
        ({"prompt_token_ids": [1], "output_len": "8"}, "output_len must be a positive integer"),
        ({"prompt_token_ids": [1], "max_tokens": -1}, "max_tokens must be a positive integer"),
        ({"prompt_token_ids": [1], "output_len": 3, "max_tokens": 4}, "disagree"),
    ],
)
def test_bad_rows_name_the_line_and_the_problem(tmp_path, row, message):
    good = json.dumps({"prompt_token_ids": [1], "output_len": 1})
    path = _write(tmp_path / "r.jsonl", good, good, json.dumps(row))
    with pytest.raises(KvbenchError, match=message) as err:
        load_requests_jsonl(path)
    assert "r.jsonl:3:" in str(err.value)
    assert "\n" not in str(err.value)


def test_token_ids_outside_the_vocabulary_are_rejected(tmp_path):
    path = _write(tmp_path / "r.jsonl", json.dumps({"prompt_token_ids": [0, 511, 512], "output_len": 1}))
    with pytest.raises(KvbenchError, match=r"token id 512 at position 2 is outside the vocabulary \(size 512\)"):
        load_requests_jsonl(path, vocab_size=512)
    assert load_requests_jsonl(path, vocab_size=513) == [([0, 511, 512], 1)]


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ([], "no requests"),
        ([([1], 0)], "output_len must be a positive integer"),
        ([([], 3)], "is empty"),
        ([("abc", 3)], "must be a list"),
        ([([1, -1], 3)], "negative"),
        ([(1, 2, 3)], "pair"),
    ],
)
def test_writer_validates_before_writing(tmp_path, items, message):
    path = tmp_path / "w.jsonl"
    with pytest.raises(KvbenchError, match=message):
        write_requests_jsonl(path, items)
    assert not path.exists()
