"""``kvbench diagnose`` end to end: run directories, a live endpoint, --check exit codes, rules YAML."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
from dataclasses import fields

import pytest

from kvbench.cli import main
from kvbench.engine.request import Request
from kvbench.engine.scheduler import Scheduler
from kvbench.kv.block_pool import BlockPool
from kvbench.kv.paged import PagedManager
from kvbench.measure.exporter import KvMetrics
from kvbench.report.diagnose import Thresholds
from kvbench.results.schema import SCHEMA_VERSION


def point(engine: str, concurrency: int, **changes) -> dict:
    p = {
        "engine": engine,
        "concurrency": concurrency,
        "scenario": "s",
        "status": "ok",
        "completed": 50,
        "rejected": 0,
        "preemptions": 0,
        "peak_running": concurrency,
        "kv_pool_bytes": 1 << 20,
        "kv_peak_allocated_bytes": 1 << 19,
        "fragmentation_mean": 0.04,
        "waste": {
            "token_state_pct": 45.0,
            "reservation_pct": 1.0,
            "internal_pct": 1.0,
            "external_pct": 0.0,
            "free_pct": 53.0,
        },
    }
    p.update(changes)
    return p


def write_run(tmp_path, name: str, points: list[dict]):
    run = tmp_path / name
    run.mkdir()
    document = {
        "schema_version": SCHEMA_VERSION,
        "kind": "sweep",
        "meta": {"scenario": "s", "block_size": 16, "max_len": 2048, "reserve": "max"},
        "points": points,
    }
    (run / "summary.json").write_text(json.dumps(document))
    return run


@pytest.fixture()
def wasteful(tmp_path):
    """A contiguous baseline that wastes most of its pool and OOMs at C=50, next to a healthy paged engine."""
    return write_run(
        tmp_path,
        "wasteful",
        [
            point("paged", 10),
            point(
                "contiguous",
                10,
                fragmentation_mean=0.76,
                peak_running=7,
                waste={
                    "token_state_pct": 18.0,
                    "reservation_pct": 52.0,
                    "internal_pct": 6.0,
                    "external_pct": 0.0,
                    "free_pct": 24.0,
                },
            ),
            point(
                "contiguous",
                50,
                status="oom",
                status_reason="12 request(s) rejected: oom",
                peak_running=7,
                rejected=12,
                fragmentation_mean=0.75,
            ),
        ],
    )


@pytest.fixture()
def healthy_run(tmp_path):
    return write_run(tmp_path, "healthy", [point("paged", 10), point("paged", 30)])


def test_check_exit_codes(wasteful, healthy_run, capsys):
    assert main(["diagnose", str(wasteful)]) == 0  # findings are reported; without --check, no failure
    out = capsys.readouterr().out
    assert "CRITICAL concurrency_capped" in out and "contiguous C=50" in out
    assert main(["diagnose", str(wasteful), "--check"]) == 1
    assert main(["diagnose", str(healthy_run), "--check"]) == 0
    assert "no findings" in capsys.readouterr().out
    assert main(["diagnose", str(healthy_run / "summary.json"), "--check"]) == 0  # the file itself works too


def test_json_output_carries_evidence_and_suggestions(wasteful, capsys):
    assert main(["diagnose", str(wasteful), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["fired"] is True and result["checked"] == 3
    assert result["thresholds"]["fragmentation"] == 0.3
    by_rule = {(f["rule"], f["source"]): f for f in result["findings"]}
    assert set(by_rule) == {
        ("fragmentation", "contiguous C=10"),
        ("reservation_waste", "contiguous C=10"),
        ("concurrency_capped", "contiguous C=10"),
        ("fragmentation", "contiguous C=50"),
        ("concurrency_capped", "contiguous C=50"),
    }
    assert result["findings"][0]["severity"] == "critical"  # most severe first
    frag = by_rule[("fragmentation", "contiguous C=10")]
    assert "0.760" in frag["evidence"] and "paged" in frag["suggestion"] and frag["values"]["threshold"] == 0.3


def test_thresholds_by_file_and_flags(wasteful, tmp_path, capsys):
    loose = tmp_path / "loose.toml"
    loose.write_text("fragmentation = 0.8\nreservation_waste = 0.9\n")
    assert main(["diagnose", str(wasteful), "--thresholds", str(loose), "--json"]) == 0
    rules = {f["rule"] for f in json.loads(capsys.readouterr().out)["findings"]}
    assert rules == {"concurrency_capped"}
    assert (
        main(
            [
                "diagnose",
                str(wasteful),
                "--threshold",
                "fragmentation=0.8",
                "--threshold",
                "reservation_waste=0.9",
                "--check",
                "--json",
            ]
        )
        == 1
    )  # the OOM still fires
    capsys.readouterr()
    assert main(["diagnose", str(wasteful), "--threshold", "fragmentation=2"]) == 2
    assert "between 0 and 1" in capsys.readouterr().err


def test_a_threshold_overrides_the_file(wasteful, tmp_path, capsys):
    """Defaults, then the file, then --threshold: the flag wins where both set a key, the file elsewhere."""
    path = tmp_path / "t.toml"
    path.write_text('[thresholds]\nfragmentation = 0.8\nreservation_waste = 0.9\nfor = "2m"\n')
    args = ["diagnose", str(wasteful), "--thresholds", str(path), "--json"]
    assert main([*args, "--threshold", "fragmentation=0.5", "--threshold", "for=10m"]) == 0
    result = json.loads(capsys.readouterr().out)
    thresholds = result["thresholds"]
    assert (thresholds["fragmentation"], thresholds["reservation_waste"], thresholds["alert_for"]) == (0.5, 0.9, "10m")
    assert thresholds["free_blocks"] == 0.1  # neither sets it: the default
    assert {f["rule"] for f in result["findings"]} == {"fragmentation", "concurrency_capped"}


def test_every_threshold_is_a_key_with_its_default_in_the_help(tmp_path, capsys):
    """The help is drawn from the thresholds' descriptions: a threshold added without one shows up here."""
    from kvbench.commands.diagnose_cmd import HELP
    from kvbench.report.diagnose.thresholds import KEYS

    defaults = Thresholds()
    assert {d.name for d in KEYS.values()} == {f.name for f in fields(Thresholds)}
    assert main(["diagnose", "--help"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    keys = ", ".join(KEYS)
    assert keys in " ".join(HELP.split()) and keys in out
    assert keys.startswith("fragmentation, ") and keys.endswith(", for")
    for key, described in KEYS.items():
        assert described.means and described.unit, key
        default = getattr(defaults, described.name)
        shown = f"{key}={default:g}" if isinstance(default, float) else f"{key}={default}"
        assert shown in out, shown
        args = ["--threshold", f"{key}={default}"]
        assert main(["diagnose", *args, "--emit-prometheus-rules", str(tmp_path / "rules.yml")]) == 0, key
    capsys.readouterr()


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["fragmentation"], "--threshold fragmentation: expected KEY=VALUE"),
        (["=0.2"], "--threshold =0.2: expected KEY=VALUE"),
        (["nope=1"], "--threshold nope=1: unknown key 'nope'; known: fragmentation, free_blocks, "),
        (["fragmentation=abc"], "--threshold fragmentation=abc: 'abc' is not a number"),
        (["fragmentation="], "'' is not a number"),
        (["fragmentation=2"], "threshold fragmentation: 2.0 is a share, between 0 and 1"),
        (["free_blocks=-0.1"], "non-negative"),
        (["alloc_latency_p99_ms=nan"], "threshold alloc_latency_p99_ms: nan must be a finite"),
        (["alloc_latency_p99_ms=inf"], "threshold alloc_latency_p99_ms: inf must be a finite"),
        (["for=5x"], "threshold for: '5x' is not a Prometheus duration"),
        (["alert_for=5m"], "unknown key 'alert_for'"),
        (["fragmentation=0.2", "fragmentation=0.4"], "--threshold fragmentation=0.4: fragmentation given twice"),
    ],
)
def test_a_bad_threshold_is_one_line_and_exit_2(healthy_run, values, message, capsys):
    args = [arg for value in values for arg in ("--threshold", value)]
    assert main(["diagnose", str(healthy_run), *args]) == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err and captured.out == ""


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "nothing to diagnose"),
        (["missing-dir"], "no such run directory"),
        (["x", "--metrics-url", "http://127.0.0.1:1/metrics"], "not both"),
        (["--metrics-url", "ftp://host/metrics"], "expected http://"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, capsys):
    assert main(["diagnose", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_live_endpoint(capsys):
    metrics = KvMetrics(device="cpu")
    scheduler = Scheduler(PagedManager(BlockPool(4, 4)))
    for i in range(3):
        scheduler.add(Request(i, 7, 4))
    scheduler.admit(0)  # 2 requests take 4 of 4 blocks, one waits
    for request in scheduler.running.values():
        request.output_token_ids.append(1)
    metrics.observe("paged", scheduler)
    with metrics:
        url = f"http://127.0.0.1:{metrics.serve('127.0.0.1', 0)}/metrics"
        assert main(["diagnose", "--metrics-url", url, "--check", "--json"]) == 1
        result = json.loads(capsys.readouterr().out)
        assert result["source"] == url and result["checked"] == 1
        assert {f["rule"] for f in result["findings"]} == {"free_blocks", "concurrency_capped"}
        assert all(f["source"] == "kvbench device=cpu engine=paged" for f in result["findings"])
        assert main(["diagnose", "--metrics-url", url, "--threshold", "free_blocks=0", "--check"]) == 0
    with socket.socket() as probe:  # a port nobody listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    assert main(["diagnose", "--metrics-url", f"http://127.0.0.1:{port}/metrics"]) == 2
    assert "cannot scrape" in capsys.readouterr().err


def test_emit_prometheus_rules(tmp_path, wasteful, capsys):
    path = tmp_path / "kvbench.rules.yml"
    args = ["--threshold", "fragmentation=0.25", "--threshold", "for=10m"]
    assert main(["diagnose", "--emit-prometheus-rules", str(path), *args]) == 0
    text = path.read_text()
    assert "kvbench_kv_cache_fragmentation > 0.25" in text and "for: 10m" in text
    assert main(["diagnose", str(wasteful), "--emit-prometheus-rules", str(path), "--check"]) == 1  # both at once
    import yaml

    rules = yaml.safe_load(path.read_text())["groups"][0]["rules"]
    assert {r["alert"] for r in rules} >= {
        "KvCacheFragmentationHigh",
        "KvCacheFreeBlocksLow",
        "KvBlockAllocLatencyHigh",
    }
    assert main(["diagnose", "--emit-prometheus-rules", str(path), "--threshold", "for=soon"]) == 2


def test_a_run_whose_points_all_failed_fails_the_check(tmp_path, capsys):
    run = write_run(
        tmp_path,
        "failed",
        [
            point("paged", 10, status="error", error="RuntimeError: boom"),
            point("contiguous", 10, status="error", error="RuntimeError: boom"),
        ],
    )
    assert main(["diagnose", str(run), "--check"]) == 1
    out = capsys.readouterr().out
    assert "CRITICAL point_failed" in out and "RuntimeError: boom" in out


PROMTOOL = shutil.which("promtool")


@pytest.mark.skipif(PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed")
def test_promtool_accepts_the_exposition_and_the_rules(tmp_path):
    """What kvbench writes passes Prometheus' own linters: metric names and types, and the alerting rules."""
    manager = PagedManager(BlockPool(16, 4))
    scheduler = Scheduler(manager)
    scheduler.add(Request(0, 5, 3))
    scheduler.admit(0)
    metrics = KvMetrics(device="cpu")
    metrics.begin_run("paged")
    metrics.alloc_observer("paged")(0.001)
    metrics.observe("paged", scheduler)
    exposition = metrics.exposition()
    checked = subprocess.run([PROMTOOL, "check", "metrics"], input=exposition, capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    rules = tmp_path / "kvbench.rules.yml"
    assert main(["diagnose", "--emit-prometheus-rules", str(rules)]) == 0
    checked = subprocess.run([PROMTOOL, "check", "rules", str(rules)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_a_vllm_server(metrics_server, vllm_exposition, capsys):
    """A vLLM endpoint (recorded text, served on 127.0.0.1) is diagnosed with vLLM's options in the advice."""
    server = metrics_server.serve([vllm_exposition(usage=0.96, waiting=7, waiting_capacity=7)])
    assert main(["diagnose", "--metrics-url", server.url, "--check", "--json"]) == 1
    result = json.loads(capsys.readouterr().out)
    assert {f["rule"] for f in result["findings"]} == {"free_blocks", "concurrency_capped"}
    assert all(
        f["family"] == "vllm" and "--gpu-memory-utilization (now 0.92)" in f["suggestion"] for f in result["findings"]
    )
    assert {n["rule"] for n in result["not_evaluated"]} == {"fragmentation", "alloc_latency", "reservation_waste"}
    assert any(m["estimate"] for m in result["measurements"])
    server.serve([vllm_exposition()])  # the recorded busy server: healthy
    assert main(["diagnose", "--metrics-url", server.url, "--check"]) == 0
    out = capsys.readouterr().out
    assert "no findings" in out and "not evaluated fragmentation" in out and "estimate" in out


@pytest.mark.parametrize(
    ("body", "content_type", "status", "message"),
    [
        ("<!doctype html><html><body>Welcome</body></html>", "text/html", 200, "returned an HTML page"),
        ("<html><body>Not Found</body></html>", "text/html", 404, "HTTP 404"),
        ('{"detail": "Not Found"}', "application/json", 200, "not Prometheus exposition text"),
        (
            "# HELP python_info x\n# TYPE python_info gauge\npython_info 1\n",
            "text/plain",
            200,
            "none of the metric families kvbench reads",
        ),
    ],
)
def test_a_url_that_is_not_an_engines_metrics_is_one_line_and_exit_2(
    metrics_server, body, content_type, status, message, capsys
):
    server = metrics_server.serve([body], content_type, status)
    assert main(["diagnose", "--metrics-url", server.url]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err


def test_a_timeline_file_that_is_not_jsonl(tmp_path, capsys):
    bad = tmp_path / "timeline.jsonl"
    bad.write_text("kv usage went up\n")
    assert main(["diagnose", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "not valid JSON" in err and len(err.splitlines()) == 1
