"""Sweeps on real workloads: datasets of prompts, output lengths decided by EOS, steady-state figures, and the
bad inputs of all of these (one line, exit 2)."""

from __future__ import annotations

import json

import pytest

from kvbench.cli import main
from kvbench.workload.scenario import load_scenario


def _summary(out) -> dict:
    return json.loads((out / "summary.json").read_text())


def _sharegpt(path, pairs) -> str:
    items = [{"conversations": [{"from": "human", "value": p}, {"from": "gpt", "value": a}]} for p, a in pairs]
    path.write_text(json.dumps(items))
    return str(path)


PAIRS = [
    ("tell me about the sea and the sky", "the sea is deep and the sky is wide and blue today"),
    ("what is two plus two", "four, of course, as everyone knows well"),
    ("name three colours please now", "red green blue"),
    ("write a long story about a cat who travels the world", "once upon a time " * 8),
]


def test_simulated_dataset_with_eos_reserves_for_max_tokens_and_stops_at_the_answer(tmp_path, scenario, capsys):
    data = _sharegpt(tmp_path / "d.json", PAIRS)
    out = tmp_path / "run"
    assert (
        main(
            [
                "sweep",
                "--simulate",
                "--scenario",
                scenario,
                "--dataset",
                data,
                "--stop",
                "eos",
                "--requests",
                "8",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    printed = " ".join(capsys.readouterr().out.split())
    assert "Output lengths ending at EOS" in printed and "dataset: 8 requests from 3 of the 4 records" in printed
    summary = _summary(out)
    meta = summary["meta"]
    assert meta["stop"] == "eos" and meta["dataset"]["format"] == "sharegpt" and meta["dataset"]["requests"] == 8
    for point in summary["points"]:
        assert point["stopped_at_eos"] == point["completed"] == 8
        assert point["output_len_max"] <= 48 and point["output_len_hist"]["counts"]
    contiguous = [p for p in summary["points"] if p["engine"] == "contiguous"]
    for point in contiguous:  # slabs of max-len for answers far shorter: most of what they hold is never written
        assert point["waste"]["internal_pct"] > point["waste"]["token_state_pct"]
        assert 0 < point["kv_hindsight_oracle_peak_bytes"] < point["kv_peak_allocated_bytes"]
    assert (out / "output_lengths.png").is_file()


def test_length_mode_replays_the_reference_answers(tmp_path, scenario):
    data = _sharegpt(tmp_path / "d.json", PAIRS)
    out = tmp_path / "run"
    assert main(["sweep", "--simulate", "--scenario", scenario, "--dataset", data, "--out", str(out)]) == 0
    summary = _summary(out)
    assert summary["meta"]["stop"] == "length"  # the default without a real model
    for point in summary["points"]:
        assert point["stopped_at_eos"] == 0 and point["output_len_max"] == 32  # "once upon a time " x 8


def test_tiny_model_runs_a_dataset_by_word_counts(tmp_path, scenario):
    data = _sharegpt(tmp_path / "d.json", PAIRS)
    out = tmp_path / "run"
    assert (
        main(
            [
                "sweep",
                "--device",
                "cpu",
                "--scenario",
                scenario,
                "--dataset",
                data,
                "--concurrency",
                "2",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    meta = _summary(out)["meta"]
    assert meta["stop"] == "length" and "words and punctuation" in meta["dataset"]["counted_by"]


def test_real_model_stops_at_eos_by_default(tmp_path, scenario, tiny_gguf):
    path, _ = tiny_gguf
    data = _sharegpt(tmp_path / "d.json", PAIRS)
    out = tmp_path / "run"
    assert (
        main(
            [
                "sweep",
                "--device",
                "cpu",
                "--model",
                str(path),
                "--scenario",
                scenario,
                "--dataset",
                data,
                "--concurrency",
                "2",
                "--requests",
                "4",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    summary = _summary(out)
    assert summary["meta"]["stop"] == "eos" and "chat template" in summary["meta"]["dataset"]["counted_by"]
    for point in summary["points"]:
        assert point["completed"] == 4 and point["status"] == "ok"


def test_the_real_chat_scenario_ships_its_dataset(tmp_path):
    spec = load_scenario("real-chat")
    assert spec.dataset_path().is_file()
    out = tmp_path / "run"
    assert main(["sweep", "--simulate", "--scenario", "real-chat", "--stop", "eos", "--out", str(out)]) == 0
    meta = _summary(out)["meta"]
    assert meta["scenario"] == "real-chat" and meta["dataset"]["path"].endswith("real-chat.json")


def test_request_counts_follow_the_concurrency(tmp_path, scenario_text):
    path = tmp_path / "s.toml"
    path.write_text(scenario_text.replace("requests = 6", "requests = 6\nwaves = 3"))
    out = tmp_path / "run"
    assert main(["sweep", "--simulate", "--scenario", str(path), "--out", str(out)]) == 0
    summary = _summary(out)
    assert summary["meta"]["requests_per_point"] == {"2": 6, "4": 12}
    assert {(p["concurrency"], p["completed"]) for p in summary["points"]} == {(2, 6), (4, 12)}
    assert all(p["steady_window_pct"] > 0 and p["steady_output_throughput"] > 0 for p in summary["points"])


@pytest.mark.parametrize(
    "concurrency, requests, said",
    [
        ("4", "3", "concurrency 4 is more than the 3 requests of its point: at most 3 can be in flight"),
        ("2,99999999999999999999999", "4", "concurrency 99,999,999,999,999,999,999,999 is above kvbench's limit"),
    ],
)
def test_a_concurrency_its_point_cannot_hold_is_refused_not_recorded(
    tmp_path, scenario, capsys, concurrency, requests, said
):
    """Fewer requests than the concurrency never put C in flight: such a point would record a C it never ran."""
    out = tmp_path / "run"
    assert (
        main(
            [
                "sweep",
                "--simulate",
                "--scenario",
                scenario,
                "--requests",
                requests,
                "--concurrency",
                concurrency,
                "--out",
                str(out),
            ]
        )
        == 2
    )
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith(f"error: {said}") and captured.err.count("\n") == 1
    assert not out.exists()


def test_a_requests_file_shorter_than_a_concurrency_is_refused(tmp_path, scenario, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps({"prompt_token_ids": [1, 2, 3], "output_len": 4}) + "\n" for _ in range(3)))
    assert (
        main(
            [
                "sweep",
                "--simulate",
                "--scenario",
                scenario,
                "--requests-file",
                str(path),
                "--concurrency",
                "2,4",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 2
    )
    assert "concurrency 4 is more than the 3 requests of its point" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, message",
    [
        (["--dataset", "missing.json"], "dataset not found: missing.json"),
        (["--stop", "sometimes"], "unknown --stop 'sometimes'"),
        (["--stop", "eos", "--reserve", "oracle"], "the oracle reservation needs each answer's real length"),
        (["--stop", "eos", "--device", "cpu"], "stopping at EOS needs a model that has an EOS token"),
    ],
)
def test_bad_workload_options_are_one_line(tmp_path, scenario, capsys, args, message):
    simulate = [] if "--device" in args else ["--simulate"]
    assert main(["sweep", *simulate, "--scenario", scenario, "--out", str(tmp_path / "r"), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


@pytest.mark.parametrize(
    "content, message",
    [
        ("plain text, not json", "is not JSON"),
        (json.dumps([{"conversations": [{"from": "gpt", "value": "hello"}]}]), "no human turn"),
        (
            json.dumps([{"conversations": [{"from": "human", "value": "a"}, {"from": "gpt", "value": "b"}]}]),
            "no record is left after filtering",
        ),
        (
            json.dumps(
                [{"conversations": [{"from": "human", "value": "word " * 100}, {"from": "gpt", "value": "x y z w"}]}]
            ),
            "longer than max-len 64",
        ),
    ],
)
def test_bad_datasets_are_one_line(tmp_path, scenario, capsys, content, message):
    path = tmp_path / "d.json"
    path.write_text(content)
    assert (
        main(["sweep", "--simulate", "--scenario", scenario, "--dataset", str(path), "--out", str(tmp_path / "r")]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err


def test_dataset_and_requests_file_exclude_each_other(tmp_path, scenario, capsys):
    from kvbench.workload.requests_file import write_requests_jsonl

    requests = write_requests_jsonl(tmp_path / "r.jsonl", [([1, 2, 3], 4)])
    data = _sharegpt(tmp_path / "d.json", PAIRS)
    assert (
        main(
            [
                "sweep",
                "--simulate",
                "--scenario",
                scenario,
                "--dataset",
                data,
                "--requests-file",
                str(requests),
                "--out",
                str(tmp_path / "r"),
            ]
        )
        == 2
    )
    assert "choose one" in capsys.readouterr().err


def test_a_requests_file_is_replayed_whole_whatever_the_scenario_count(tmp_path, scenario):
    from kvbench.workload.requests_file import write_requests_jsonl

    requests = write_requests_jsonl(tmp_path / "r.jsonl", [([1, 2, 3], 4)] * 9)  # the scenario asks for 6
    out = tmp_path / "run"
    assert (
        main(["sweep", "--simulate", "--scenario", scenario, "--requests-file", str(requests), "--out", str(out)]) == 0
    )
    assert all(p["completed"] == 9 for p in _summary(out)["points"])
