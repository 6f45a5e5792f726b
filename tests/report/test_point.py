"""Points of the results schema: the JSON form, failed points and the aggregation of repeats."""

import json
from pathlib import Path

import pytest
from scipy import stats

from kvbench.results.point import Point, aggregate_repeats, t95
from kvbench.results.schema import HINDSIGHT_FIELDS, LATENCY_FIELDS, OUTPUT_LENGTH_FIELDS, POINT_FIELDS, STEADY_FIELDS


def _point(**changes) -> Point:
    point = Point(
        "paged",
        10,
        "s",
        completed=10,
        output_throughput=10.0,
        peak_running=3,
        waste={"token_state_pct": 50.0},
        fragmentation_mean=0.1,
        memory={"rss_peak_bytes": 100, "nvml_used_peak_bytes": None},
    )
    point.latencies["p90_ttft_ms"] = 5.0
    for name, value in changes.items():
        if name in LATENCY_FIELDS:
            point.latencies[name] = value
        else:
            setattr(point, name, value)
    return point


def test_the_json_form_flattens_latencies_and_leaves_out_unset_reasons():
    data = _point().to_json()
    assert set(POINT_FIELDS) | set(STEADY_FIELDS) | set(OUTPUT_LENGTH_FIELDS) <= set(data)
    assert data["p90_ttft_ms"] == 5.0 and "latencies" not in data and "extra" not in data
    assert "error" not in data and "status_reason" not in data
    assert list(data)[:4] == ["engine", "concurrency", "scenario", "status"]
    failed = Point.failed("contiguous", 2, "s", "RuntimeError: boom").to_json()
    assert failed["status"] == "error" and failed["error"] == "RuntimeError: boom" and failed["completed"] == 0


def test_a_point_read_back_from_its_json_is_the_same_point():
    point = _point(p99_tpot_ms=0.7, status_reason="oom: the slab did not fit")
    point.extra.update(output_throughput_ci95=1.5, waterfall={"levels": [1, 2]})
    data = point.to_json()
    back = Point.from_json(data)
    assert back == point and back.to_json() == data
    assert back.ci95("output_throughput") == 1.5 and back.ci95("p99_ttft_ms") is None
    older = {key: value for key, value in data.items() if key not in ("cpu_time_s", "p99_tpot_ms")}
    assert Point.from_json(older).cpu_time_s is None and Point.from_json(older).latencies["p99_tpot_ms"] is None


def test_repeats_average_metrics_keep_the_worst_status_and_maximise_peaks():
    a = _point()
    b = _point(
        status="oom",
        status_reason="2 request(s) rejected",
        output_throughput=20.0,
        p90_ttft_ms=7.0,
        peak_running=5,
        waste={"token_state_pct": 60.0},
        fragmentation_mean=0.3,
        memory={"rss_peak_bytes": 300, "nvml_used_peak_bytes": None},
    )
    merged = aggregate_repeats([b, a]).to_json()
    assert merged["status"] == "oom" and merged["status_reason"] == "2 request(s) rejected"
    assert merged["output_throughput"] == 15.0 and merged["samples"]["output_throughput"] == [20.0, 10.0]
    assert merged["p90_ttft_ms"] == 6.0 and "p90_ttft_ms_ci95" in merged  # every latency field, not only a few
    assert merged["peak_running"] == 5 and merged["memory"]["rss_peak_bytes"] == 300
    assert merged["memory"]["nvml_used_peak_bytes"] is None
    assert merged["waste"]["token_state_pct"] == 55.0 and merged["fragmentation_mean"] == pytest.approx(0.2)
    assert merged["completed"] == 10 and isinstance(merged["completed"], int) and merged["repeats"] == 2
    assert aggregate_repeats([a]) is a


@pytest.mark.parametrize("n", [2, 3, 10, 11, 30])
def test_t_quantiles_are_students(n):
    assert t95(n) == pytest.approx(stats.t.ppf(0.975, n - 1))
    assert t95(2) == pytest.approx(12.706, abs=1e-3)


def test_points_carry_steady_figures_output_lengths_and_the_hindsight_bound():
    from kvbench.engine.config import EngineConfig
    from kvbench.engine.request import Request
    from kvbench.engine.simulator import simulate
    from kvbench.engine.timing import UniformTiming
    from kvbench.results.point import point_from_result

    config = EngineConfig(engine="contiguous", block_size=1, num_blocks=200, max_len=32)
    requests = [Request(i, 4, 28, eos_after=e) for i, e in enumerate([2, 6, 3, 10, 5, 4])]
    result = simulate(requests, config.build_manager(), UniformTiming(1.0), 3, config)
    point = point_from_result(result, "contiguous", 3, "s", bytes_per_token=10).to_json()
    assert point["output_len_max"] == 10 and point["output_len_mean"] == pytest.approx(30 / 6)
    assert point["stopped_at_eos"] == 6 and sum(point["output_len_hist"]["counts"]) == 6
    assert point["steady_output_throughput"] > 0 and 0 < point["steady_window_pct"] <= 100
    # slabs of max-len 32 for requests that end at 5-13 tokens: the oracle bound is far below what was held
    assert point["kv_hindsight_oracle_peak_bytes"] < point["kv_peak_allocated_bytes"] / 2
    paged = point_from_result(result, "paged", 3, "s", bytes_per_token=10).to_json()
    assert "kv_hindsight_oracle_peak_bytes" not in paged
    # vllm bench serve's totals: tokens of the completed requests, and the run's duration
    assert point["total_input_tokens"] == 6 * 4 and point["total_output_tokens"] == 30
    assert point["duration"] == point["elapsed_s"] > 0
    assert point["output_throughput"] == pytest.approx(point["total_output_tokens"] / point["duration"])


def test_repeats_average_the_steady_figures():
    runs = [_point(steady_output_throughput=v, steady_window_s=1.0, steady_window_pct=50.0) for v in (10.0, 20.0)]
    merged = aggregate_repeats(runs).to_json()
    assert merged["steady_output_throughput"] == pytest.approx(15.0)


def test_a_contiguous_point_of_the_shipped_sweep_carries_the_hindsight_bound_the_schema_lists():
    summary = json.loads((Path(__file__).parents[2] / "reports/baseline/sweep/summary.json").read_text())
    contiguous = [p for p in summary["points"] if p["engine"] == "contiguous" and p["status"] == "ok"]
    assert contiguous and all(set(HINDSIGHT_FIELDS) <= set(p) for p in contiguous)
