"""Aggregation of repeated sweep points."""

from kvbench.report.points import aggregate_repeats


def test_repeats_average_metrics_keep_the_worst_status_and_maximise_peaks():
    a = {"engine": "paged", "concurrency": 10, "status": "ok", "completed": 10, "output_throughput": 10.0,
         "p90_ttft_ms": 5.0, "peak_running": 3, "waste": {"token_state_pct": 50.0},
         "memory": {"rss_peak_bytes": 100, "nvml_used_peak_bytes": None}, "fragmentation_mean": 0.1}
    b = {**a, "status": "oom", "status_reason": "2 request(s) rejected", "output_throughput": 20.0,
         "p90_ttft_ms": 7.0, "peak_running": 5, "waste": {"token_state_pct": 60.0},
         "memory": {"rss_peak_bytes": 300, "nvml_used_peak_bytes": None}, "fragmentation_mean": 0.3}
    merged = aggregate_repeats([b, a])
    assert merged["status"] == "oom" and merged["status_reason"] == "2 request(s) rejected"
    assert merged["output_throughput"] == 15.0 and merged["samples"]["output_throughput"] == [20.0, 10.0]
    assert merged["p90_ttft_ms"] == 6.0 and "p90_ttft_ms_ci95" in merged  # every latency field, not only a few
    assert merged["peak_running"] == 5 and merged["memory"]["rss_peak_bytes"] == 300
    assert merged["memory"]["nvml_used_peak_bytes"] is None
    assert merged["waste"]["token_state_pct"] == 55.0 and merged["fragmentation_mean"] == 0.2
    assert merged["completed"] == 10 and isinstance(merged["completed"], int) and merged["repeats"] == 2
    assert aggregate_repeats([a]) is a
