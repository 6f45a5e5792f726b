"""Rules over a fleet's points: a starved instance and an imbalance are found, and their remedies are keys
rendered in kvbench's words (the rules themselves name no flag)."""

from __future__ import annotations

from kvbench.report.diagnose.run_rules import diagnose_points
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.results.run_meta import RunMeta

POINT = {
    "engine": "paged/round-robin",
    "policy": "round-robin",
    "concurrency": 0,
    "status": "ok",
    "free_blocks_imbalance_mean": 600.0,
    "instances": [
        {"index": 0, "free_share_mean": 0.02, "routed": 90, "preemptions": 7, "total_blocks": 1000},
        {"index": 1, "free_share_mean": 0.80, "routed": 10, "preemptions": 0, "total_blocks": 1000},
    ],
}


def test_fleet_findings_render_their_remedies_for_kvbench():
    findings = {f.rule: f for f in diagnose_points([POINT], RunMeta(), Thresholds()).findings}
    starved, imbalance = findings["free_blocks"], findings["fleet_imbalance"]
    assert starved.source == "fleet paged/round-robin instance 0"
    assert starved.remedies == ("add_instance", "route_by_free_blocks")
    assert "kvbench fleet --autoscale" in starved.suggestion and "--policies most-free-blocks" in starved.suggestion
    assert imbalance.remedies == ("route_by_free_blocks",) and "most-free-blocks" in imbalance.suggestion


def test_pools_of_different_sizes_are_compared_by_the_share_they_use_not_by_free_blocks():
    """An idle 128-block and 256-block pair differ by 128 free blocks however they are routed: no imbalance is
    claimed from that; a spread of mean usage above 25 points is, naming the pools."""

    def point(usages):
        instances = [
            {"index": i, "total_blocks": blocks, "usage_mean": usage, "free_share_mean": 1 - usage}
            for i, (blocks, usage) in enumerate(zip((128, 256), usages, strict=True))
        ]
        return {**POINT, "free_blocks_imbalance_mean": 150.0, "instances": instances}

    even = {f.rule for f in diagnose_points([point((0.40, 0.45))], RunMeta(), Thresholds()).findings}
    assert "fleet_imbalance" not in even
    (skewed,) = [
        f
        for f in diagnose_points([point((0.85, 0.30))], RunMeta(), Thresholds()).findings
        if f.rule == "fleet_imbalance"
    ]
    assert "mean KV usage differed by 55 points" in skewed.evidence and "pools of 128/256 blocks" in skewed.evidence
