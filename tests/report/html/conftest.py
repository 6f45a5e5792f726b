"""Runs of every kind, made once per test session through the command line, for the report tests."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from unittest import mock

import pytest

from kvbench.cli import main

QUICK_SCENARIO = """
description = "test: tiny and quick"
max_len = 64
mean_len = 16
distribution = "uniform"
sigma = 0.5
prompt_ratio = 0.5
requests = 6
warmup = 1
concurrency = [2, 4]
block_size = 4
reserve = "max"
admission = "queue"

[budget]
slots = 160
"""


@pytest.fixture(scope="session")
def runs_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("report-runs")


def _run(argv: list[str]) -> None:
    """A run as a user makes it: report.html written at its end (tests/conftest.py turns that off elsewhere)."""
    with mock.patch.dict(os.environ, {"KVBENCH_REPORT": "1"}):
        code = main(argv)
    assert code == 0, f"kvbench {' '.join(argv)} exited {code}"


@pytest.fixture(scope="session")
def sweep_run(runs_root) -> Path:
    """A short sweep of the tiny model on the CPU: two engines at C=2 and C=4."""
    scenario = runs_root / "quick.toml"
    scenario.write_text(QUICK_SCENARIO)
    out = runs_root / "sweep"
    _run(["sweep", "--scenario", str(scenario), "--out", str(out), "--json"])
    return out


@pytest.fixture(scope="session")
def oom_sweep_run(runs_root) -> Path:
    """A simulated sweep in which the contiguous baseline runs out of KV memory at the top concurrency."""
    out = runs_root / "sweep-sim"
    _run(["sweep", "--simulate", "--requests", "60", "--concurrency", "10,50", "--out", str(out), "--json"])
    return out


@pytest.fixture(scope="session")
def waste_run(runs_root) -> Path:
    out = runs_root / "waste"
    _run(["waste", "--requests", "200", "--block-size", "8,16", "--out", str(out), "--json"])
    return out


@pytest.fixture(scope="session")
def fleet_run(runs_root) -> Path:
    out = runs_root / "fleet"
    _run(
        [
            "fleet",
            "--simulate",
            "--instances",
            "2",
            "--rate",
            "20",
            "--requests",
            "120",
            "--tick",
            "0.5",
            "--policies",
            "round-robin,most-free-blocks",
            "--out",
            str(out),
            "--json",
        ]
    )
    return out


@pytest.fixture(scope="session")
def share_run(runs_root) -> Path:
    out = runs_root / "share"
    _run(
        [
            "share",
            "--n",
            "2",
            "--requests",
            "2",
            "--prompt-len",
            "16",
            "--output-len",
            "8",
            "--out",
            str(out),
            "--json",
        ]
    )
    return out


@pytest.fixture(scope="session")
def dataset_run(runs_root) -> Path:
    out = runs_root / "dataset"
    _run(["dataset", "real-chat", "--out", str(out), "--json"])
    return out


@pytest.fixture(scope="session")
def reuse_run(runs_root) -> Path:
    out = runs_root / "reuse"
    _run(["reuse", "--max-requests", "200", "--points", "5", "--out", str(out), "--json"])
    return out


@pytest.fixture(scope="session")
def endpoint_run(runs_root) -> Path:
    """A server sweep (``sweep --target``) against the endpoint tests' fake server, on 127.0.0.1."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "endpoint"))
    from fake_server import serve_in_thread

    out = runs_root / "endpoint"
    with serve_in_thread(itl_s=0.002) as server:
        _run(
            [
                "sweep",
                "--target",
                f"fake={server.url}",
                "--concurrency",
                "1,4",
                "--requests",
                "8",
                "--input-len",
                "32",
                "--output-len",
                "16",
                "--scrape-interval",
                "0.05",
                "--out",
                str(out),
                "--json",
            ]
        )
    return out


@pytest.fixture(scope="session")
def regressed_head(runs_root, sweep_run) -> Path:
    """The sweep's summary with one deterministic count changed: compare calls it a regression."""
    head = runs_root / "sweep-head"
    head.mkdir()
    summary = json.loads((sweep_run / "summary.json").read_text())
    point = next(p for p in summary["points"] if p["engine"] == "paged" and p["concurrency"] == 4)
    point["completed"] -= 1
    point["output_throughput"] *= 0.8
    (head / "summary.json").write_text(json.dumps(summary))
    return head


@pytest.fixture(scope="session")
def compare_report(runs_root, sweep_run, regressed_head) -> Path:
    path = runs_root / "compare" / "report.html"
    path.parent.mkdir()  # a single output file's folder must exist
    assert main(["compare", str(sweep_run), str(regressed_head), "--html", str(path)]) == 1  # a regression
    return path


@pytest.fixture()
def copy_run(tmp_path):
    """``copy_run(run)``: a copy of a session run directory to edit without touching the shared one."""

    def copy(run: Path) -> Path:
        target = tmp_path / run.name
        shutil.copytree(run, target)
        return target

    return copy
