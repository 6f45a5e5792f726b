"""The tables of an endpoint run: KV usage in % of the server's cache, a level as C= or req/s, '-' for what a
server does not expose (never 0), and the find-max rows."""

from __future__ import annotations

from kvbench.report.endpoint_report import POINT_TABLE, find_max_rows, findings, level_text, ordered, reuse_lines
from kvbench.results.endpoint_timeline import EndpointTimeline
from kvbench.results.find_max_search import Search
from kvbench.results.point import Point

COLUMNS = [c.heading for c in POINT_TABLE.columns]


def point_row(point):
    return POINT_TABLE.row(point)


def _point(**extra):
    base = {
        "engine": "vllm",
        "concurrency": 8,
        "status": "ok",
        "completed": 40,
        "failed": 0,
        "output_throughput": 1234.4,
        "request_throughput": 2.5,
        "request_goodput": 2.0,
        "p50_ttft_ms": 12.0,
        "p99_ttft_ms": 40.0,
        "p50_tpot_ms": 3.0,
        "p99_tpot_ms": 5.5,
        "p50_e2el_ms": 300.0,
        "kv_usage_peak": 0.973,
        "kv_usage_mean": 0.614,
        "preemptions": 3,
        "peak_running": 8,
        "waiting_peak": 2,
        "prefix_cache_hit_rate": 0.25,
        "endpoint": {"url": "http://127.0.0.1:8000"},
    }
    return Point.from_json({**base, **extra})


def test_a_row_shows_kv_usage_in_percent_and_the_share_meeting_the_slo():
    row = dict(zip(COLUMNS, point_row(_point()), strict=True))
    assert row["load"] == "C=8" and row["done/fail"] == "40/0" and row["out TPS"] == "1,234"
    assert row["KV % peak/mean"] == "97/61" and row["SLO met"] == "80%" and row["preempt"] == "3"
    assert row["run/wait"] == "8/2" and row["prefix hit %"] == "25"


def test_what_a_server_does_not_expose_is_a_dash_never_zero():
    row = dict(
        zip(
            COLUMNS,
            point_row(
                _point(
                    kv_usage_peak=None,
                    kv_usage_mean=None,
                    preemptions=None,
                    peak_running=None,
                    waiting_peak=None,
                    prefix_cache_hit_rate=None,
                    request_goodput=None,
                )
            ),
            strict=True,
        )
    )
    assert row["KV % peak/mean"] == "-/-" and row["preempt"] == "-" and row["run/wait"] == "-/-"
    assert row["prefix hit %"] == "-" and row["SLO met"] == "-"


def test_rate_points_are_ordered_and_labelled_by_rate():
    points = [_point(engine="b", concurrency=0, request_rate=4.0), _point(engine="a", concurrency=0, request_rate=0.5)]
    assert [level_text(p) for p in ordered(points)] == ["0.5 req/s", "4 req/s"]


def test_findings_name_the_best_point_and_where_the_cache_filled():
    points = [
        _point(concurrency=4, output_throughput=800.0, kv_usage_peak=0.5, preemptions=0),
        _point(concurrency=8),
        _point(concurrency=16, output_throughput=1100.0, kv_usage_peak=1.0),
    ]
    (line,) = findings(points)
    assert line == (
        "vllm: at most 1,234 output tok/s (at C=8); its KV cache was full (>= 95%) from C=8, preempting from C=8."
    )
    off = findings([_point(agreement={"output_tokens_client_over_server": 0.9})])
    assert any("0.900x the output tokens" in text for text in off)
    off = findings([_point(agreement={"input_tokens_client_over_server": 1.2})])
    assert any("1.200x the input tokens the server reports prefilling" in text for text in off)


def test_find_max_rows():
    search = {
        "engine": "vllm",
        "by": "concurrency",
        "best": 12.0,
        "first_miss": 13.0,
        "stopped": "bracket closed",
        "limit": {"kind": "kv_full", "evidence": "KV usage peaked at 100%", "suggestion": "more memory"},
    }
    row = ["vllm", "C=12", "C=13", "kv_full", "KV usage peaked at 100%", "more memory"]
    assert find_max_rows([Search.from_json(search)]) == [row]
    none = {**search, "by": "rate", "best": None, "first_miss": 0.5, "limit": None, "stopped": "even the lowest"}
    assert find_max_rows([Search.from_json(none)]) == [["vllm", "none", "0.5 req/s", "-", "even the lowest", "-"]]


def test_hits_above_the_empty_cache_ideal_say_they_came_from_earlier_points():
    """C=4 after C=1 on the same requests: the answers report 75% cached where an empty cache would serve 0%."""
    reuse = {"hit_rate_requests": 0.75, "hit_rate_counters": 0.75, "workload": {"ideal_hit_rate": 0.0}}
    (line,) = reuse_lines(_point(concurrency=4, prefix_reuse=reuse, cache_state="warm"))
    assert "an unbounded cache starting empty would serve 0.0%" in line
    assert "reused what earlier points left" in line
    (line,) = reuse_lines(_point(concurrency=4, prefix_reuse={**reuse, "hit_rate_requests": 0.0}, cache_state="reset"))
    assert "earlier points" not in line


def test_a_timeline_with_usage_but_no_waiting_series_still_draws(tmp_path):
    """A server whose /metrics has a KV usage gauge and no waiting gauge: the plot is drawn (it raised TypeError)."""
    from kvbench.report.endpoint_report import timeline_plot

    timeline = {
        "bin_s": 0.5,
        "client": {"t_s": [0.0, 0.5], "output_tokens_per_s": [10.0, 12.0]},
        "server": [{"elapsed_s": 0.1, "kv_usage": 0.3}, {"elapsed_s": 0.6, "kv_usage": 0.4}],
    }
    path = timeline_plot(EndpointTimeline.from_json(timeline), tmp_path / "timeline.png", "usage only")
    assert path.is_file() and path.stat().st_size > 0
