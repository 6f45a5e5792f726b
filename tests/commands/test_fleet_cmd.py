"""``kvbench fleet`` end to end on simulated instances, diagnose on its run, and its bad-input handling."""

from __future__ import annotations

import json
import warnings

import pytest

from kvbench.cli import main
from kvbench.results.schema import SCHEMA_VERSION

ARGS = ["fleet", "--simulate", "--instances", "3", "--rate", "30", "--requests", "300", "--tick", "0.5"]


def test_simulated_fleet_writes_every_output_and_diagnose_reads_it(tmp_path, capsys):
    out = tmp_path / "run"
    assert main([*ARGS, "--policies", "round-robin,most-free-blocks", "--out", str(out)]) == 0
    for name in (
        "summary.json",
        "summary.csv",
        "summary.md",
        "results.jsonl",
        "fleet_usage.png",
        "fleet_ttft_cdf.png",
        "fleet-round-robin.json",
        "fleet-most-free-blocks.json",
    ):
        assert (out / name).is_file(), name
    assert not (out / "fleet_instances.png").exists()  # a fixed fleet: no flat line of its size
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema_version"] == SCHEMA_VERSION and summary["kind"] == "fleet"
    assert summary["meta"]["simulated"] is True and summary["meta"]["instances"] == 3
    assert [p["policy"] for p in summary["points"]] == ["round-robin", "most-free-blocks"]
    for point in summary["points"]:
        assert point["completed"] + point["rejected"] == 300 and len(point["instances"]) == 3
        for key in (
            "p50_ttft_ms",
            "p99_ttft_ms",
            "p50_tpot_ms",
            "p99_tpot_ms",
            "output_throughput",
            "preemptions",
            "free_blocks_imbalance_mean",
            "instance_seconds",
            "prefix_hit_rate",
        ):
            assert point[key] is not None, key
    assert len((out / "results.jsonl").read_text().splitlines()) == 2
    capsys.readouterr()
    assert main(["diagnose", str(out), "--json"]) == 0
    diagnosis = json.loads(capsys.readouterr().out)
    assert diagnosis["checked"] == 2


def test_autoscaling_simulated_fleet_reports_instances_over_time(tmp_path):
    out = tmp_path / "run"
    assert (
        main(
            [
                "fleet",
                "--simulate",
                "--instances",
                "1",
                "--rate",
                "60",
                "--requests",
                "600",
                "--autoscale",
                "--scale-window",
                "1",
                "--startup-s",
                "2",
                "--max-instances",
                "3",
                "--policies",
                "least-requests",
                "--out",
                str(out),
                "--json",
            ]
        )
        == 0
    )
    point = json.loads((out / "summary.json").read_text())["points"][0]
    assert point["scale_ups"] >= 1 and point["instances_peak"] >= 2
    assert point["instance_seconds"] < point["instances_peak"] * point["elapsed_s"]
    assert (out / "fleet_instances.png").is_file()  # it scaled: the instances over time are drawn


def test_fleet_runs_the_shipped_dataset_sample_and_says_so(tmp_path, capsys):
    out = tmp_path / "run"
    assert (
        main(
            [
                "fleet",
                "--simulate",
                "--scenario",
                "ci-smoke",
                "--dataset",
                "real-chat",
                "--rate",
                "5",
                "--requests",
                "10",
                "--policies",
                "round-robin",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "dataset: 10 requests from" in capsys.readouterr().out
    meta = json.loads((out / "summary.json").read_text())["meta"]
    assert meta["dataset"]["path"].endswith("real-chat.json") and meta["dataset"]["requests"] == 10
    assert meta["arrivals"].startswith("Poisson at 5 req/s")


def test_fleet_reads_a_jsonl_dataset_and_honours_a_scenarios_dataset(tmp_path):
    data = tmp_path / "prompts.jsonl"
    data.write_text(
        "".join(
            json.dumps({"prompt": f"question number {i} about the cache", "output_len": 8 + i}) + "\n" for i in range(6)
        )
    )
    assert (
        main(
            [
                "fleet",
                "--simulate",
                "--dataset",
                str(data),
                "--rate",
                "5",
                "--policies",
                "random",
                "--out",
                str(tmp_path / "a"),
                "--json",
            ]
        )
        == 0
    )
    meta = json.loads((tmp_path / "a" / "summary.json").read_text())["meta"]
    assert meta["dataset"]["format"] == "jsonl" and meta["dataset"]["records"] == 6
    assert (
        main(
            [
                "fleet",
                "--simulate",
                "--scenario",
                "real-chat",
                "--rate",
                "5",
                "--policies",
                "random",
                "--out",
                str(tmp_path / "b"),
                "--json",
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["meta"]["dataset"]["records"] == 52


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--rate", "0"], "--rate must be a positive number"),
        (["--rate", "-2"], "--rate must be a positive number"),
        (["--rate", "fast"], "Invalid value for '--rate'"),
        (["--rate", "5", "--instances", "-1"], "--instances"),
        (["--rate", "5", "--policies", "round-robin,fastest"], "unknown policy 'fastest'"),
        (
            ["--rate", "5", "--autoscale", "--min-instances", "4", "--max-instances", "2"],
            "--min-instances (4) is above --max-instances (2)",
        ),
        (
            ["--rate", "5", "--scale-up", "0.3", "--scale-down", "0.5"],
            "--scale-down (0.5) must be below --scale-up (0.3)",
        ),
        (["--rate", "5", "--scale-up", "1.5"], "--scale-up must be in (0, 1]"),
        (["--rate", "5", "--ray-address", "127.0.0.1:1"], "cannot reach the Ray cluster at 127.0.0.1:1"),
        (["--rate", "5", "--ray-address", "no-port"], "is not HOST:PORT"),
        (["--rate", "5", "--prefix-groups", "3"], "--prefix-groups and --prefix-len go together"),
        (["--rate", "5", "--dataset", "no-such-file.json"], "dataset not found: no-such-file.json"),
        (
            ["--rate", "5", "--dataset", "real-chat", "--prefix-groups", "2", "--prefix-len", "8"],
            "brings its own prompts",
        ),
    ],
)
def test_bad_input_is_a_one_line_error_with_exit_2(tmp_path, capsys, args, message):
    simulate = [] if "--ray-address" in args else ["--simulate"]
    assert main(["fleet", *simulate, *args, "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err


@pytest.mark.parametrize("option", [["--ray-address", "127.0.0.1:6379"], ["--ray-cpus", "2"]])
def test_ray_options_of_a_simulated_fleet_need_ray(tmp_path, capsys, option):
    out = tmp_path / "x"
    assert main(["fleet", "--simulate", "--rate", "5", *option, "--out", str(out)]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert (
        captured.out == ""
        and len(err) == 1
        and err[0] == f"error: {option[0]} goes with --ray: without it a simulated fleet runs in this process"
    )
    assert not out.exists()


def test_an_unreachable_ray_address_is_refused_before_any_output_or_run_directory(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["fleet", "--rate", "5", "--ray-address", "127.0.0.1:1", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("error: cannot reach the Ray cluster at 127.0.0.1:1")
    assert len(captured.err.strip().splitlines()) == 1
    assert not out.exists()


def test_a_ray_address_where_an_http_server_listens_is_refused_at_once(tmp_path, capsys):
    """Ray's ray.init waits for ever on such a port; the address is probed first, within seconds."""
    import http.server
    import threading
    import time

    class Quiet(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out, start = tmp_path / "run", time.monotonic()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        assert main(["fleet", "--rate", "5", "--ray-address", address, "--out", str(out)]) == 2
    finally:
        server.shutdown()
        server.server_close()
    captured = capsys.readouterr()
    err = captured.err.strip().splitlines()
    assert captured.out == "" and len(err) == 1, err
    assert err[0].startswith(f"error: {address} does not answer as a Ray cluster (Ray speaks gRPC; it answered "), err
    assert time.monotonic() - start < 10 and not out.exists()


def test_a_run_that_fails_before_any_policy_leaves_no_directory_or_lock(tmp_path, capsys, monkeypatch):
    from kvbench.errors import KvbenchError
    from kvbench.studies.fleet import study

    def fail(*_args, **_kwargs):
        raise KvbenchError("cannot start or join a local Ray cluster: no room")

    monkeypatch.setattr(study, "run_fleet", fail)
    assert main([*ARGS, "--out", str(tmp_path / "new")]) == 2
    assert not (tmp_path / "new").exists()
    kept = tmp_path / "kept"
    (kept / "notes.txt").parent.mkdir()
    (kept / "notes.txt").write_text("mine")
    assert main([*ARGS, "--out", str(kept)]) == 2
    assert sorted(p.name for p in kept.iterdir()) == ["notes.txt"]  # the user's folder, without a stale lock
    assert capsys.readouterr().err.count("error: cannot start or join") == 2


def test_ctrl_c_keeps_the_finished_policies_summary_and_exits_130(tmp_path, capsys, monkeypatch):
    from kvbench.studies.fleet import study

    real = study.simulate_policy

    def interrupted_second(setup, name):
        if name == "random":
            raise KeyboardInterrupt
        return real(setup, name)

    monkeypatch.setattr(study, "simulate_policy", interrupted_second)
    out = tmp_path / "run"
    assert main([*ARGS, "--policies", "round-robin,random,least-requests", "--out", str(out)]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"interrupted: 1 of 3 policies finished; their summary is in {out}/summary.json"]
    summary = json.loads((out / "summary.json").read_text())
    assert [p["policy"] for p in summary["points"]] == ["round-robin"] and summary["meta"]["interrupted"] is True
    assert len((out / "results.jsonl").read_text().splitlines()) == 1
    assert (out / "summary.md").is_file() and (out / "fleet_usage.png").is_file()


def test_ctrl_c_before_any_policy_writes_nothing(tmp_path, capsys, monkeypatch):
    from kvbench.studies.fleet import study

    def interrupted(setup, name):
        raise KeyboardInterrupt

    monkeypatch.setattr(study, "simulate_policy", interrupted)
    out = tmp_path / "run"
    assert main([*ARGS, "--out", str(out)]) == 130
    assert capsys.readouterr().err.strip() == "interrupted before any policy finished; nothing was written"
    assert not out.exists()


def test_a_fleet_of_identical_requests_plots_without_runtime_warnings(tmp_path):
    """Equal requests have TTFTs a rounding error apart: the CDF's log axis must still get a real range."""
    requests = tmp_path / "requests.jsonl"
    requests.write_text(
        "".join(json.dumps({"prompt_token_ids": [1, 2, 3, 4, 5], "output_len": 4}) + "\n" for _ in range(3))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        assert (
            main(
                [
                    "fleet",
                    "--simulate",
                    "--scenario",
                    "ci-smoke",
                    "--requests-file",
                    str(requests),
                    "--rate",
                    "5",
                    "--policies",
                    "round-robin",
                    "--out",
                    str(tmp_path / "run"),
                    "--json",
                ]
            )
            == 0
        )
    assert (tmp_path / "run" / "fleet_ttft_cdf.png").is_file()
