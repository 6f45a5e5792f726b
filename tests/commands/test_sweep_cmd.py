"""End-to-end sweeps on the tiny model (few short requests) and the sweep's bad-input handling."""

from __future__ import annotations

import json
import math

import pytest

from kvbench.cli import main
from kvbench.results.schema import LATENCY_FIELDS, MEMORY_FIELDS, POINT_FIELDS, SCHEMA_VERSION, WASTE_FIELDS
from kvbench.studies.backends.simulated import SimulatedBackend
from kvbench.studies.backends.tensor import TensorBackend


def run(args: list[str]) -> int:
    return main(["sweep", "--device", "cpu", *args])


def test_sweep_writes_every_output_and_the_schema(scenario, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["--scenario", scenario, "--out", str(out), "--verbose"]) == 0
    printed = capsys.readouterr().out
    assert "E2EL" in printed and "At equal batch" in printed  # the wide per-point table, the finding in words
    for name in (
        "summary.json",
        "summary.csv",
        "summary.md",
        "results.jsonl",
        "throughput.png",
        "latency.png",
        "memory.png",
        "blocks_over_time.png",
    ):
        assert (out / name).is_file(), name
    for png in out.glob("*.png"):
        data = png.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    summary = json.loads((out / "summary.json").read_text())
    assert summary["schema_version"] == SCHEMA_VERSION and summary["kind"] == "sweep"
    assert summary["meta"]["model_name"] == "tiny" and summary["meta"]["simulated"] is False
    assert len(summary["points"]) == 4
    for point in summary["points"]:
        for name in POINT_FIELDS:
            assert name in point, name
        assert set(WASTE_FIELDS) <= set(point["waste"]) and set(MEMORY_FIELDS) <= set(point["memory"])
        assert point["status"] == "ok" and point["completed"] == 6
        assert point["memory"]["rss_peak_bytes"] > 0 and point["memory"]["nvml_used_peak_bytes"] is None
        assert all(point[f] is not None for f in LATENCY_FIELDS)
        assert abs(sum(point["waste"].values()) - 100) < 1e-6
    by_key = {(p["engine"], p["concurrency"]): p for p in summary["points"]}
    for row in summary["article_table"]:
        paged, contiguous = by_key[("paged", row["concurrency"])], by_key[("contiguous", row["concurrency"])]
        assert row["paged_over_contiguous_tps"] == pytest.approx(
            paged["output_throughput"] / contiguous["output_throughput"]
        )
        assert row["gain_pct"] == pytest.approx(100 * (row["paged_over_contiguous_tps"] - 1))
        expected = 100 * (1 - paged["kv_peak_allocated_bytes"] / contiguous["kv_peak_allocated_bytes"])
        assert row["kv_memory_reduction_pct"] == pytest.approx(expected)
        assert row["kv_memory_reduction_pct"] > 0  # max-len slabs hold far more than paged blocks
    lines = (out / "results.jsonl").read_text().splitlines()
    assert len(lines) == 4
    headline, equal, *_ = summary["findings"]  # the verdict the console and the page show: headline first
    assert headline.startswith("Paging served the same requests with") and equal.startswith("At equal batch")
    for point in summary["points"]:  # each engine ran beside the other, on its own clock and CPU time
        assert point["interleaved_with"] == [{"paged": "contiguous", "contiguous": "paged"}[point["engine"]]]
        assert 0 < point["cpu_time_s"] and point["duration"] == point["elapsed_s"]
        assert point["total_output_tokens"] == pytest.approx(point["output_throughput"] * point["duration"])


def test_resume_skips_finished_points(scenario, tmp_path, monkeypatch):
    out = tmp_path / "run"
    assert run(["--scenario", scenario, "--out", str(out), "--concurrency", "2"]) == 0
    assert run(["--scenario", scenario, "--out", str(out), "--concurrency", "2"]) == 2  # refuses to overwrite
    calls = []
    original, together = TensorBackend.run, TensorBackend.run_together

    def counting(self, engine, requests, load, on_step):
        calls.append((engine, load.concurrency))
        return original(self, engine, requests, load, on_step)

    def counting_together(self, runs, concurrency, on_step):
        calls.extend((engine, concurrency) for engine, _ in runs)
        return together(self, runs, concurrency, on_step)

    monkeypatch.setattr(TensorBackend, "run", counting)
    monkeypatch.setattr(TensorBackend, "run_together", counting_together)
    assert run(["--scenario", scenario, "--out", str(out), "--concurrency", "2,4", "--resume"]) == 0
    assert sorted(calls) == [("contiguous", 4), ("paged", 4)]
    assert len(json.loads((out / "summary.json").read_text())["points"]) == 4


def test_a_failing_point_is_recorded_and_the_others_survive(scenario, tmp_path, monkeypatch, capsys):
    """The engines of a point run interleaved; when one fails, each runs again alone: the error is the failing
    engine's, the other's point survives."""
    original, together = TensorBackend.run, TensorBackend.run_together

    def flaky(self, engine, requests, load, on_step):
        if engine == "contiguous" and load.concurrency == 2:
            raise RuntimeError("injected failure")
        return original(self, engine, requests, load, on_step)

    def flaky_together(self, runs, concurrency, on_step):
        if concurrency == 2:
            raise RuntimeError("injected failure of the pair")
        return together(self, runs, concurrency, on_step)

    monkeypatch.setattr(TensorBackend, "run", flaky)
    monkeypatch.setattr(TensorBackend, "run_together", flaky_together)
    out = tmp_path / "run"
    assert run(["--scenario", scenario, "--out", str(out), "--continue-on-error"]) == 1  # ran on, but failed
    assert "1 of 4 points failed" in capsys.readouterr().err
    points = json.loads((out / "summary.json").read_text())["points"]
    statuses = {(p["engine"], p["concurrency"]): p["status"] for p in points}
    assert statuses == {("paged", 2): "ok", ("contiguous", 2): "error", ("paged", 4): "ok", ("contiguous", 4): "ok"}
    failed = next(p for p in points if p["status"] == "error")
    assert "injected failure" in failed["error"]

    out2 = tmp_path / "run2"
    assert run(["--scenario", scenario, "--out", str(out2)]) == 1  # without the flag: stops, keeps what it measured
    assert "injected failure" in capsys.readouterr().err
    kept = [json.loads(line) for line in (out2 / "results.jsonl").read_text().splitlines()]
    assert [(p["engine"], p["status"]) for p in kept] == [("paged", "ok"), ("contiguous", "error")]


def test_reject_mode_reports_oom(tmp_path, scenario_text):
    path = tmp_path / "tight.toml"
    path.write_text(scenario_text.replace('admission = "queue"', 'admission = "reject"'))
    out = tmp_path / "run"
    assert run(["--scenario", str(path), "--out", str(out), "--concurrency", "4", "--engines", "contiguous"]) == 0
    point = json.loads((out / "summary.json").read_text())["points"][0]
    assert point["status"] == "oom" and point["rejected"] > 0  # 160 slots hold only 2 slabs of 64


@pytest.mark.parametrize(
    "engine, kv_memory, message",
    [
        ("contiguous", "64KiB", "reserves 256 token slots"),  # ci-smoke: max-len 256 of 512 B, 128 slots
        ("paged", "16KiB", "paged engine needs"),
    ],
)
def test_a_pool_that_cannot_hold_one_request_is_refused_before_any_point(engine, kv_memory, message, tmp_path, capfd):
    out = tmp_path / "run"
    assert (
        run(
            [
                "--scenario",
                "ci-smoke",
                "--engines",
                engine,
                "--kv-memory",
                kv_memory,
                "--concurrency",
                "6",
                "--out",
                str(out),
            ]
        )
        == 2
    )
    captured = capfd.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and len(err.splitlines()) == 1 and message in err, (captured.out, err)
    assert "could never run" in err and not (out / "results.jsonl").exists()
    suggested = err.split("at least ")[1].split(" of KV memory")[0]
    from kvbench.commands._options import parse_size
    from kvbench.models.resolve import resolve_model

    slots = parse_size(suggested) // resolve_model("tiny").with_dtype("fp32").bytes_per_token
    assert slots >= (256 if engine == "contiguous" else 64)  # what the message asks for is enough


def test_the_simulator_is_held_to_the_same_pre_flight(tmp_path, capfd):
    # llama-2-13b fp16: 100 MiB are 128 slots, the longest ci-smoke request fits, a max-len slab of 256 does not
    args = ["sweep", "--simulate", "--scenario", "ci-smoke", "--kv-memory", "100MiB", "--json"]
    assert main([*args, "--engines", "contiguous", "--out", str(tmp_path / "c")]) == 2
    err = capfd.readouterr().err.strip()
    assert "reserves 256 token slots" in err and len(err.splitlines()) == 1, err
    assert main([*args, "--engines", "paged", "--out", str(tmp_path / "p")]) == 0


def test_a_sweep_that_completed_no_request_fails(tmp_path, capfd, monkeypatch):
    from kvbench.studies import sweep_setup

    monkeypatch.setattr(sweep_setup, "check_pool_holds_a_request", lambda *args: None)  # as before the pre-flight
    out = tmp_path / "run"
    assert (
        run(
            [
                "--scenario",
                "ci-smoke",
                "--engines",
                "contiguous",
                "--kv-memory",
                "64KiB",
                "--concurrency",
                "6",
                "--out",
                str(out),
            ]
        )
        == 1
    )
    err = capfd.readouterr().err.strip()
    assert err.startswith("error: no point completed a single request") and len(err.splitlines()) == 1, err
    assert (out / "results.jsonl").exists()  # what it measured is kept


def test_simulated_sweep_says_so(tmp_path, capsys):
    out = tmp_path / "sim"
    assert main(["sweep", "--simulate", "--requests", "200", "--out", str(out), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["meta"]["simulated"] is True and "simulated" in summary["meta"]["device"]
    rows = {r["concurrency"]: r for r in summary["article_table"]}
    assert rows[50]["contiguous_status"] == "oom" and rows[50]["paged_status"] == "ok"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--concurrency", ""], "empty"),
        (["--concurrency", "10,abc"], "not an integer"),
        (["--concurrency", "0"], "minimum"),
        (["--engines", "paged,turbo"], "unknown engine"),
        (["--scenario", "nope"], "unknown scenario"),
        (["--repeat", "0"], "--repeat"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    assert run(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_scenario_file_with_a_wrong_field(tmp_path, capsys, scenario_text):
    path = tmp_path / "bad.toml"
    path.write_text(scenario_text + "\nbogus = 3\n")
    assert run(["--scenario", str(path)]) == 2
    assert "unknown field 'bogus'" in capsys.readouterr().err
    path.write_text(scenario_text.replace("mean_len = 16", 'mean_len = "many"'))
    assert run(["--scenario", str(path)]) == 2
    assert "mean_len" in capsys.readouterr().err


def test_a_scenario_listing_a_concurrency_twice_is_refused_like_the_option(tmp_path, capfd, scenario_text):
    path = tmp_path / "dup.toml"
    path.write_text(scenario_text.replace("concurrency = [2, 4]", "concurrency = [2, 2]"))
    out = tmp_path / "run"
    assert main(["sweep", "--simulate", "--scenario", str(path), "--out", str(out)]) == 2
    captured = capfd.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and len(err.splitlines()) == 1, (captured.out, err)
    assert str(path) in err and "concurrency lists 2 twice" in err
    assert not (out / "results.jsonl").exists()


def test_repeat_reports_mean_std_and_confidence_interval(scenario, tmp_path):
    out = tmp_path / "rep"
    assert run(["--scenario", scenario, "--out", str(out), "--concurrency", "2", "--repeat", "2"]) == 0
    points = json.loads((out / "summary.json").read_text())["points"]
    for point in points:
        samples = point["samples"]["output_throughput"]
        assert point["repeats"] == 2 and len(samples) == 2
        a, b = samples
        assert point["output_throughput"] == pytest.approx((a + b) / 2)
        # by hand for two samples: the sample std is |a - b| / sqrt(2); the 95% CI half-width is t(0.975, df=1)
        # x std / sqrt(2), with Student's t = 12.706 from the table
        std = abs(a - b) / math.sqrt(2)
        assert point["output_throughput_std"] == pytest.approx(std, rel=1e-9, abs=1e-12)
        assert point["output_throughput_ci95"] == pytest.approx(12.706 * std / math.sqrt(2), rel=1e-3, abs=1e-12)


def test_resume_refuses_other_settings_and_needs_out(scenario, tmp_path, capsys):
    out = tmp_path / "run"
    assert run(["--scenario", scenario, "--out", str(out), "--concurrency", "2", "--engines", "paged"]) == 0
    assert run(["--scenario", scenario, "--out", str(out), "--concurrency", "2", "--resume", "--requests", "3"]) == 2
    assert "requests 6 -> 3" in capsys.readouterr().err
    assert run(["--scenario", scenario, "--resume"]) == 2
    assert "--out" in capsys.readouterr().err


TINY_POOL = [
    "sweep",
    "--simulate",
    "--kv-memory",
    "1GiB",
    "--concurrency",
    "10",
    "--requests",
    "20",
    "--engines",
    "contiguous",
]


def test_a_pool_smaller_than_one_reservation_is_refused_not_a_crash(tmp_path, capfd):
    out = tmp_path / "tiny-pool"
    assert main([*TINY_POOL, "--out", str(out)]) == 2  # 1,296 slots, a max-len slab of 2,048: no request runs
    captured = capfd.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and len(err.splitlines()) == 1 and "could never run" in err, (captured.out, err)
    assert not (out / "results.jsonl").exists()


def test_a_point_that_finished_nothing_is_zero_not_nan_and_the_run_fails(tmp_path, capfd, monkeypatch):
    from kvbench.studies import sweep_setup

    monkeypatch.setattr(sweep_setup, "check_pool_holds_a_request", lambda *args: None)  # as before the pre-flight
    out = tmp_path / "tiny-pool"
    assert main([*TINY_POOL, "--out", str(out)]) == 1
    assert "no point completed a single request" in capfd.readouterr().err
    point = json.loads((out / "summary.json").read_text())["points"][0]
    assert point["status"] == "oom" and point["completed"] == 0
    assert point["output_throughput"] == 0.0  # nothing finished: zero, never NaN
    assert "NaN" not in (out / "results.jsonl").read_text()


def test_requests_file_is_replayed_exactly(scenario, tmp_path, capsys):
    from kvbench.workload.requests_file import write_requests_jsonl

    path = tmp_path / "req.jsonl"
    write_requests_jsonl(path, [([1, 2, 3, 4, 5], 6), ([7] * 12, 4), ([9, 8], 3)])
    out = tmp_path / "replay"
    assert run(["--scenario", scenario, "--out", str(out), "--concurrency", "2", "--requests-file", str(path)]) == 0
    points = json.loads((out / "summary.json").read_text())["points"]
    assert all(p["completed"] == 3 for p in points)
    assert {p["engine"]: p["total_token_throughput"] / p["output_throughput"] for p in points} == pytest.approx(
        {"paged": (19 + 13) / 13, "contiguous": (19 + 13) / 13}
    )  # prompts 5+12+2 tokens, outputs 6+4+3
    write_requests_jsonl(path, [([100000], 2)])
    assert (
        run(
            ["--scenario", scenario, "--out", str(tmp_path / "bad"), "--concurrency", "1", "--requests-file", str(path)]
        )
        == 2
    )
    assert "vocabulary" in capsys.readouterr().err


def test_parallel_sampling_scenario_forks_for_paged_and_copies_for_the_baseline(tmp_path, capsys, scenario_text):
    path = tmp_path / "samples.toml"
    path.write_text(scenario_text.replace('admission = "queue"', 'admission = "queue"\nsamples = 3'))
    out = tmp_path / "ps"
    assert run(["--scenario", str(path), "--out", str(out), "--concurrency", "2"]) == 0
    points = {p["engine"]: p for p in json.loads((out / "summary.json").read_text())["points"]}
    assert points["paged"]["completed"] == points["contiguous"]["completed"] == 6 * 3
    assert points["paged"]["kv_peak_allocated_bytes"] < points["contiguous"]["kv_peak_allocated_bytes"]
    assert main(["sweep", "--scenario", str(path), "--simulate", "--out", str(tmp_path / "sim")]) == 2
    assert "tensor engine only" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["waste", "--max-len", "abc"], ["nope"], ["sweep", "--bogus"]])
def test_usage_errors_are_one_line(args, capsys):
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1 and "--help" in err


def simulate(args: list[str]) -> int:
    return main(["sweep", "--simulate", "--requests", "40", "--concurrency", "4,8", *args])


def test_every_point_failing_is_a_failed_run(tmp_path, monkeypatch, capsys):
    def broken(self, engine, requests, load, on_step):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(SimulatedBackend, "run", broken)
    assert simulate(["--out", str(tmp_path / "run"), "--continue-on-error"]) == 1
    assert "4 of 4 points failed" in capsys.readouterr().err
    assert len(json.loads((tmp_path / "run" / "summary.json").read_text())["points"]) == 4


@pytest.mark.parametrize(
    "args, message",
    [
        (["--concurrency", "2,2"], "--concurrency lists 2 twice"),
        (["--engines", "paged,paged"], "engines lists 'paged' twice"),
        (["--out", ""], "--out is empty"),
        (["--out", " "], "--out is empty"),
    ],
)
def test_duplicates_and_an_empty_out_are_refused(args, message, capsys):
    assert main(["sweep", "--simulate", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_resume_with_fewer_levels_keeps_every_finished_point(tmp_path):
    out = tmp_path / "run"
    assert simulate(["--out", str(out)]) == 0
    assert main(["sweep", "--simulate", "--requests", "40", "--concurrency", "8", "--out", str(out), "--resume"]) == 0
    points = json.loads((out / "summary.json").read_text())["points"]
    assert sorted((p["engine"], p["concurrency"]) for p in points) == [
        ("contiguous", 4),
        ("contiguous", 8),
        ("paged", 4),
        ("paged", 8),
    ]


def test_resume_pins_the_contents_of_the_scenario_and_the_gpu(tmp_path, scenario_text, capsys):
    path = tmp_path / "s.toml"
    path.write_text(scenario_text)
    out = tmp_path / "run"
    args = ["sweep", "--simulate", "--scenario", str(path), "--concurrency", "2", "--out", str(out)]
    assert main(args) == 0
    path.write_text(scenario_text.replace("sigma = 0.5", "sigma = 0.4"))  # same name, other workload
    assert main([*args, "--resume"]) == 2
    assert "scenario_sha256" in capsys.readouterr().err
    path.write_text(scenario_text)
    assert main([*args, "--resume", "--gpu", "h100-80g"]) == 2
    assert "gpu 'a100-80g' -> 'h100-80g'" in capsys.readouterr().err
    assert main([*args, "--resume"]) == 0


def test_resume_pins_the_contents_of_the_requests_file(tmp_path, scenario, capsys):
    from kvbench.workload.requests_file import write_requests_jsonl

    requests = tmp_path / "req.jsonl"
    write_requests_jsonl(requests, [([1, 2, 3], 4), ([5, 6], 3)])
    out = tmp_path / "run"
    args = [
        "sweep",
        "--simulate",
        "--scenario",
        scenario,
        "--concurrency",
        "2",
        "--requests-file",
        str(requests),
        "--out",
        str(out),
    ]
    assert main(args) == 0
    write_requests_jsonl(requests, [([1, 2, 3], 4), ([5, 6], 9)])
    assert main([*args, "--resume"]) == 2
    assert "requests_file_sha256" in capsys.readouterr().err


def test_a_torn_last_line_is_set_aside_on_resume(tmp_path, capsys):
    out = tmp_path / "run"
    assert simulate(["--out", str(out), "--concurrency", "4"]) == 0
    results = out / "results.jsonl"
    whole = results.read_text()
    results.write_text(whole + '{"engine": "paged", "concurrency": 8, "sta')  # a crash mid-write
    assert simulate(["--out", str(out), "--resume"]) == 0
    assert "cut short" in capsys.readouterr().out
    assert (out / "results.jsonl.torn").read_text().startswith('{"engine": "paged", "concurrency": 8')
    lines = [json.loads(line) for line in results.read_text().splitlines()]
    assert sorted((p["engine"], p["concurrency"]) for p in lines) == [
        ("contiguous", 4),
        ("contiguous", 8),
        ("paged", 4),
        ("paged", 8),
    ]


def test_a_last_line_without_its_newline_keeps_its_record(tmp_path):
    out = tmp_path / "run"
    assert simulate(["--out", str(out), "--concurrency", "4"]) == 0
    results = out / "results.jsonl"
    results.write_text(results.read_text().rstrip("\n"))
    assert simulate(["--out", str(out), "--resume"]) == 0
    assert len([json.loads(line) for line in results.read_text().splitlines()]) == 4


def test_two_sweeps_into_one_directory_are_refused(tmp_path, capsys):
    from kvbench.fileio import DirectoryLock

    out = tmp_path / "run"
    out.mkdir()
    with DirectoryLock(out, "kvbench sweep"):  # another sweep is writing here
        assert simulate(["--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert "in use by another kvbench sweep" in err and len(err.splitlines()) == 1
    assert not (out / "results.jsonl").exists()
    assert simulate(["--out", str(out)]) == 0  # the lock went with its holder


def test_requests_longer_than_max_len_are_skipped_with_a_count(tmp_path, scenario, capsys):
    from kvbench.workload.requests_file import write_requests_jsonl

    requests = tmp_path / "req.jsonl"
    write_requests_jsonl(requests, [([1, 2, 3], 4), ([5] * 60, 10)])  # the scenario's max-len is 64
    out = tmp_path / "run"
    args = ["sweep", "--simulate", "--scenario", scenario, "--concurrency", "1", "--requests-file", str(requests)]
    assert main([*args, "--out", str(out), "--json"]) == 0
    captured = capsys.readouterr()
    assert "1 of 2 records" in captured.err and "exceeds max-len 64" in captured.err
    summary = json.loads(captured.out)
    assert summary["meta"]["skipped_requests"] == {
        "count": 1,
        "total": 2,
        "reason": "prompt + output exceeds max-len 64",
    }
    assert all(p["status"] == "ok" and p["completed"] == 1 and p["rejected"] == 0 for p in summary["points"])
    write_requests_jsonl(requests, [([5] * 60, 10)])
    assert main([*args, "--out", str(tmp_path / "none")]) == 2
    assert "longer than max-len 64" in capsys.readouterr().err


def test_an_unwritable_metrics_file_fails_before_any_point(tmp_path, scenario, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert (
        run(["--scenario", scenario, "--out", str(tmp_path / "run"), "--metrics-file", str(blocker / "metrics.prom")])
        == 2
    )
    assert "--metrics-file" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_ray_missing_is_refused_before_the_model_loads(tmp_path, monkeypatch, capfd):
    from kvbench.errors import KvbenchError
    from kvbench.studies.fleet import ray_runtime
    from kvbench.studies.sweep_setup import SweepSetup

    def no_ray():
        raise KvbenchError("this needs Ray, which is not installed: pip install 'kvbench[fleet]'")

    def no_work(*args, **kwargs):
        raise AssertionError("the setup started before Ray was found missing")

    monkeypatch.setattr(ray_runtime, "import_ray", no_ray)
    monkeypatch.setattr(SweepSetup, "resolve", no_work)
    assert run(["--ray", "--out", str(tmp_path / "run")]) == 2
    captured = capfd.readouterr()
    assert captured.out == "" and captured.err.strip().splitlines() == [
        "error: this needs Ray, which is not installed: pip install 'kvbench[fleet]'"
    ]


def prefetch_words(record: dict) -> str:
    return "off" if record["ahead"] == 0 else f"{record['ahead']} tokens ahead into L{record['level']}"


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_half_precision_sweeps_measure_their_cpu_choices_and_run(scenario, tmp_path, monkeypatch, capsys, dtype):
    """``--dtype bf16`` and ``fp16`` on a CPU, with the start-up measurements on (they once crashed the thread probe:
    float32 activations against a half-precision weight): threads and matmul paths measured at the run's dtype,
    printed, kept in the metadata and cached for the next run; at bf16 the C decode attention's prefetch too."""
    import torch

    from kvbench.cpu import cpu_linear, decode_prefetch, threads

    monkeypatch.delenv("KVBENCH_THREADS", raising=False)
    monkeypatch.delenv("KVBENCH_MATMUL", raising=False)
    monkeypatch.delenv(decode_prefetch.ENV, raising=False)
    monkeypatch.setattr(decode_prefetch, "last_level_cache_bytes", lambda: 1 << 20)  # a small probe pool
    monkeypatch.setenv("KVBENCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    packs_bf16 = cpu_linear.packing_available(torch.device("cpu"), torch.bfloat16)
    for attempt in ("first", "second"):
        out = tmp_path / f"run-{attempt}"
        args = ["--scenario", scenario, "--out", str(out), "--concurrency", "2", "--dtype", dtype, "--verbose"]
        assert run(args) == 0
        meta = json.loads((out / "summary.json").read_text())["meta"]
        printed = capsys.readouterr().out
        assert "measured the model's" in meta["threads"]["reason"]
        assert ("cached, measured" in meta["threads"]["reason"]) == (attempt == "second")
        assert f"CPU threads: {meta['threads']['threads']} (measured" in printed
        assert "CPU heap: " in printed
        if dtype == "bf16":
            prefetch = meta["cpu_decode_prefetch"]
            assert ("cached, measured" in prefetch["reason"]) == (attempt == "second")
            assert set(prefetch["timings_us"]) == {"0:L1", "16:L1", "32:L1", "16:L2", "32:L2"}
            assert f"decode attention prefetch: {prefetch_words(prefetch)} (measured over" in printed
        if dtype == "bf16" and not packs_bf16:  # oneDNN packs bfloat16 only with AVX-512 (or AVX-NE-CONVERT)
            assert meta["cpu_matmuls"] is None
        elif dtype == "bf16":  # oneDNN packs bfloat16: the paths are measured per weight
            plan = meta["cpu_matmuls"]
            assert plan["dtype"] == "bf16" and set(plan["weights"]) == {
                "qkv_proj",
                "o_proj",
                "gate_up_proj",
                "down_proj",
                "lm_head",
            }
            assert plan["source"].startswith("cached" if attempt == "second" else "measured now")
            assert "CPU matmul paths, " in printed and "lm_head [512 x 64]" in printed
        else:  # nothing to pack at fp16 on a CPU: the plain weights, nothing measured
            assert meta["cpu_matmuls"] is None
            assert meta["cpu_decode_prefetch"] is None  # the C decode attention takes float32 and bfloat16
    # without --verbose the measurements are one line, ahead of the table rather than a screen of timings
    assert run(["--scenario", scenario, "--out", str(tmp_path / "quiet"), "--concurrency", "2", "--dtype", dtype]) == 0
    printed = capsys.readouterr().out
    (cpu_line,) = [line for line in printed.splitlines() if line.startswith("CPU")]
    count = meta["threads"]["threads"]
    assert cpu_line.startswith(f"CPU: {count} thread{'s' if count != 1 else ''}") and "CPU threads:" not in printed
    assert " us" not in cpu_line and "measures again" not in cpu_line  # no timings, no provenance repeated
