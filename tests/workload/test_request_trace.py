"""--trace means one thing to every command: a lengths file or a hash-id trace (Mooncake's format, its timestamps
in milliseconds), read for its lengths and arrival times in seconds."""

from __future__ import annotations

import json

import pytest

from kvbench.cli import main
from kvbench.errors import KvbenchError
from kvbench.workload.request_trace import trace_lengths


def test_a_hash_id_trace_gives_its_lengths_and_its_millisecond_timestamps_as_seconds(tmp_path):
    trace = tmp_path / "mooncake.jsonl"
    rows = [
        {"timestamp": 2000, "input_length": 700, "output_length": 12, "hash_ids": [1, 2]},
        {"timestamp": 3500, "input_length": 1100, "output_length": 0, "hash_ids": [1, 2, 3]},
    ]
    trace.write_text("".join(json.dumps(row) + "\n" for row in rows))
    lengths, arrivals = trace_lengths(trace)
    assert lengths == [(700, 12), (1100, 1)]  # a prefill-only request generates one token here
    assert arrivals == [0.0, 1.5]  # seconds from the first, not 1,500 seconds


def test_the_shipped_trace_is_read_by_name():
    lengths, arrivals = trace_lengths("mooncake-conversation-1k")
    assert len(lengths) == len(arrivals) == 1000
    assert arrivals[0] == 0.0 and arrivals[-1] == pytest.approx(330.0)  # its last timestamp is 330,000 ms


def test_a_lengths_file_keeps_its_arrival_times_in_seconds(tmp_path):
    trace = tmp_path / "lengths.jsonl"
    trace.write_text(
        "".join(json.dumps({"prompt_len": p, "output_len": 5, "arrival_time": t}) + "\n" for p, t in ((9, 4), (7, 6)))
    )
    assert trace_lengths(trace) == ([(9, 5), (7, 5)], [0.0, 2.0])
    csv = tmp_path / "lengths.csv"
    csv.write_text("prompt_len,output_len\n9,5\n")
    assert trace_lengths(csv) == ([(9, 5)], None)


def test_a_broken_hash_id_trace_is_refused_by_its_line(tmp_path):
    trace = tmp_path / "broken.jsonl"
    trace.write_text(json.dumps({"timestamp": 0, "input_length": 700, "output_length": 3, "hash_ids": [1]}) + "\n")
    with pytest.raises(KvbenchError, match="broken.jsonl:1: 1 hash ids for 700 prompt tokens"):
        trace_lengths(trace)


def test_waste_and_a_simulated_fleet_take_the_shipped_trace(tmp_path, capsys):
    assert main(["waste", "--trace", "mooncake-conversation-1k", "--json", "--out", str(tmp_path / "w")]) == 0
    assert json.loads(capsys.readouterr().out)["meta"]["workload"].startswith("trace mooncake-conversation-1k")
    args = ["fleet", "--simulate", "--trace", "mooncake-conversation-1k", "--policies", "round-robin", "--json"]
    assert main([*args, "--out", str(tmp_path / "f")]) == 0
    assert (
        json.loads(capsys.readouterr().out)["meta"]["arrivals"] == "arrival times recorded in mooncake-conversation-1k"
    )
