"""Datasets in `kvbench dataset`, `waste` and `share`: lengths, estimates, EOS-decided lengths, bad input."""

from __future__ import annotations

import json

import pytest

from kvbench.cli import main


def _json(capsys) -> dict:
    return json.loads(capsys.readouterr().out)


def test_dataset_command_describes_lengths_and_waste(tmp_path, capsys):
    out = tmp_path / "d"
    assert main(["dataset", "real-chat", "--max-len", "1024", "--block-size", "8,16", "--out", str(out), "--json"]) == 0
    document = _json(capsys)
    assert document["kind"] == "dataset" and document["meta"]["dataset"]["records"] == 52
    lengths = document["lengths"]
    assert lengths["total"]["count"] == lengths["output"]["count"] > 40
    assert lengths["total"]["mean"] == pytest.approx(lengths["prompt"]["mean"] + lengths["output"]["mean"])
    assert sum(document["histograms"]["output"]["counts"]) == lengths["output"]["count"]
    waste = {p["engine"]: p["waste_pct"] for p in document["points"]}
    assert waste["contiguous-max"] > waste["contiguous-pow2"] > waste["paged-16"] > waste["paged-8"] > 0
    mean = lengths["total"]["mean"]
    assert waste["contiguous-max"] == pytest.approx(100 * (1024 - mean) / 1024)  # the article's formula
    assert document["analytic"]["at_mean_len_pct"] == pytest.approx(waste["contiguous-max"])
    for name in ("summary.json", "summary.csv", "summary.md", "lengths.png"):
        assert (out / name).is_file()


def test_dataset_command_prints_tables(tmp_path, capsys):
    assert main(["dataset", "real-chat", "--requests", "20", "--out", str(tmp_path / "d")]) == 0
    printed = capsys.readouterr().out
    assert "20 requests from" in printed and "Analytic waste" in printed and "█" in printed


def test_dataset_command_with_a_real_tokenizer(tiny_gguf, tmp_path, capsys):
    path, _ = tiny_gguf
    assert main(["dataset", "real-chat", "--model", str(path), "--out", str(tmp_path / "d"), "--json"]) == 0
    assert "chat template" in _json(capsys)["meta"]["dataset"]["counted_by"]


@pytest.mark.parametrize(
    "content, message",
    [
        ("nope", "is not JSON"),
        ("[]", "holds no records"),
        (
            '[{"conversations": [{"from": "human", "value": "'
            + "w " * 300
            + '"}, {"from": "gpt", "value": "a b c d"}]}]',
            "no record is left after filtering",
        ),
    ],
)
def test_dataset_command_bad_input(tmp_path, capsys, content, message):
    path = tmp_path / "d.json"
    path.write_text(content)
    assert main(["dataset", str(path), "--max-len", "128", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_waste_with_a_dataset_and_eos_makes_the_oracle_a_hindsight_bound(tmp_path, capsys):
    assert (
        main(
            [
                "waste",
                "--dataset",
                "real-chat",
                "--stop",
                "eos",
                "--max-len",
                "1024",
                "--concurrency",
                "16",
                "--out",
                str(tmp_path / "w"),
                "--json",
            ]
        )
        == 0
    )
    document = _json(capsys)
    assert document["meta"]["stop"] == "eos" and document["meta"]["requests"] > 40
    points = {p["engine"]: p for p in document["points"]}
    assert points["contiguous-oracle"]["hindsight_bound"] is True
    assert "hindsight_bound" not in points["contiguous-max"]
    # answers end far below max-len while slabs plan for it: most of a slab is never written
    assert points["contiguous-max"]["waste"]["internal_pct"] > 3 * points["contiguous-max"]["waste"]["token_state_pct"]
    assert points["contiguous-oracle"]["waste"]["internal_pct"] == 0
    assert points["paged-16"]["waste"]["internal_pct"] < points["paged-16"]["waste"]["token_state_pct"]
    # with EOS the power-of-two slab cannot know the length either: it reserves as much as max
    assert points["contiguous-pow2"]["kv_peak_allocated_bytes"] == points["contiguous-max"]["kv_peak_allocated_bytes"]


def test_waste_length_mode_with_a_dataset_keeps_the_knowing_policies(tmp_path, capsys):
    assert (
        main(
            [
                "waste",
                "--dataset",
                "real-chat",
                "--max-len",
                "1024",
                "--concurrency",
                "16",
                "--out",
                str(tmp_path / "w"),
                "--json",
            ]
        )
        == 0
    )
    points = {p["engine"]: p for p in _json(capsys)["points"]}
    assert points["contiguous-pow2"]["kv_peak_allocated_bytes"] < points["contiguous-max"]["kv_peak_allocated_bytes"]
    assert "hindsight_bound" not in points["contiguous-oracle"]


def test_waste_dataset_and_trace_exclude_each_other(tmp_path, capsys):
    trace = tmp_path / "t.csv"
    trace.write_text("prompt_len,output_len\n4,4\n")
    assert main(["waste", "--dataset", "real-chat", "--trace", str(trace)]) == 2
    assert "choose one" in capsys.readouterr().err


def test_share_prompts_from_a_dataset(tmp_path, capsys):
    assert (
        main(
            [
                "share",
                "--n",
                "2",
                "--dataset",
                "real-chat",
                "--requests",
                "3",
                "--output-len",
                "6",
                "--block-size",
                "4",
                "--num-blocks",
                "512",
                "--device",
                "cpu",
                "--out",
                str(tmp_path / "s"),
                "--json",
            ]
        )
        == 0
    )
    meta = _json(capsys)["meta"]
    assert meta["dataset"]["requests"] == 3 and meta["stop"] == "length"


def test_share_stops_at_eos_on_a_real_model(tiny_gguf, tmp_path, capsys):
    path, _ = tiny_gguf
    assert (
        main(
            [
                "share",
                "--n",
                "3",
                "--dataset",
                "real-chat",
                "--requests",
                "2",
                "--output-len",
                "24",
                "--block-size",
                "4",
                "--num-blocks",
                "1024",
                "--model",
                str(path),
                "--device",
                "cpu",
                "--max-len",
                "512",
                "--out",
                str(tmp_path / "s"),
                "--json",
            ]
        )
        == 0
    )
    document = _json(capsys)
    assert document["meta"]["stop"] == "eos" and document["meta"]["outputs_identical_with_and_without_sharing"]
    assert (
        main(["share", "--beam", "2", "--stop", "eos", "--model", str(path), "--device", "cpu", "--max-len", "512"])
        == 2
    )
    assert "beam search runs every beam" in capsys.readouterr().err
