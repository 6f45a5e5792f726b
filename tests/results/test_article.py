"""The article table's typed rows: built from a sweep's points, and summary.json's flat form kept key for key."""

from __future__ import annotations

import json

import pytest

from kvbench.results.article import ArticleRow, article_rows

MiB = 1 << 20


def _point(engine: str, concurrency: int, status: str = "ok", tps: float = 100.0, peak: int = 10 * MiB, **extra):
    return {
        "engine": engine,
        "concurrency": concurrency,
        "status": status,
        "output_throughput": tps,
        "steady_output_throughput": tps * 1.1,
        "kv_peak_allocated_bytes": peak,
        **extra,
    }


def test_rows_compare_paged_with_contiguous_only_where_both_ran_their_whole_load():
    points = [
        _point("paged", 10, tps=110.0, peak=4 * MiB),
        _point("contiguous", 10),
        _point("paged", 50, peak=6 * MiB),
        _point("contiguous", 50, "oom", tps=20.0),
        _point("vllm", 50, tps=300.0, output_throughput_ci95=4.0),
    ]
    ten, fifty = article_rows(points)
    assert ten.gain_pct == pytest.approx(10.0) and ten.kv_memory_reduction_pct == pytest.approx(60.0)
    assert fifty.gain_pct is None and fifty.status("contiguous") == "oom" and fifty.status("vllm") == "ok"
    assert fifty.figures("vllm").tps_ci95 == 4.0 and fifty.figures("vllm").steady_tps is None
    assert not ten.repeated and fifty.repeated


def test_the_json_form_keeps_the_keys_and_their_order_summary_json_always_had():
    legacy = {
        "concurrency": 50,
        "contiguous_tps": 20.0,
        "contiguous_status": "oom",
        "paged_tps": 100.0,
        "paged_status": "ok",
        "gain_pct": None,
        "kv_memory_reduction_pct": None,
        "paged_over_contiguous_tps": None,
        "contiguous_tps_ci95": None,
        "contiguous_steady_tps": 22.0,
        "paged_tps_ci95": None,
        "paged_steady_tps": 110.00000000000001,
        "vllm_status": "ok",
        "vllm_tps": 300.0,
        "vllm_tps_ci95": 4.0,
    }
    points = [
        _point("paged", 50),
        _point("contiguous", 50, "oom", tps=20.0),
        _point("vllm", 50, tps=300.0, output_throughput_ci95=4.0),
    ]
    (row,) = article_rows(points)
    assert json.dumps(row.to_json()) == json.dumps(legacy)
    assert ArticleRow.from_json(legacy) == row
    one_engine = ArticleRow.from_json({"concurrency": 4, "paged_status": "ok", "paged_tps": 5.0})
    assert one_engine.status("contiguous") is None and one_engine.to_json()["contiguous_tps"] is None
