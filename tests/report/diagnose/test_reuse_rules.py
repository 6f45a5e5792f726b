"""Why a server point's prefix hits were lost: each rule on a point built to show it, and what it cannot judge."""

from kvbench.report.diagnose.reuse_rules import reuse_findings
from kvbench.report.diagnose.thresholds import Thresholds


def _point(rate=0.5, ideal=0.55, short=0, events=None, predicted=None, family="vllm"):
    point = {
        "prefix_reuse": {
            "requests": 40,
            "hit_rate_requests": rate,
            "hit_rate_counters": rate,
            "workload": {"block_size": 16, "ideal_hit_rate": ideal, "requests_sharing_under_one_block": short},
        },
        "scrapes": {"families": [family]},
    }
    if events is not None:
        point["kv_events"] = events
    if predicted is not None:
        point["trace"] = {"predicted_hit_rate": predicted}
    return point


def _rules(point, **thresholds):
    findings, skipped, notes = reuse_findings(point, "vllm C=8", Thresholds(**thresholds))
    return {f.rule: f for f in findings}, {s.rule for s in skipped}, notes


def test_a_healthy_point_has_no_finding():
    rules, skipped, _ = _rules(_point())
    assert rules == {}


def test_thrash_speaks_in_the_servers_options():
    events = {
        "kv_thrash_share": 0.4,
        "kv_blocks_removed": 500,
        "kv_thrash_window_s": 10.0,
        "kv_eviction_churn_per_s": 25.0,
    }
    rules, _, _ = _rules(_point(events=events))
    finding = rules["kv_eviction_thrash"]
    assert "40.0% of the 500 KV blocks" in finding.evidence and "--gpu-memory-utilization" in finding.suggestion
    assert "kv_eviction_thrash" not in _rules(_point(events=events), max_thrash_share=0.5)[0]


def test_too_few_removals_are_not_judged():
    events = {"kv_thrash_share": 1.0, "kv_blocks_removed": 3, "kv_thrash_window_s": 10.0}
    rules, skipped, _ = _rules(_point(events=events))
    assert "kv_eviction_thrash" not in rules and "kv_eviction_thrash" in skipped


def test_prefixes_shorter_than_a_block_caching_off_and_far_below_the_ideal():
    assert "prefix_shorter_than_block" in _rules(_point(short=10))[0]
    off = _rules(_point(rate=0.0, ideal=0.6))[0]["prefix_caching_off"]
    assert "--enable-prefix-caching" in off.suggestion
    below = _rules(_point(rate=0.2, ideal=0.7))[0]
    assert "hit_rate_below_ideal" in below and "prefix_caching_off" not in below
    kvbench = _rules(_point(rate=0.0, ideal=0.6, family="kvbench"))[0]["prefix_caching_off"]
    assert "--prefix-caching" in kvbench.suggestion and "--enable-prefix-caching" not in kvbench.suggestion


def test_a_trace_far_below_the_simulation_is_flagged():
    assert "hit_rate_below_prediction" in _rules(_point(rate=0.3, ideal=0.35, predicted=0.6))[0]
    assert "hit_rate_below_prediction" not in _rules(_point(rate=0.5, ideal=0.55, predicted=0.6))[0]


def test_without_the_workloads_reuse_nothing_is_guessed():
    point = _point()
    point["prefix_reuse"]["workload"] = None
    rules, skipped, _ = _rules(point)
    assert rules == {} and "prefix_reuse" in skipped


def test_flags_become_notes():
    point = _point(events={"flag": "no KV event arrived", "kv_thrash_share": None, "kv_blocks_removed": None})
    point["prefix_reuse"]["flag"] = "the counters disagree"
    _, _, notes = _rules(point)
    assert any("KV events: no KV event arrived" in n for n in notes) and any(
        "the counters disagree" in n for n in notes
    )


def test_values_outside_their_meaning_are_not_judged():
    rules, _, _ = _rules(_point(rate=1.7, ideal=0.6))
    assert rules == {}


def test_thrash_on_a_replayed_trace_says_what_more_blocks_would_keep():
    events = {
        "kv_thrash_share": 0.4,
        "kv_blocks_removed": 500,
        "kv_thrash_window_s": 10.0,
        "kv_eviction_churn_per_s": 25.0,
    }
    point = _point(events=events, predicted=0.45)
    point["trace"]["predicted_with_more_blocks"] = [[2000, 0.6], [4000, 0.7], [8000, 0.71]]
    evidence = _rules(point)[0]["kv_eviction_thrash"].evidence
    assert "predicts 45.0% with the server's blocks, 60.0% with 2,000 blocks, 70.0% with 4,000 blocks" in evidence
