"""A point's server figures from its scrapes: gauges over the load, counters as differences."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.endpoint.scraper import Scrape
from kvbench.endpoint.server_metrics import kv_usage, point_server_metrics, timeline_rows
from kvbench.results.servers import ServerState, read_states

RECORDED = Path(__file__).parents[1] / "report" / "diagnose" / "data"


def vllm_recorded(name: str) -> str:
    return (RECORDED / f"vllm_metrics_{name}.txt").read_text()


def vllm(
    usage,
    running,
    waiting=0.0,
    preemptions=0.0,
    queries=0.0,
    hits=0.0,
    gen=0.0,
    ttft_sum=0.0,
    ttft_count=0.0,
    engine="0",
    blocks=100.0,
):
    return ServerState(
        "vllm",
        {"engine": engine},
        total_blocks=blocks,
        usage=usage,
        running=running,
        waiting=waiting,
        preemptions=preemptions,
        prefix_queries=queries,
        prefix_hits=hits,
        generation_tokens=gen,
        ttft_sum_s=ttft_sum,
        ttft_count=ttft_count,
    )


def test_gauges_over_the_load_and_counters_from_before_to_after():
    scrapes = [
        Scrape(-0.1, [vllm(0.0, 0, preemptions=3, queries=1000, hits=900, gen=50, ttft_sum=1.0, ttft_count=10)]),
        Scrape(0.2, [vllm(0.40, 4, waiting=2, preemptions=3, queries=1200, hits=900)]),
        Scrape(0.7, [vllm(0.80, 4, waiting=6, preemptions=5, queries=1500, hits=1000)]),
        Scrape(1.2, error="cannot scrape http://x/metrics: HTTP 503"),
        Scrape(1.7, [vllm(0.30, 2, waiting=0, preemptions=7, queries=1600, hits=1100)]),
        Scrape(2.1, [vllm(0.0, 0, preemptions=7, queries=1600, hits=1100, gen=450, ttft_sum=3.0, ttft_count=20)]),
    ]
    out = point_server_metrics(scrapes, load_end_s=2.0)
    assert (out.scrapes, out.scrapes_failed, out.scrapes_during_load) == (6, 1, 3)
    assert out.scrape_errors == ["cannot scrape http://x/metrics: HTTP 503"]
    assert out.kv_usage_peak == 0.8 and out.kv_usage_mean == pytest.approx(0.5)
    assert (out.running_peak, out.running_mean) == (4, pytest.approx(10 / 3))
    assert (out.waiting_peak, out.waiting_mean) == (6, pytest.approx(8 / 3))
    assert out.preemptions == 4 and out.prefix_cache_queries == 600 and out.prefix_cache_hits == 200
    assert out.prefix_cache_hit_rate == pytest.approx(1 / 3)
    assert out.server_generation_tokens == 400
    assert out.server_ttft_count == 10 and out.server_mean_ttft_ms == pytest.approx(200.0)
    assert out.counters_window_s == pytest.approx(2.2) and out.notes == []


def test_a_counter_that_went_down_is_unknown_not_negative():
    scrapes = [
        Scrape(-0.1, [vllm(0, 0, preemptions=9, queries=500, hits=100)]),
        Scrape(0.5, [vllm(0.5, 1, preemptions=1, queries=50, hits=10)]),
    ]
    out = point_server_metrics(scrapes, load_end_s=1.0)
    assert out.preemptions is None and out.prefix_cache_hit_rate is None
    assert any("went down" in note for note in out.notes)
    assert "no scrape after the load: counters end at the last scrape during it" in out.notes


def test_too_few_scrapes_leave_everything_unknown():
    out = point_server_metrics([Scrape(0.0, error="gone"), Scrape(1.0, error="gone")], load_end_s=1.0)
    assert out.kv_usage_peak is None and out.preemptions is None and out.server_mean_ttft_ms is None
    assert out.scrapes_failed == 2 and "too few successful scrapes" in out.notes[0]


def test_several_engines_add_up():
    states = [vllm(0.5, 2, engine="0", blocks=100), vllm(1.0, 3, engine="1", blocks=300)]
    assert kv_usage(states) == pytest.approx((50 + 300) / 400)
    out = point_server_metrics(
        [Scrape(-0.1, [vllm(0, 0, engine="0"), vllm(0, 0, engine="1")]), Scrape(0.5, states)], load_end_s=1.0
    )
    assert out.running_peak == 5 and len(out.engines) == 2


def test_sglang_reports_its_own_hit_rate():
    sglang = [
        ServerState("sglang", {}, usage=0.2, running=3, prefix_hit_rate=0.25),
        ServerState("sglang", {}, usage=0.3, running=3, prefix_hit_rate=0.35),
    ]
    out = point_server_metrics([Scrape(-0.1, [sglang[0]]), Scrape(0.3, [sglang[0]]), Scrape(0.6, [sglang[1]])], 1.0)
    assert out.prefix_cache_hit_rate == pytest.approx(0.30) and out.families == ["sglang"]
    assert any("as the server reports it" in note for note in out.notes)


def test_recorded_vllm_text_gives_the_ttft_histogram_and_token_counters():
    (idle,) = read_states(vllm_recorded("idle"))
    (after,) = read_states(vllm_recorded("after"))
    assert (after.ttft_count, after.generation_tokens, after.prompt_tokens) == (9, 520, 149)
    out = point_server_metrics([Scrape(-0.1, [idle]), Scrape(5.0, [after])], load_end_s=4.0)
    assert out.server_mean_ttft_ms == pytest.approx(3.9395558834075928 / 9 * 1000)
    assert out.server_generation_tokens == 520 and out.server_prompt_tokens == 149


def test_timeline_rows():
    rows = timeline_rows([Scrape(0.0, [vllm(0.25, 1, preemptions=2)]), Scrape(0.5, error="x")])
    assert rows[0]["kv_usage"] == 0.25 and rows[0]["running"] == 1 and rows[0]["preemptions"] == 2
    assert rows[1] == {"elapsed_s": 0.5, "error": "x"}
