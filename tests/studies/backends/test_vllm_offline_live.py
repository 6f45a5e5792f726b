"""Opt-in: the vLLM backend driving a real vLLM offline engine in this Python.

Runs only when ``KVBENCH_VLLM_MODEL`` names a local checkpoint directory and ``vllm`` imports here (vLLM pins
its own torch and transformers, so this usually means running the tests from vLLM's virtual environment with
kvbench installed there); skips otherwise. It builds an ``LLM`` (tens of seconds on a CPU).
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from kvbench.engine.config import EngineConfig
from kvbench.engine.load_pattern import ClosedLoop
from kvbench.engine.request import RequestStatus
from kvbench.results.point import point_from_result
from kvbench.studies.backends.vllm_offline import VllmBackend, vllm_settings
from kvbench.studies.run_requests import token_requests

MODEL = os.environ.get("KVBENCH_VLLM_MODEL")

pytestmark = pytest.mark.skipif(
    not (MODEL and Path(MODEL).is_dir() and importlib.util.find_spec("vllm") is not None),
    reason="opt-in: set KVBENCH_VLLM_MODEL to a checkpoint directory and run where vllm is installed",
)


def test_a_real_vllm_engine_under_kvbenchs_closed_loop():
    from kvbench.models.resolve import resolve_model

    shape = resolve_model(MODEL).with_dtype("fp32")
    base = EngineConfig(block_size=32, num_blocks=64, max_len=512, max_num_seqs=16)
    settings = vllm_settings(MODEL, "fp32", "cpu", base, shape.bytes_per_token, seed=0)
    backend = VllmBackend(settings, base, shape.bytes_per_token)
    try:
        backend.warm_up("vllm", token_requests([(8, 4), (8, 4)], shape.vocab_size, 1))
        pairs = [(40, 12), (90, 6), (25, 16), (60, 9), (33, 11)]
        requests = token_requests(pairs, shape.vocab_size, 0)
        result, _ = backend.run("vllm", requests, ClosedLoop(2), None)
    finally:
        backend.close()
    assert all(r.status is RequestStatus.FINISHED for r in requests)
    assert [r.num_outputs for r in requests] == [o for _, o in pairs]
    assert result.peak_running <= 2
    point = point_from_result(result, "vllm", 2, "live", shape.bytes_per_token)
    assert point.extra["kv_usage_source"] == "vLLM scheduler stats"
    assert point.extra["reference"]["block_size"] == 32
    assert point.kv_peak_allocated_bytes > 0 and 0 < point.fragmentation_mean < 1
    assert point.output_throughput > 0
    assert point.latencies["p50_ttft_ms"] > 0
