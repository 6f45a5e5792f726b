"""Hash-id traces: reading both conventions, one-line errors with the line, subsets, and token synthesis."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.errors import KvbenchError
from kvbench.workload.prefix_trace import (
    block_token_ids,
    builtin_traces,
    prompt_token_ids,
    read_prefix_trace,
    resolve_trace,
    session_trace,
    shared_prefix_trace,
    sharegpt_sessions,
    trace_from_prompts,
)


def write_rows(tmp_path, rows: list[dict]) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(row) for row in rows) + "\n")
    return str(path)


def row(timestamp=0, input_length=1000, output_length=10, hash_ids=(0, 1), **more):
    return {
        "timestamp": timestamp,
        "input_length": input_length,
        "output_length": output_length,
        "hash_ids": list(hash_ids),
        **more,
    }


def test_the_shipped_mooncake_excerpt():
    trace = read_prefix_trace(resolve_trace("mooncake-conversation-1k"))
    assert len(trace.requests) == 1000 and trace.block_size == 512
    assert all(len(r.hash_ids) == -(-r.input_len // 512) for r in trace.requests)
    assert trace.requests[0].arrival_s == 0.0 and trace.duration_s == pytest.approx(330.0)
    assert "mooncake-conversation-1k" in builtin_traces()


@pytest.mark.parametrize(
    "bad, message",
    [
        ({"timestamp": 0, "input_length": 10, "output_length": 1}, "missing field(s) hash_ids"),
        (row(timestamp=-1), "timestamp must be a number of milliseconds from 0"),
        (row(input_length=-5), "input_length must be an integer from 1 to 10,000,000"),
        (row(output_length=-1), "output_length must be an integer from 0 to"),
        (row(output_length=10**15), "output_length must be an integer from 0 to"),
        (row(input_length=True), "input_length must be an integer from 1"),
        (row(timestamp=1e300), "timestamp must be a number of milliseconds from 0"),
        (row(hash_ids=(0, 1, 2)), "3 hash ids for 1,000 prompt tokens: more than the 2 blocks"),
        (row(hash_ids=(0,)), "1 hash ids for 1,000 prompt tokens: fewer than the 2 blocks"),
        (row(hash_ids=(0, -1)), "hash_ids must hold non-negative integers"),
        ({**row(), "hash_ids": "0,1"}, "hash_ids must be a list"),
        (row(timestamp=float("inf")), "timestamp must be a number of milliseconds"),
    ],
)
def test_bad_lines_name_the_line(tmp_path, bad, message):
    path = tmp_path / "trace.jsonl"
    path.write_text(json.dumps(row()) + "\n" + json.dumps(bad).replace("Infinity", "1e999") + "\n")
    with pytest.raises(KvbenchError) as caught:
        read_prefix_trace(path)
    text = str(caught.value)
    assert text.startswith(f"{path}:2: ") and message in text and "\n" not in text


def test_time_must_not_go_backwards(tmp_path):
    path = write_rows(tmp_path, [row(timestamp=500), row(timestamp=400)])
    with pytest.raises(KvbenchError, match=r"trace.jsonl:2: timestamp 400 comes before the previous line's 500"):
        read_prefix_trace(path)


def test_an_empty_trace_is_refused(tmp_path):
    path = tmp_path / "empty.jsonl"
    path.write_text("\n")
    with pytest.raises(KvbenchError, match="holds no requests"):
        read_prefix_trace(path)


def test_cumulative_sessions_build_on_their_previous_prompt(tmp_path):
    rows = [
        row(timestamp=0, input_length=700, hash_ids=(1, 2), session_id="a"),  # 512 + 188
        row(timestamp=5, input_length=400, hash_ids=(3,), session_id="b"),
        row(timestamp=9, input_length=400, hash_ids=(4, 5), session_id="a"),  # 1100 tokens: block 2 grows, then 5
    ]
    trace = read_prefix_trace(write_rows(tmp_path, rows), convention="cumulative")
    third = trace.requests[2]
    assert third.input_len == 1100 and third.hash_ids == (1, 4, 5) and third.session == "a"
    with pytest.raises(KvbenchError, match="needs a session_id"):
        read_prefix_trace(write_rows(tmp_path, [row()]), convention="cumulative")


def test_subsets_and_time_scaling(tmp_path):
    rows = [row(timestamp=t * 1000) for t in range(10)]
    trace = read_prefix_trace(write_rows(tmp_path, rows))
    window = trace.subset(window_s=(3, 6))
    assert [r.arrival_s for r in window.requests] == [0.0, 1.0, 2.0]
    assert len(trace.subset(max_requests=4).requests) == 4
    assert trace.scaled(0.5).requests[-1].arrival_s == 4.5
    with pytest.raises(KvbenchError, match="no request is left"):
        trace.subset(window_s=(100, 200))
    with pytest.raises(KvbenchError, match="time scale must be a number above 0"):
        trace.scaled(0.0)


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**48 - 1), st.integers(0, 2**48 - 1))
def test_distinct_hash_ids_never_give_the_same_block(first, second):
    a, b = block_token_ids(first, 16, 32_000), block_token_ids(second, 16, 32_000)
    assert (a == b) == (first == second)
    assert all(16 <= token < 32_000 for token in a)


def test_token_synthesis_is_deterministic_and_cut_at_the_prompt(tmp_path):
    trace = read_prefix_trace(write_rows(tmp_path, [row(input_length=700, hash_ids=(9, 3))]))
    tokens = prompt_token_ids(trace.requests[0], 512, 49_152)
    assert len(tokens) == 700
    assert tokens == prompt_token_ids(trace.requests[0], 512, 49_152)
    assert tokens[512:] == block_token_ids(3, 512, 49_152)[:188]
    with pytest.raises(KvbenchError, match="cannot spell a hash id"):
        block_token_ids(1, 2, 100)


def test_token_prompts_become_chained_hash_ids():
    shared = list(range(100, 132))
    prompts = [
        (0.0, shared + [1] * 16, 4, None),
        (1.0, shared + [2] * 16, 4, None),
        (2.0, [5] * 16 + shared[16:], 4, None),  # the same second block after another first one: a new id
    ]
    trace = trace_from_prompts(prompts, 16, "test")
    first, second, third = (r.hash_ids for r in trace.requests)
    assert first[:2] == second[:2] and first[2] != second[2]
    assert third[1] != first[1]


def test_a_synthetic_workload_past_what_is_spelled_out_is_refused_at_once():
    """A million sessions of a thousand turns resending million-token prefixes: refused before any list is built."""
    with pytest.raises(KvbenchError, match="is more than kvbench synthesises"):
        shared_prefix_trace(5, 1_000_000, 1_000_000, 16, 8, 10.0, 0, 16, turns=1000)


def test_shared_prefix_groups_share_their_prefix_blocks():
    assert len(shared_prefix_trace(3, 10, 64, 16, 8, 10.0, 0, 16).requests) == 10  # exactly as many as asked
    trace = shared_prefix_trace(3, 12, 64, 16, 8, 10.0, 0, 16)
    assert len(trace.requests) == 12
    heads = {r.hash_ids[:4] for r in trace.requests}
    assert len(heads) == 3
    assert all(a.arrival_s <= b.arrival_s for a, b in zip(trace.requests, trace.requests[1:], strict=False))


def test_sessions_resend_their_history():
    sessions = [[([1] * 16, [2] * 16), ([3] * 16, [4] * 8)], [([1] * 16, [5] * 16)]]
    trace = session_trace(sessions, rate=1.0, think_s=30.0, seed=0, block_size=16, source="test")
    first, second = (r for r in trace.requests if r.session == "session-0")
    # turn 2 is turn 1's prompt and answer, then its own message: 48 tokens, its first two blocks turn 1's
    assert second.input_len == 48 and second.hash_ids[0] == first.hash_ids[0]
    assert second.arrival_s - first.arrival_s == 30.0 and second.output_len == 8
    other = next(r for r in trace.requests if r.session == "session-1")
    assert other.hash_ids[0] == first.hash_ids[0]  # the same first message


def test_sharegpt_conversations_become_sessions(tmp_path):
    path = tmp_path / "sharegpt.json"
    conversations = [
        {
            "conversations": [
                {"from": "system", "value": "You are terse."},
                {"from": "human", "value": "Name a prime."},
                {"from": "gpt", "value": "Seven."},
                {"from": "human", "value": "Another?"},
                {"from": "gpt", "value": "Eleven."},
            ]
        },
        {"messages": [{"role": "user", "content": "Hello"}]},
        {"conversations": "broken"},
    ]
    path.write_text(json.dumps(conversations))
    sessions = sharegpt_sessions(path)
    assert len(sessions) == 2 and len(sessions[0]) == 2 and sessions[1][0][1] == []
    system_and_question, answer = sessions[0][0]
    assert len(system_and_question) == 8 and len(answer) == 2  # words and punctuation are tokens
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"not": "a list"}))
    with pytest.raises(KvbenchError, match="a ShareGPT file is a JSON list"):
        sharegpt_sessions(bad)
