"""``kvbench sweep --target``: end to end against a real ``kvbench serve`` (a subprocess on a free 127.0.0.1
port, the tiny preset), faults from the fake server, bad input as one line with exit 2, and an opt-in run
against a live vLLM (``KVBENCH_VLLM_URL``)."""

from __future__ import annotations

import html
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from serve_process import serving, write_shared_prefix_requests

from kvbench.cli import main
from kvbench.measure.kv_residency import read_kv_events_text, rebuild

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "endpoint"))
from fake_server import serve_in_thread  # noqa: E402


@pytest.fixture(scope="module")
def kvbench_server() -> Iterator[str]:
    """``kvbench serve`` (paged, tiny preset) on a free loopback port; stopped (and checked exited) after."""
    with serving("--served-model-name", "tiny-served") as url:
        yield url


def _points(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines() if line.strip()]


def test_a_sweep_of_kvbench_serve_measures_every_request_and_reads_its_kv_cache(kvbench_server, tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "sweep",
                "--target",
                f"local={kvbench_server}",
                "--concurrency",
                "1,4",
                "--requests",
                "8",
                "--slo",
                "ttft=60000,tpot=60000",
                "--scrape-interval",
                "0.1",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "Servers over HTTP" in out and "local" in out
    points = {p["concurrency"]: p for p in _points(run)}
    assert set(points) == {1, 4}
    requests = json.loads((run / "summary.json").read_text())
    assert requests["kind"] == "sweep" and requests["meta"]["model_name"] == "tiny-served"
    for c, p in points.items():
        assert p["engine"] == "local" and p["status"] == "ok"
        assert p["completed"] == 8 and p["failed"] == 0 and p["failed_by_kind"] == {}
        assert p["endpoint"]["model"] == "tiny-served" and p["endpoint"]["load"] == {
            "pattern": "closed",
            "concurrency": c,
        }
        assert p["endpoint"]["peak_in_flight"] == c
        # the server's own counters over the point: the tokens it generated are the ones the client counted
        assert p["server_generation_tokens"] == p["total_output_tokens"] > 0
        assert p["agreement"]["output_tokens_client_over_server"] == 1.0
        assert p["agreement"]["input_tokens_client_over_server"] == 1.0
        assert p["total_input_tokens"] > 0
        assert p["server_prompt_tokens"] == p["total_input_tokens"]  # the server's count equals the client's usage
        assert 0 < p["kv_usage_peak"] <= 1 and 0 <= p["kv_usage_mean"] <= p["kv_usage_peak"]
        assert 1 <= p["peak_running"] <= c
        assert p["preemptions"] == 0
        assert p["kv_pool_bytes"] is None and p["kv_peak_allocated_bytes"] is None  # unknown, never 0
        assert p["request_goodput"] == pytest.approx(p["request_throughput"])  # a generous SLO: every request
        assert p["output_throughput"] == pytest.approx(p["total_output_tokens"] / p["duration"])
        assert p["p50_ttft_ms"] == p["median_ttft_ms"] and p["p99_ttft_ms"] >= p["p50_ttft_ms"] > 0
        timeline = json.loads((run / f"timeline-local-c{c}.json").read_text())
        assert sum(timeline["client"]["output_tokens_per_s"]) * timeline["bin_s"] == pytest.approx(
            p["total_output_tokens"]
        )
        assert any(row.get("kv_usage") for row in timeline["server"])
        assert (run / f"watch-local-c{c}.jsonl").is_file() and (run / f"timeline-local-c{c}.png").is_file()
    # the same lists at both levels: the same tokens
    assert points[1]["total_output_tokens"] == points[4]["total_output_tokens"]
    for name in ("summary.md", "summary.csv", "throughput.png", "latency.png", "kv_usage.png"):
        assert (run / name).is_file(), name

    assert main(["diagnose", str(run)]) == 0
    diagnosed = capsys.readouterr().out
    assert "local C=4" in diagnosed and "KV usage" in diagnosed
    assert main(["diagnose", str(run / "watch-local-c4.jsonl")]) == 0
    capsys.readouterr()
    assert main(["report", str(run), "--out", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "Servers over HTTP (TPS = output tokens/s" in page and "client throughput and server KV usage" in page
    assert main(["compare", str(run), str(run)]) == 0


def test_prompt_and_answer_lengths_size_a_server_run_and_the_header_names_what_it_serves(
    kvbench_server, tmp_path, capsys
):
    """vllm bench serve's --random-input-len/--random-output-len: a server run sized to a few seconds, its header
    naming the served model and the lengths, not the local default's tokenizer."""
    run = tmp_path / "run"
    args = ["--input-len", "12", "--output-len", "3:5", "--max-len", "64", "--requests", "6", "--concurrency", "2"]
    assert main(["sweep", "--target", f"local={kvbench_server}", *args, "--out", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"targets: local = {kvbench_server}; serving tiny-served" in out
    assert "requests: 6 per point, prompts 12-12 tokens (mean 12), answers 3-5" in out and "max-len 64" in out
    assert "has no tokenizer" not in out and "stop: length: each request asks for its drawn output length" in out
    assert "ignore_eos where the server takes it" in " ".join(out.split())
    assert "local C=2: 6/6 requests, " in out and "s left" in out  # off a terminal, progress is said in lines
    (point,) = _points(run)
    assert point["total_input_tokens"] == 6 * 12 and 6 * 3 <= point["total_output_tokens"] <= 6 * 5
    assert (
        main(
            [
                "sweep",
                "--target",
                f"local={kvbench_server}",
                "--input-len",
                "60",
                "--output-len",
                "8",
                "--max-len",
                "64",
                "--out",
                str(tmp_path / "long"),
            ]
        )
        == 2
    )
    assert "past the max-len of 64" in capsys.readouterr().err


def test_a_point_time_limit_ends_the_point_and_counts_what_it_cut_not_as_failures(kvbench_server, tmp_path, capsys):
    run = tmp_path / "run"
    args = [  # far more work than 0.5 s holds on any CPU (40 x 64 tokens ended inside it on a Zen 5)
        "--input-len",
        "16",
        "--output-len",
        "256",
        "--requests",
        "200",
        "--concurrency",
        "1",
        "--point-timeout",
        "0.5",
    ]
    assert main(["sweep", "--target", f"local={kvbench_server}", *args, "--out", str(run)]) == 0
    out = capsys.readouterr().out
    (point,) = _points(run)
    assert point["endpoint"]["stopped_at_deadline"] is True and point["status"] == "ok"
    assert point["failed"] == 0 and point["completed"] + point["stopped"] == 200 and point["stopped"] > 0
    assert 0.5 <= point["duration"] < 5
    assert f"{point['completed']}/0 +{point['stopped']} cut" in out
    records = [json.loads(line) for line in (run / "requests-local-c1.jsonl").read_text().splitlines()]
    cut = [r["error_kind"] for r in records if not r["ok"]]
    assert len(cut) == point["stopped"] and set(cut) <= {"cancelled", "not_sent"}


def test_two_targets_run_side_by_side_in_an_open_loop(kvbench_server, tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "sweep",
                "--target",
                f"a={kvbench_server}",
                "--target",
                f"b={kvbench_server}/v1",
                "--rate",
                "50",
                "--max-concurrency",
                "3",
                "--requests",
                "6",
                "--api",
                "completions",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    points = _points(run)
    assert [(p["engine"], p["concurrency"], p["request_rate"]) for p in points] == [("a", 0, 50.0), ("b", 0, 50.0)]
    for p in points:
        assert p["completed"] == 6 and p["endpoint"]["peak_in_flight"] <= 3
        assert p["endpoint"]["url"] == kvbench_server  # /v1 cut back to the server's root
        assert (run / f"timeline-{p['engine']}-r50.json").is_file()
    assert "50 req/s" in capsys.readouterr().out


def test_find_max_bisects_and_says_why_it_stops(kvbench_server, tmp_path, capsys):
    """An objective nothing meets past C=1 on a busy CPU is not reliable; one every level meets is: the search
    stops at the highest level asked for after one point and says so."""
    run = tmp_path / "run"
    assert (
        main(
            [
                "sweep",
                "--target",
                f"s={kvbench_server}",
                "--concurrency",
                "1,8",
                "--requests",
                "8",
                "--slo",
                "e2el=600000",
                "--find-max",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    search = json.loads((run / "summary.json").read_text())["endpoint"]["find_max"]
    assert [s["best"] for s in search] == [8.0] and [len(s["probes"]) for s in search] == [1]
    assert "meets the SLO" in search[0]["stopped"]
    assert len(_points(run)) == 1
    capsys.readouterr()


def test_failed_requests_are_counted_by_kind_and_the_run_exits_1(tmp_path, capsys):
    with serve_in_thread(faults=["", "500"], itl_s=0.001) as server:
        run = tmp_path / "run"
        assert (
            main(
                ["sweep", "--target", f"flaky={server.url}", "--concurrency", "2", "--requests", "6", "--out", str(run)]
            )
            == 1
        )
    err = capsys.readouterr().err
    assert "had failed requests" in err and "flaky C=2" in err
    (point,) = _points(run)
    assert point["status"] == "error" and point["completed"] + point["failed"] == 6
    assert point["failed"] >= 2 and set(point["failed_by_kind"]) == {"http"}
    assert "requests failed" in point["error"] and "(e.g. request " in point["error"]  # with its first reason
    assert (run / "summary.json").is_file()  # the run's report is written before it fails
    assert main(["diagnose", str(run), "--check"]) == 1  # the failed requests are a critical finding
    assert "requests_failed" in capsys.readouterr().out


def test_a_run_whose_every_scrape_failed_still_gets_its_page_saying_so(tmp_path, capsys, monkeypatch):
    """Every /metrics scrape answers 503: the run still writes report.html (never announces a page it did not
    write), the page and diagnose say that no scrape succeeded, and ``kvbench report`` rebuilds it."""
    monkeypatch.setenv("KVBENCH_REPORT", "1")
    with serve_in_thread(metrics_fail_after=0, itl_s=0.001) as server:
        run = tmp_path / "run"
        args = ["sweep", "--target", f"t={server.url}", "--concurrency", "2", "--requests", "4"]
        assert main([*args, "--scrape-interval", "0.05", "--out", str(run)]) == 0
    captured = capsys.readouterr()
    assert "not written" not in captured.err and "report.html" in captured.out
    page = html.unescape((run / "report.html").read_text())
    assert "scrapes of the server's /metrics failed" in page
    (run / "report.html").unlink()
    assert main(["report", str(run)]) == 0 and (run / "report.html").is_file()
    assert main(["diagnose", str(run)]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "scrapes of the server's /metrics failed: nothing to judge its KV cache by" in said


def test_repeat_runs_each_point_k_times_and_counts_every_failure(tmp_path, capsys):
    """Two runs of one point: the client's figures as means with their spread, both runs' files kept, and the
    failed requests of both runs counted (the fake server fails every second request: warm-ups included)."""
    with serve_in_thread(faults=["", "500"], itl_s=0.001) as server:
        run = tmp_path / "run"
        args = ["sweep", "--target", f"f={server.url}", "--concurrency", "2", "--requests", "6", "--repeat", "2"]
        assert main([*args, "--out", str(run)]) == 1
        requests_seen = server.state.count
    (point,) = _points(run)
    assert point["repeats"] == 2 and len(point["samples"]["output_throughput"]) == 2
    assert point["output_throughput_std"] >= 0 and "output_throughput_ci95" in point
    assert point["repeat_files"] == ["timeline-f-c2-run1.json", "timeline-f-c2-run2.json"]
    assert point["timeline_file"] == "timeline-f-c2-run2.json"
    assert all((run / name).is_file() for name in point["repeat_files"])
    assert point["status"] == "error" and point["failed"] >= 4 and point["failed_by_kind"]["http"] == point["failed"]
    assert point["completed"] + point["failed"] / 2 == 6  # the mean over the runs completed, every failure counted
    assert requests_seen > 12  # both runs sent their requests (and warm-ups)
    assert " ± " in capsys.readouterr().out  # the table shows the spread over the runs


def test_a_server_that_stops_answering_mid_sweep_keeps_the_points_before_it(tmp_path, capsys):
    """The first point is served (8 requests with the warm-up and the checks), then every request fails: the
    second point cannot start; the first is summarised and the run exits 1 saying why it stopped."""
    with serve_in_thread(faults=[""] * 8 + ["500"] * 400, itl_s=0.001) as server:
        run = tmp_path / "run"
        args = ["sweep", "--target", f"f={server.url}", "--concurrency", "1,2", "--requests", "4", "--out", str(run)]
        assert main(args) == 1
    err = capsys.readouterr().err
    assert "the sweep stopped after 1 point(s)" in err and "summarised in" in err
    (point,) = _points(run)
    assert point["status"] == "ok" and point["completed"] == 4
    summary = json.loads((run / "summary.json").read_text())
    assert [p["concurrency"] for p in summary["points"]] == [1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "args, words",
    [
        (["--target", "127.0.0.1:8000"], "expected [NAME=]http://HOST:PORT"),
        (["--target", "ftp://127.0.0.1:8000"], "expected [NAME=]http://HOST:PORT"),
        (["--target", "http://127.0.0.1:99999"], "port"),
        (["--target", "bad name=http://127.0.0.1:8000"], "--target name"),
        (["--target", "a=http://127.0.0.1:1", "--target", "a=http://127.0.0.1:2"], "names must differ"),
        (["--target", "http://127.0.0.1:8000", "--api", "embeddings"], "--api"),
        (["--target", "http://127.0.0.1:8000", "--slo", "ttft=fast"], "not a number"),
        (["--target", "http://127.0.0.1:8000", "--slo", "speed=5"], "KEY=MILLISECONDS"),
        (["--target", "http://127.0.0.1:8000", "--rate", "2", "--concurrency", "4"], "choose one"),
        (["--target", "http://127.0.0.1:8000", "--rate", "0"], "positive"),
        (["--target", "http://127.0.0.1:8000", "--rate", "1e-9"], "a point would wait days"),
        (["--target", "http://127.0.0.1:8000", "--burstiness", "0.5"], "go with --rate"),
        (["--target", "http://127.0.0.1:8000", "--find-max"], "give --slo"),
        (["--target", "http://127.0.0.1:8000", "--slo", "ttft=5", "--find-max", "--repeat", "2"], "--find-max bisects"),
        (["--target", "http://127.0.0.1:8000", "--api-key-env", "sk-123"], "NAME of an environment variable"),
        (["--target", "http://127.0.0.1:8000", "--api-key-env", "KVBENCH_UNSET_KEY"], "is not set or empty"),
        (["--target", "http://127.0.0.1:8000", "--engines", "paged"], "--engines"),
        (["--target", "http://127.0.0.1:8000", "--simulate"], "cannot be simulated"),
        (["--slo", "ttft=5"], "goes with --target"),
        (["--target", "http://127.0.0.1:8000", "--input-len", "ten"], "a token count N or a range LO:HI"),
        (["--target", "http://127.0.0.1:8000", "--output-len", "9:3"], "LO no more than HI"),
        (["--target", "http://127.0.0.1:8000", "--output-len", "0"], "at least 1 token"),
        (["--target", "http://127.0.0.1:8000", "--max-len", "1"], "--max-len"),
        (["--target", "http://127.0.0.1:8000", "--output-len", "8", "--stop", "eos"], "goes with --stop length"),
        (["--target", "http://127.0.0.1:8000", "--input-len", "8", "--dataset", "real-chat"], "not --requests-file"),
        (["--input-len", "8"], "goes with --target"),
        (["--target", "http://127.0.0.1:8000", "--point-timeout", "0"], "--point-timeout must be a positive"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, words, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["sweep", *args, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "\n" not in err and words in err, err
    assert not (tmp_path / "run").exists() and not (tmp_path / "reports").exists()


@pytest.mark.parametrize(
    "url, words",
    [("http://[::1]:{port}", "cannot reach"), ("http://user:hunter2@127.0.0.1:{port}", "--api-key-env instead")],
)
def test_ipv6_and_credentials_in_a_target_url(url, words, tmp_path, capsys):
    # an IPv6 loopback is a target like any other; a password in the URL is refused and never echoed
    port = _free_port()
    assert main(["sweep", "--target", url.format(port=port), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert words in err and "hunter2" not in err and "--target name" not in err, err


def test_an_unreachable_server_is_one_line_and_exit_2_before_anything_is_written(tmp_path, capsys):
    port = _free_port()
    assert main(["sweep", "--target", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"error: cannot reach http://127.0.0.1:{port}/v1/models") and "\n" not in err
    assert not (tmp_path / "run").exists()


def test_an_api_key_goes_in_clear_text_only_to_loopback(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVBENCH_TEST_KEY", "secret-value")
    assert (
        main(
            [
                "sweep",
                "--target",
                "http://192.0.2.1:8000",
                "--api-key-env",
                "KVBENCH_TEST_KEY",
                "--out",
                str(tmp_path / "run"),
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "refusing to send the API key in clear text to 192.0.2.1" in err and "secret-value" not in err


VLLM_URL = os.environ.get("KVBENCH_VLLM_URL")


@pytest.mark.skipif(not VLLM_URL, reason="set KVBENCH_VLLM_URL=http://127.0.0.1:PORT of a running vLLM server")
def test_a_live_vllm_server(tmp_path, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "sweep",
                "--target",
                f"vllm={VLLM_URL}",
                "--concurrency",
                "1,4",
                "--requests",
                "8",
                "--scenario",
                "ci-smoke",
                "--out",
                str(run),
            ]
        )
        == 0
    )
    for p in _points(run):
        assert p["status"] == "ok" and p["completed"] == 8
        assert "vllm" in p["scrapes"]["families"] and p["kv_usage_peak"] is not None
        assert p["agreement"]["output_tokens_client_over_server"] == pytest.approx(1.0, abs=0.02)
    capsys.readouterr()


@pytest.fixture(scope="module")
def events_server(tmp_path_factory) -> Iterator[tuple[str, str, str]]:
    """``kvbench serve`` publishing its KV events (and answering replays) on ipc sockets."""
    folder = tmp_path_factory.mktemp("events")
    events, replay = f"ipc://{folder}/events", f"ipc://{folder}/replay"
    with serving("--kv-events", events, "--kv-events-replay", replay) as url:
        yield url, events, replay


def test_a_sweep_reads_cached_tokens_per_request_and_the_servers_kv_events(events_server, tmp_path, capsys):
    url, events, replay = events_server
    run = tmp_path / "run"
    # 4 groups of 4 sharing 70 tokens (4 full blocks of 16), 6 of their own
    requests = write_shared_prefix_requests(tmp_path / "requests.jsonl", 4, 4, 70, 6, 5)
    args = ["sweep", "--target", f"kvb={url}", "--requests-file", str(requests), "--concurrency", "1"]
    args += ["--kv-events", events, "--kv-events-replay", replay, "--reset-prefix-cache", "--out", str(run)]
    assert main(args) == 0
    out = capsys.readouterr().out
    (point,) = _points(run)
    reuse, kv = point["prefix_reuse"], point["kv_events"]
    # 12 of 16 requests find their group's 4 full prefix blocks; the answers and the counters say the same
    assert reuse["cached_tokens"] == 12 * 64 and reuse["requests_reporting"] == 16
    assert reuse["counter_hits"] == 12 * 64 and reuse["difference_tokens"] == 0 and reuse["flag"] is None
    assert reuse["workload"] == {
        "block_size": 16,
        "ideal_cached_tokens": 12 * 64,
        "ideal_hit_rate": pytest.approx(12 * 64 / (16 * 76)),
        "requests_sharing_under_one_block": 0,
    }
    assert point["cache_reset"]["reset"] is True
    # the events: 4 prefix blocks per group, and each request's own 5th block (76 + 4 tokens written)
    assert kv["history_complete"] and kv["lost_batches"] == 0 and kv["flag"] is None
    assert kv["kv_blocks_stored"] == 4 * 4 + 16 and kv["kv_blocks_removed"] == 0 and kv["kv_cache_resets"] == 0
    assert kv["resident_minus_server_cached_blocks_at_rest"] == 0  # under load the gauge may lag its events
    figures, rows = read_kv_events_text((run / point["kv_events_file"]).read_text())
    assert figures == kv and rebuild(rows, 10.0, True).resident_end == kv["kv_resident_blocks_end"]
    assert "the answers report 63.2% of prompt tokens served from the prefix cache" in out
    assert "KV events: 32 blocks stored, 0 removed" in out
    assert point["cache_state"] == "reset"
    assert main(["diagnose", str(run)]) == 0
    assert "kvb C=1: no block was removed" in capsys.readouterr().out  # the recorded events, re-read
    (run / point["kv_events_file"]).write_text("not the file\n")
    assert main(["diagnose", str(run)]) == 0
    assert "its KV events file cannot be read" in capsys.readouterr().out


def test_a_server_that_publishes_no_kv_events_marks_the_point_and_reports_no_figure(kvbench_server, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["sweep", "--target", f"kvb={kvbench_server}", "--requests", "4", "--concurrency", "2"]
    assert main([*args, "--kv-events", f"ipc://{tmp_path}/silent", "--out", str(run)]) == 0
    out = capsys.readouterr().out
    (point,) = _points(run)
    assert point["kv_events"]["kv_blocks_stored"] is None and point["kv_events"]["kv_thrash_share"] is None
    assert "no KV event arrived from ipc://" in point["kv_events"]["flag"] and "no KV event arrived" in out


@pytest.mark.parametrize("rate", [0.0, 0.5, 0.9])
def test_a_target_hit_rate_is_achieved_within_a_block_per_mean_prompt(kvbench_server, rate, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["sweep", "--target", f"kvb={kvbench_server}", "--requests", "12", "--concurrency", "3"]
    assert main([*args, "--prefix-hit-rate", str(rate), "--reset-prefix-cache", "--out", str(run)]) == 0
    out = capsys.readouterr().out
    (point,) = _points(run)
    target, reuse = point["prefix_reuse"]["target"], point["prefix_reuse"]
    mean_prompt = point["total_input_tokens"] / point["completed"]
    tolerance = max(0.005, target["block_size"] / mean_prompt)
    assert target["rate"] == rate and target["tolerance"] == pytest.approx(tolerance)
    assert abs(reuse["hit_rate_requests"] - rate) <= tolerance and target["met"] is True
    assert reuse["hit_rate_requests"] == pytest.approx(target["planned"])  # every shared block stayed cached
    assert reuse["hit_rate_counters"] == pytest.approx(reuse["hit_rate_requests"])
    assert f"target hit rate {rate:.1%} met" in out


def _session_trace(path: Path) -> Path:
    """4 sessions of 3 turns in blocks of 16: every prompt opens with one shared block (a system prompt), each turn
    resends its session's blocks and adds two; turns 0.4 s apart, sessions 0.2 s apart."""
    rows = []
    for session in range(4):
        ids = [1]
        for turn in range(3):
            ids = ids + [1000 * (session + 1) + len(ids) + k for k in range(2)]
            stamp = session * 200 + turn * 400
            rows.append(
                (
                    stamp,
                    {
                        "timestamp": stamp,
                        "input_length": len(ids) * 16 - 3,
                        "output_length": 4,
                        "hash_ids": list(ids),
                        "session_id": f"s{session}",
                    },
                )
            )
    rows.sort(key=lambda row: row[0])
    path.write_text("".join(json.dumps(row) + "\n" for _, row in rows))
    return path


def test_a_trace_is_replayed_at_its_times_and_its_hits_match_the_simulation_and_the_hand_count(
    events_server, tmp_path, capsys
):
    url, events, replay = events_server
    run = tmp_path / "run"
    trace = _session_trace(tmp_path / "trace.jsonl")
    args = ["sweep", "--target", f"kvb={url}", "--trace", str(trace), "--trace-block-size", "16"]
    assert main([*args, "--reset-prefix-cache", "--kv-events", events, "--out", str(run)]) == 0
    out = capsys.readouterr().out
    (point,) = _points(run)
    assert point["endpoint"]["load"] == {"pattern": "trace"} and point["completed"] == 12
    # by hand: a turn finds the shared block (after the first session's first turn) and every full block of its
    # session's previous prompt (prompts end 3 tokens into their last block, so that block is never full)
    prompts = [16 * n - 3 for n in (3, 5, 7)]
    hits_by_turn = [16, 16 * 2, 16 * 4]  # turn 0: the shared block; later turns: their previous prompt's full blocks
    expected = (4 * sum(hits_by_turn) - 16) / (4 * sum(prompts))  # the very first request finds nothing
    reuse = point["prefix_reuse"]
    assert reuse["hit_rate_requests"] == pytest.approx(expected) == reuse["hit_rate_counters"]
    assert reuse["workload"]["ideal_hit_rate"] == pytest.approx(expected)
    assert point["trace"]["requests"] == 12 and point["trace"]["predicted_hit_rate"] == pytest.approx(expected)
    assert [rate for _, rate in point["trace"]["predicted_with_more_blocks"]] == [pytest.approx(expected)] * 3
    assert set(reuse["hit_rate_by_turn"]) == {"0", "1", "2"}
    records = [json.loads(line) for line in (run / point["requests_file"]).read_text().splitlines()]
    assert sorted(r["cached_tokens"] for r in records if r["turn"] == 2) == [64] * 4
    assert "kvb trace: kvbench's simulation of the same trace" in out and "kvb trace: the answers report" in out
    assert (run / "timeline-kvb-trace.json").is_file() and (run / "kv-events-kvb-trace.jsonl").is_file()
