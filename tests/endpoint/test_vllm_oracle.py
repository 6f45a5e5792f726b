"""Opt-in: the client metrics equal what vLLM's own ``calculate_metrics`` makes of the same records.

Runs when ``KVBENCH_VLLM_PYTHON`` names a Python that imports vllm (no server, no model needed).
"""

from __future__ import annotations

import os
import subprocess

import pytest
from fake_server import serve_in_thread

from kvbench.endpoint.client import Target
from kvbench.endpoint.client_metrics import client_metrics
from kvbench.endpoint.load import ClosedLoop
from kvbench.endpoint.run_point import PointSettings, run_point_sync
from kvbench.endpoint.vllm_oracle import differences, vllm_metrics
from kvbench.endpoint.workloads import shared_prefix

PYTHON = os.environ.get("KVBENCH_VLLM_PYTHON")

pytestmark = pytest.mark.skipif(not PYTHON, reason="opt-in: set KVBENCH_VLLM_PYTHON")


def test_the_same_records_give_vllms_figures():
    if subprocess.run([PYTHON, "-c", "import vllm.benchmarks.serve"], capture_output=True, timeout=300).returncode:
        pytest.skip(f"{PYTHON} cannot import vllm's benchmarks")
    # uneven lengths (1-token answers have no TPOT), failures, and an SLO some requests miss
    workload = shared_prefix(groups=2, per_group=15, prefix_len=8, suffix_len=4, output_len=6, vocab_size=500, seed=0)
    workload = [c if c.index % 7 else type(c)(c.index, (type(c.turns[0])(c.turns[0].prompt, 1),)) for c in workload]
    with serve_in_thread(faults=["", "", "", "", "500"], ttft_s=0.01, itl_s=0.003) as server:
        point = run_point_sync(Target(server.url), workload, PointSettings(ClosedLoop(5), scrape=False))
    slo = {"ttft": point.metrics.latencies["median_ttft_ms"], "tpot": 1000.0}
    ours = client_metrics(point.records, point.duration_s, slo)
    assert ours["failed"] == 6 and 0 < ours["request_goodput"] < ours["request_throughput"]
    theirs = vllm_metrics(PYTHON, point.records, point.duration_s, slo)
    assert differences(ours, theirs) == {}
