"""Length distributions (seeded, clipped, split) and trace files (CSV / JSONL), with one-line errors."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.errors import KvbenchError
from kvbench.workload.lengths import DISTRIBUTIONS, LengthSpec, load_trace


def test_fixed_lengths_split_by_prompt_ratio():
    pairs = LengthSpec(500, 2048, "fixed", prompt_ratio=0.5).sample(3, seed=0)
    assert pairs == [(250, 250)] * 3
    assert LengthSpec(10, 20, "fixed", prompt_ratio=0.3).sample(1, 0) == [(3, 7)]
    assert LengthSpec(2, 20, "fixed", prompt_ratio=0.9).sample(1, 0) == [(1, 1)]  # both parts at least 1


@settings(max_examples=40, deadline=None)
@given(
    distribution=st.sampled_from(DISTRIBUTIONS),
    max_len=st.integers(2, 4096),
    mean_frac=st.floats(0.0, 1.0),
    ratio=st.floats(0.01, 0.99),
    seed=st.integers(0, 2**32 - 1),
)
def test_samples_are_valid_and_reproducible(distribution, max_len, mean_frac, ratio, seed):
    mean = max(2, int(mean_frac * max_len))
    spec = LengthSpec(mean, max_len, distribution, ratio)
    pairs = spec.sample(50, seed)
    assert len(pairs) == 50
    for prompt, output in pairs:
        assert isinstance(prompt, int) and isinstance(output, int)
        assert prompt >= 1 and output >= 1 and prompt + output <= max_len
    assert spec.sample(50, seed) == pairs


def test_lognormal_mean_is_close_to_the_requested_mean():
    pairs = LengthSpec(500, 100_000, "lognormal").sample(20_000, seed=1)
    mean = sum(p + o for p, o in pairs) / len(pairs)
    assert mean == pytest.approx(500, rel=0.03)


def test_different_seeds_differ():
    spec = LengthSpec(500, 2048, "exponential")
    assert spec.sample(20, 1) != spec.sample(20, 2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"mean_len": 0}, "mean length"),
        ({"mean_len": 1}, "mean length"),
        ({"mean_len": 3000, "max_len": 2048}, "mean length"),
        ({"max_len": 1, "mean_len": 1}, "max-len"),
        ({"max_len": -5}, "max-len"),
        ({"distribution": "zipf"}, "unknown length distribution"),
        ({"prompt_ratio": 0.0}, "prompt ratio"),
        ({"prompt_ratio": 1.0}, "prompt ratio"),
        ({"sigma": -1.0}, "sigma"),
        ({"sigma": 1e300}, "sigma must be between 0 and 10"),  # its square overflowed the lognormal's mean
        ({"sigma": float("nan")}, "sigma"),
    ],
)
def test_bad_specs_are_refused(kwargs, message):
    with pytest.raises(KvbenchError, match=message):
        LengthSpec(**kwargs)


def test_sampling_zero_requests_is_refused():
    with pytest.raises(KvbenchError, match="at least 1"):
        LengthSpec().sample(0, 0)


def test_jsonl_trace(tmp_path):
    trace = tmp_path / "trace.jsonl"
    trace.write_text(
        json.dumps({"prompt_len": 10, "output_len": 5})
        + "\n\n"
        + json.dumps({"prompt_token_ids": [1, 2, 3], "max_tokens": 4})
        + "\n"
        + json.dumps({"prompt_len": "7", "output_len": 2.0})
        + "\n"
    )
    assert load_trace(trace) == [(10, 5), (3, 4), (7, 2)]


def test_csv_trace(tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("prompt_len,output_len\n10,5\n3,4\n")
    assert load_trace(trace) == [(10, 5), (3, 4)]
    trace.write_text('prompt_token_ids,max_tokens\n"[1, 2]",3\n')
    assert load_trace(trace) == [(2, 3)]


@pytest.mark.parametrize(
    "name, text, message",
    [
        ("bad.jsonl", '{"prompt_len": 3, "output_len": 2}\n{not json\n', r"bad.jsonl:2: not valid JSON"),
        ("list.jsonl", "[1, 2]\n", "expected a JSON object"),
        ("missing.jsonl", '{"prompt_len": 3}\n', "output_len is missing"),
        ("zero.jsonl", '{"prompt_len": 0, "output_len": 2}\n', "positive integer"),
        ("neg.jsonl", '{"prompt_len": 3, "output_len": -2}\n', "positive integer"),
        ("frac.jsonl", '{"prompt_len": 3.5, "output_len": 2}\n', "positive integer"),
        ("word.jsonl", '{"prompt_len": "abc", "output_len": 2}\n', "positive integer"),
        ("inf.jsonl", '{"prompt_len": 3, "output_len": Infinity}\n', "positive integer"),
        ("nan.csv", "prompt_len,output_len\nnan,3\n", "positive integer"),
        ("inf.csv", "prompt_len,output_len\n3,inf\n", "positive integer"),
        ("ids.jsonl", '{"prompt_token_ids": 5, "output_len": 2}\n', "not a list"),
        ("empty_ids.jsonl", '{"prompt_token_ids": [], "output_len": 2}\n', "empty prompt"),
        ("empty.jsonl", "\n\n", "holds no requests"),
        ("bad.csv", "prompt_len,output_len\n10,\n", "output_len is missing"),
        ("cols.csv", "a,b\n1,2\n", "prompt_len is missing"),
        ("header.csv", "prompt_len,output_len\n", "holds no requests"),
        ("ids.csv", 'prompt_token_ids,output_len\n"[1, 2",3\n', "not a list"),
    ],
)
def test_malformed_traces_give_one_line_errors(tmp_path, name, text, message):
    trace = tmp_path / name
    trace.write_text(text)
    with pytest.raises(KvbenchError, match=message) as caught:
        load_trace(trace)
    assert "\n" not in str(caught.value)


def test_missing_and_unreadable_traces(tmp_path):
    with pytest.raises(KvbenchError, match="trace file not found"):
        load_trace(tmp_path / "nope.jsonl")
    with pytest.raises(KvbenchError, match="is not a regular file"):
        load_trace(tmp_path)  # a directory: said as such, not as missing
    binary = tmp_path / "binary.jsonl"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(KvbenchError, match="cannot read trace"):
        load_trace(binary)
