"""kvbench share end to end (small) and its bad input."""

from __future__ import annotations

import json

from kvbench.cli import main


def test_share_parallel_sampling_writes_results(tmp_path, capsys):
    out = tmp_path / "share"
    args = [
        "share",
        "--n",
        "3",
        "--requests",
        "2",
        "--prompt-len",
        "12",
        "--output-len",
        "6",
        "--block-size",
        "4",
        "--num-blocks",
        "256",
        "--device",
        "cpu",
        "--out",
        str(out),
        "--json",
    ]
    assert main(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["kind"] == "share" and document["meta"]["outputs_identical_with_and_without_sharing"] is True
    assert 0 < document["savings"]["saved_by_sharing_pct_mean"] < 100
    assert {p["engine"] for p in document["points"]} == {"paged-shared", "paged-unshared", "contiguous"}
    png = (out / "share.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_share_beam_table(tmp_path, capsys):
    args = [
        "share",
        "--beam",
        "2",
        "--requests",
        "1",
        "--prompt-len",
        "10",
        "--output-len",
        "5",
        "--block-size",
        "4",
        "--num-blocks",
        "128",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "b"),
    ]
    assert main(args) == 0
    assert "memory saved by sharing" in capsys.readouterr().out


def test_share_needs_exactly_one_mode(capsys):
    assert main(["share"]) == 2
    assert main(["share", "--n", "2", "--beam", "2"]) == 2
    assert main(["share", "--n", "0"]) == 2
    err = capsys.readouterr().err
    assert "exactly one of --n" in err and "greater than or equal to 1" in err


def test_share_budget_too_small_is_one_line(capsys):
    assert main(["share", "--n", "2", "--num-blocks", "2", "--device", "cpu", "--out", "/tmp/kvbench-share-x"]) == 2
    assert main(["share", "--beam", "2", "--num-blocks", "2", "--device", "cpu", "--out", "/tmp/kvbench-share-y"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2 and all(line.startswith("error: ") for line in err)


def test_share_summary_points_have_unique_keys(tmp_path):
    from kvbench.results.summary_load import load_summary

    args = [
        "share",
        "--beam",
        "2",
        "--requests",
        "1",
        "--prompt-len",
        "8",
        "--output-len",
        "4",
        "--block-size",
        "4",
        "--num-blocks",
        "64",
        "--device",
        "cpu",
        "--out",
        str(tmp_path / "b"),
    ]
    assert main(args) == 0
    load_summary(tmp_path / "b")  # refuses duplicate (engine, concurrency, scenario) keys
    assert main(["compare", str(tmp_path / "b"), str(tmp_path / "b")]) == 0


def test_width_one_is_its_own_baseline_and_every_reader_accepts_it(tmp_path):
    for flag in ("--n", "--beam"):
        out = tmp_path / flag.strip("-")
        args = [
            "share",
            flag,
            "1",
            "--requests",
            "1",
            "--prompt-len",
            "8",
            "--output-len",
            "4",
            "--block-size",
            "4",
            "--num-blocks",
            "64",
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
        assert main(args) == 0
        points = json.loads((out / "summary.json").read_text())["points"]
        assert len({(p["engine"], p["concurrency"]) for p in points}) == len(points) == 3
        assert main(["compare", str(out), str(out)]) == 0
        assert main(["diagnose", str(out)]) == 0


def test_a_width_the_pool_cannot_hold_fails_before_any_work(capsys):
    assert main(["share", "--n", "100000", "--device", "cpu", "--out", "/tmp/kvbench-share-n"]) == 2
    err = capsys.readouterr().err.strip()
    assert "100,000 is above kvbench's limit" in err and len(err.splitlines()) == 1
    assert main(["share", "--n", "600", "--device", "cpu", "--out", "/tmp/kvbench-share-n"]) == 2
    err = capsys.readouterr().err.strip()
    assert "without sharing" in err and "more blocks" in err and len(err.splitlines()) == 1


def test_requests_longer_than_max_len_are_refused_before_the_model_loads(capsys, monkeypatch):
    import kvbench.studies.local_model as setup

    def no_load(*args, **kwargs):
        raise AssertionError("the model loaded before the lengths were checked")

    monkeypatch.setattr(setup, "load_model", no_load)
    for flag in ("--n", "--beam"):  # beam search has no scheduler that would refuse the request later
        args = [
            "share",
            flag,
            "2",
            "--requests",
            "1",
            "--prompt-len",
            "5000",
            "--output-len",
            "4",
            "--num-blocks",
            "100000",
            "--device",
            "cpu",
            "--out",
            "/tmp/kvbench-share-long",
        ]
        assert main(args) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "above max-len 2,048" in err and "context is 4,096" in err, err
