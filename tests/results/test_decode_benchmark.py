"""``kvbench kernels``' result typed: its JSON output written and read back key for key."""

from __future__ import annotations

import json

import pytest

from kvbench.results.decode_benchmark import DecodeBenchmark, DecodePoint

WRITTEN = {  # as kvbench kernels --json printed it on a CPU (one measured point, one skipped)
    "benchmark": "paged_decode_attention",
    "device": "cpu",
    "device_name": "cpu",
    "backend": "torch",
    "dtype": "fp32",
    "model": "tiny",
    "num_heads": 4,
    "num_kv_heads": 2,
    "head_dim": 16,
    "block_size": 16,
    "copy_bandwidth_gbps": None,
    "native_build": None,
    "torch_version": "2.13.0+cpu",
    "points": [
        {
            "batch": 1,
            "context": 16,
            "status": "ok",
            "paged_ms": 13.950209500762867,
            "contiguous_ms": 17.778615499992156,
            "paged_over_contiguous": 0.7846623096589845,
            "paged_gbps": 0.00033031761994312787,
            "contiguous_gbps": 0.00025918778658563335,
            "pct_of_copy_bandwidth": None,
            "reference_gbps": 1.679298013165053,
            "pct_of_read_bandwidth": 0.019669999,
            "num_splits": None,
        },
        {
            "batch": 64,
            "context": 4096,
            "status": "skipped: needs ~9.8 GiB, 7.1 free",
            "paged_ms": None,
            "contiguous_ms": None,
            "paged_over_contiguous": None,
            "paged_gbps": None,
            "contiguous_gbps": None,
            "pct_of_copy_bandwidth": None,
            "reference_gbps": None,
            "pct_of_read_bandwidth": None,
            "num_splits": None,
        },
    ],
}


def test_the_json_output_round_trips_byte_for_byte():
    result = DecodeBenchmark.from_json(WRITTEN)
    assert json.dumps(result.to_json()) == json.dumps(WRITTEN)
    assert result.on_cpu and [p.ok for p in result.points] == [True, False]
    assert result.points[0].paged_ms == pytest.approx(13.95, abs=1e-3) and result.points[1].paged_ms is None


def test_a_skipped_point_holds_only_its_shape_and_why():
    point = DecodePoint(64, 4096, "skipped: needs ~9.8 GiB, 7.1 free")
    assert point.to_json() == WRITTEN["points"][1]
    assert DecodePoint.from_json({"batch": 1, "context": 2, "status": "ok"}) == DecodePoint(1, 2, "ok")


def test_an_older_result_without_its_newer_fields_still_reads():
    older = {k: v for k, v in WRITTEN.items() if k not in ("benchmark", "native_build", "torch_version")}
    result = DecodeBenchmark.from_json(older)
    assert result.benchmark == "paged_decode_attention" and result.native_build is None
    assert result.torch_version == ""
