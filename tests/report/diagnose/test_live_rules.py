"""The rules over a live vLLM / SGLang server: what fires, what cannot be judged, and remedies in its own words."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.report.diagnose import Thresholds, Window, diagnose_states, diagnose_windows, read_states

DATA = Path(__file__).parent / "data"
KVBENCH_FLAGS = ("--kv-memory", "--engines", "--reserve", "kvbench sweep")


def diagnose(text: str, **thresholds):
    return diagnose_states(read_states(text), Thresholds(**thresholds), "test")


def by_rule(diagnosis) -> dict:
    return {f.rule: f for f in diagnosis.findings}


def test_the_recorded_busy_server_is_healthy_and_says_what_it_cannot_judge(vllm_exposition):
    diagnosis = diagnose(vllm_exposition())
    assert not diagnosis.findings and not diagnosis.fired and diagnosis.checked == 1
    skipped = {n.rule: n.reason for n in diagnosis.not_evaluated}
    assert set(skipped) == {"fragmentation", "alloc_latency", "reservation_waste"}
    assert "vLLM exposes no fragmentation" in skipped["fragmentation"]
    measured = {m.name: m for m in diagnosis.measurements}
    estimate = measured["internal_waste_estimate"]
    assert estimate.estimate and "estimate" in estimate.text
    # 8 running requests x half a 128-token block = 512 slots of 181 x 128
    assert estimate.value == pytest.approx(512 / (181 * 128))
    assert "~512 token slots" in estimate.text and "8" in estimate.text
    assert not measured["kv_usage"].estimate and "173 of 181 blocks free" in measured["kv_usage"].text
    assert measured["prefix_cache_hit_rate"].value == 0.0
    assert diagnosis.as_dict()["measurements"] and diagnosis.as_dict()["not_evaluated"]


def test_free_blocks_low_names_vllm_options(vllm_exposition):
    finding = by_rule(diagnose(vllm_exposition(usage=0.95)))["free_blocks"]
    assert finding.family == "vllm" and finding.severity == "warning"
    assert "9 of 181 blocks free" in finding.evidence and "5.0%" in finding.evidence
    assert "--gpu-memory-utilization (now 0.92)" in finding.suggestion
    assert "--kv-cache-memory-bytes" in finding.suggestion and "--max-num-seqs" in finding.suggestion
    assert not any(flag in finding.suggestion for flag in KVBENCH_FLAGS)
    assert finding.remedies == ("more_kv_memory", "lower_concurrency", "route_to_free")


def test_preemption_storm(vllm_exposition):
    # 30 preemptions for 1 (stop) + 20 (length) finished requests
    finding = by_rule(diagnose(vllm_exposition(preemptions=30, finished=20)))["preemption_storm"]
    assert "30 preemptions for 21 finished" in finding.evidence and "since the engine started" in finding.evidence
    assert "--max-num-seqs" in finding.suggestion
    assert not by_rule(diagnose(vllm_exposition(preemptions=10, finished=20)))  # 0.48 per request: below 0.5


def test_waiting_with_few_free_blocks_is_a_kv_cap(vllm_exposition):
    finding = by_rule(diagnose(vllm_exposition(usage=0.97, waiting=12, waiting_capacity=12)))["concurrency_capped"]
    assert finding.values["bound"] == "kv_memory" and finding.severity == "warning"
    assert "12 requests wait for scheduling capacity" in finding.evidence
    assert "--gpu-memory-utilization" in finding.suggestion


def test_waiting_at_low_usage_is_the_batch_cap_info_in_one_scrape(vllm_exposition):
    diagnosis = diagnose(vllm_exposition(usage=0.2, waiting=40, waiting_capacity=40))
    finding = by_rule(diagnosis)["concurrency_capped"]
    assert finding.severity == "info" and finding.values["bound"] == "scheduler"
    assert "one scrape cannot show whether the queue grows" in finding.evidence
    assert "--max-num-seqs" in finding.suggestion
    assert not diagnosis.fired  # info never fails a --check
    # requests deferred (LoRA budget, KV transfer) are not waiting for capacity
    assert "concurrency_capped" not in by_rule(diagnose(vllm_exposition(usage=0.2, waiting=40, waiting_capacity=0)))
    # between low usage and the free-block threshold: no claim either way
    assert "concurrency_capped" not in by_rule(diagnose(vllm_exposition(usage=0.7, waiting=40, waiting_capacity=40)))


def window(vllm_exposition, steps: list[dict], interval: float = 1.0) -> Window:
    return Window([(i * interval, read_states(vllm_exposition(**values))[0]) for i, values in enumerate(steps)])


def test_a_growing_queue_over_a_timeline_is_a_warning(vllm_exposition):
    steps = [
        dict(usage=0.2, waiting=w, waiting_capacity=w, preemptions=0, finished=f)
        for w, f in ((0, 10), (5, 14), (11, 18), (20, 22))
    ]
    diagnosis = diagnose_windows([window(vllm_exposition, steps)], Thresholds(), "timeline")
    finding = by_rule(diagnosis)["concurrency_capped"]
    assert finding.severity == "warning" and diagnosis.fired
    assert "grew from 0 to 20" in finding.evidence and "over 3.0 s" in finding.evidence
    shrinking = [dict(usage=0.2, waiting=w, waiting_capacity=w) for w in (20, 11, 5, 0)]
    assert "concurrency_capped" not in by_rule(diagnose_windows([window(vllm_exposition, shrinking)], Thresholds()))


def test_counters_are_judged_over_the_watched_window(vllm_exposition):
    # 100 preemptions long ago, none while watched: no storm now
    calm = [dict(preemptions=100, finished=f) for f in (10, 20, 30)]
    diagnosis = diagnose_windows([window(vllm_exposition, calm)], Thresholds())
    assert "preemption_storm" not in by_rule(diagnosis)
    measured = {m.name: m.text for m in diagnosis.measurements}
    assert "0 preemptions for 20 finished requests over the 2.0 s watched" in measured["preemptions"]
    storm = [dict(preemptions=p, finished=f) for p, f in ((0, 10), (20, 20))]
    assert "preemption_storm" in by_rule(diagnose_windows([window(vllm_exposition, storm)], Thresholds()))


def test_free_blocks_over_a_window_fires_when_low_most_of_the_time(vllm_exposition):
    mostly_full = [dict(usage=u) for u in (0.95, 0.97, 0.96, 0.5)]
    finding = by_rule(diagnose_windows([window(vllm_exposition, mostly_full)], Thresholds()))["free_blocks"]
    assert "in 3 of 4 scrapes" in finding.evidence
    once = [dict(usage=u) for u in (0.5, 0.97, 0.5, 0.5)]
    assert "free_blocks" not in by_rule(diagnose_windows([window(vllm_exposition, once)], Thresholds()))


def test_prefix_cache_hit_rate_and_prefix_caching_off(vllm_exposition):
    text = vllm_exposition(prefix_queries=1000, prefix_hits=100)
    assert not by_rule(diagnose(text))  # off by default
    finding = by_rule(diagnose(text, min_prefix_hit_rate=0.3))["prefix_cache_hit_rate"]
    assert "10.0% of 1000 prompt tokens" in finding.evidence and finding.remedies == ("shareable_prefixes",)
    off = vllm_exposition(enable_prefix_caching="False")
    info = by_rule(diagnose(off))["prefix_caching_off"]
    assert info.severity == "info" and "--enable-prefix-caching" in info.suggestion
    low = by_rule(
        diagnose(
            vllm_exposition(enable_prefix_caching="False", prefix_queries=50, prefix_hits=0), min_prefix_hit_rate=0.1
        )
    )["prefix_cache_hit_rate"]
    assert low.remedies == ("enable_prefix_caching", "shareable_prefixes")


def test_the_block_size_in_the_remedy_is_the_servers(vllm_exposition):
    # a server whose blocks hold 128 tokens; the smaller-blocks remedy quotes it, never kvbench's default
    from kvbench.report.diagnose.remedies import render

    (state,) = read_states(vllm_exposition(block_size=128))
    assert render(("smaller_blocks",), "vllm", state.context()) == "use a smaller --block-size (now 128)"


def test_sglang_documented_example():
    diagnosis = diagnose((DATA / "sglang_metrics_docs.txt").read_text())
    finding = by_rule(diagnosis)["concurrency_capped"]
    assert finding.family == "sglang" and finding.severity == "info"
    assert "2826 requests wait at KV usage 28.0%" in finding.evidence
    assert "--max-running-requests" in finding.suggestion and "--max-num-seqs" not in finding.suggestion
    skipped = {n.rule for n in diagnosis.not_evaluated}
    assert {"fragmentation", "preemption_storm", "alloc_latency"} <= skipped
    rate = {m.name: m for m in diagnosis.measurements}["prefix_cache_hit_rate"]
    assert rate.value == pytest.approx(0.0075, rel=0.01) and "the rate the engine reports" in rate.text
    assert "internal_waste_estimate" not in {m.name for m in diagnosis.measurements}  # no page size exposed


def test_free_blocks_judged_when_the_last_scrape_has_no_valid_usage(vllm_exposition):
    # the last scrape's usage (37.5, a percentage, not a share) is set aside: the rule judges the scrapes that
    # had one and names the usage it saw last, instead of failing on the missing value
    steps = [{"usage": 0.96}, {"usage": 0.97}, {"usage": 37.5}]
    finding = by_rule(diagnose_windows([window(vllm_exposition, steps)], Thresholds()))["free_blocks"]
    assert "in 2 of 2 scrapes" in finding.evidence and "KV usage 97.0% (3.0%)" in finding.evidence


def test_a_window_is_quoted_by_its_peak_and_mean_not_its_last_scrape(vllm_exposition):
    """A point whose load ended before its last scrape read "1 running, KV usage 0.7%" beside a run table that
    said a peak of 4 running and 3%: over a window, the busiest moment and the average are what is quoted."""
    steps = [
        {"usage": 0.01, "running": 1, "waiting": 0},
        {"usage": 0.03, "running": 4, "waiting": 2},
        {"usage": 0.02, "running": 3, "waiting": 0},
        {"usage": 0.007, "running": 1, "waiting": 0},
    ]
    measured = {m.name: m for m in diagnose_windows([window(vllm_exposition, steps)], Thresholds()).measurements}
    usage, running = measured["kv_usage"], measured["running"]
    assert usage.value == pytest.approx(0.03) and running.value == 4
    assert "KV usage peak 3.0%, mean 1.7% over 4 scrapes" in usage.text
    assert "running peak 4, mean 2.2; waiting peak 2, mean 0.5" in running.text
