"""kvbench compare: loading, matching, noise-aware verdicts and the three report formats."""

from __future__ import annotations

import copy
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import mannwhitneyu

from kvbench.errors import KvbenchError
from kvbench.report.baseline import update_baseline
from kvbench.report.compare import Comparison, Verdict, compare, mann_whitney_p, min_two_sided_p
from kvbench.report.compare_policy import Mode, Threshold, metric_policy, parse_rule
from kvbench.report.compare_render import to_json, to_junit, to_markdown
from kvbench.results.summary_load import PointKey, load_summary, parse_summary

RATIO = "paged_over_contiguous_output_throughput"
REAL_RUNS = Path(__file__).parent / "data"


def sweep_point(engine: str, concurrency: int, throughput: float, **extra: Any) -> dict[str, Any]:
    point: dict[str, Any] = {
        "engine": engine,
        "concurrency": concurrency,
        "scenario": "article",
        "status": "ok",
        "completed": 40,
        "rejected": 0,
        "preemptions": 3,
        "output_throughput": throughput,
        "total_token_throughput": 3 * throughput,
        "request_throughput": throughput / 100,
        "p99_ttft_ms": 120.0,
        "p99_tpot_ms": 25.0,
        "peak_running": concurrency,
        "mean_running": concurrency * 0.9,
        "kv_pool_bytes": 2_000_000_000,
        "kv_peak_allocated_bytes": 1_000_000_000,
        "kv_peak_used_bytes": 900_000_000,
        "kv_mean_used_bytes": 600_000_000,
        "kv_mean_allocated_bytes": 700_000_000,
        "waste": {
            "token_state_pct": 60.0,
            "reservation_pct": 20.0,
            "internal_pct": 15.0,
            "external_pct": 5.0,
        },
        "fragmentation_mean": 0.05,
        "memory": {"rss_peak_bytes": 3_000_000_000, "torch_allocated_peak_bytes": None},
    }
    point.update(extra)
    return point


def summary_data(points: list[dict[str, Any]], kind: str = "sweep", simulated: bool = False) -> dict[str, Any]:
    meta = {"command": "kvbench sweep", "scenario": "article", "seed": 0, "simulated": simulated}
    return {"schema_version": 1, "kind": kind, "meta": meta, "points": points}


def base_sweep(simulated: bool = False) -> dict[str, Any]:
    return summary_data(
        [
            sweep_point("paged", 10, 41.0),
            sweep_point("contiguous", 10, 32.0),
            sweep_point("paged", 30, 57.0),
            sweep_point("contiguous", 30, 18.0),
        ],
        simulated=simulated,
    )


def write(tmp_path: Path, name: str, data: Any) -> Path:
    run = tmp_path / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(data) if not isinstance(data, str) else data)
    return run


def run_compare(tmp_path: Path, base: dict, head: dict, *rules: str, **options: Any) -> Comparison:
    base_run, head_run = write(tmp_path, "base", base), write(tmp_path, "head", head)
    parsed = tuple(parse_rule(rule) for rule in rules)
    return compare(load_summary(base_run), load_summary(head_run), parsed, **options)


def row(comparison: Comparison, engine: str, concurrency: int, metric: str, scenario: str = "article"):
    key = PointKey(engine, concurrency, scenario)
    (found,) = [r for r in comparison.rows if r.point == key and r.metric == metric]
    return found


def point_of(data: dict, engine: str, concurrency: int) -> dict:
    (found,) = [p for p in data["points"] if (p["engine"], p["concurrency"]) == (engine, concurrency)]
    return found


def failing(comparison: Comparison) -> list[tuple[str, str, str]]:
    return [(r.point.label, r.metric, r.verdict.value) for r in comparison.rows if r.verdict.fails]


# --- loading ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ("[]", "not a kvbench summary"),
        ('{"schema_version": 1}', "not a kvbench summary"),
        ('{"schema_version": 99, "kind": "sweep", "points": []}', "schema_version 99"),
        ('{"schema_version": true, "kind": "sweep", "points": []}', "schema_version True"),
        ('{"schema_version": 1, "kind": "sweep", "points": {}}', "'points' must be a list"),
        ('{"schema_version": 1, "kind": "sweep", "points": [{"concurrency": 1}]}', "no engine"),
        ('{"schema_version": 1, "kind": "sweep", "points": [{"engine": "paged"}]}', "no integer concurrency"),
    ],
)
def test_unusable_summaries_are_refused_in_one_line(tmp_path, content, message):
    with pytest.raises(KvbenchError, match=message) as caught:
        load_summary(write(tmp_path, "run", content))
    assert "\n" not in str(caught.value)


def test_missing_run_and_run_without_summary_are_refused(tmp_path):
    with pytest.raises(KvbenchError, match="no such run directory"):
        load_summary(tmp_path / "absent")
    (tmp_path / "empty").mkdir()
    with pytest.raises(KvbenchError, match="has no summary.json"):
        load_summary(tmp_path / "empty")


def test_duplicate_points_are_refused(tmp_path):
    data = summary_data([sweep_point("paged", 10, 1.0), sweep_point("paged", 10, 2.0)])
    with pytest.raises(KvbenchError, match="two points for paged c=10 article"):
        parse_summary(data, tmp_path / "summary.json")


def test_a_summary_file_path_works_and_scenario_defaults_to_meta(tmp_path):
    point = sweep_point("paged", 10, 1.0)
    del point["scenario"]
    run = write(tmp_path, "run", summary_data([point]))
    summary = load_summary(run / "summary.json")
    assert list(summary.points) == [PointKey("paged", 10, "article")]


def test_kinds_must_match(tmp_path):
    with pytest.raises(KvbenchError, match="cannot compare"):
        run_compare(tmp_path, base_sweep(), summary_data(base_sweep()["points"], kind="waste"))


def test_a_simulated_run_is_not_compared_with_a_measured_one(tmp_path):
    with pytest.raises(KvbenchError, match="simulated run .* with a measured run"):
        run_compare(tmp_path, base_sweep(simulated=True), base_sweep())


# --- corrupted values: unusable input, never "new" --------------------------------------------


@pytest.mark.parametrize("side", ["base", "head"])
@pytest.mark.parametrize(
    ("metric", "value", "shown"),
    [
        ("completed", "fast", "'fast'"),
        ("kv_peak_allocated_bytes", True, "True"),
        ("output_throughput", math.nan, "nan"),  # feeds the judged paged/contiguous ratio
        ("fragmentation_mean", math.inf, "inf"),
        ("waste.internal_pct", -math.inf, "-inf"),
        ("waste", "lots", "'lots'"),
    ],
)
def test_a_corrupted_judged_metric_is_unusable_input(tmp_path, side, metric, value, shown):
    corrupted = base_sweep()
    point = point_of(corrupted, "paged", 30)
    if metric.startswith("waste."):
        point["waste"][metric.split(".")[1]] = value
    else:
        point[metric] = value
    base, head = (corrupted, base_sweep()) if side == "base" else (base_sweep(), corrupted)
    with pytest.raises(KvbenchError) as caught:
        run_compare(tmp_path, base, head)
    message = str(caught.value)
    assert "\n" not in message
    assert str(tmp_path / side / "summary.json") in message
    assert "paged c=30 article" in message and metric.split(".")[0] in message and shown in message


def test_json_nan_and_infinity_tokens_are_unusable_input(tmp_path):
    text = json.dumps(base_sweep()).replace('"fragmentation_mean": 0.05', '"fragmentation_mean": NaN', 1)
    with pytest.raises(KvbenchError, match="fragmentation_mean is nan, not a number"):
        compare(load_summary(write(tmp_path, "base", text)), load_summary(write(tmp_path, "head", base_sweep())))


def test_malformed_samples_and_status_are_unusable_input(tmp_path):
    bad_samples = base_sweep()
    point_of(bad_samples, "paged", 10)["samples"] = {"output_throughput": [40.0, "fast", 41.0]}
    with pytest.raises(KvbenchError, match="samples of output_throughput are .*'fast'"):
        run_compare(tmp_path / "samples", bad_samples, base_sweep())
    bad_status = base_sweep()
    point_of(bad_status, "paged", 10)["status"] = 1
    with pytest.raises(KvbenchError, match="status is 1, not one of ok, oom, error"):
        run_compare(tmp_path / "status", base_sweep(), bad_status)


def test_a_corrupted_metric_that_is_not_judged_is_ignored(tmp_path):
    value, group = base_sweep(), base_sweep()
    point_of(value, "paged", 10)["memory"]["rss_peak_bytes"] = "lots"  # memory.* only with --absolute
    point_of(group, "paged", 30)["memory"] = "lots"
    cases = (
        ("value", value, "memory.rss_peak_bytes is 'lots', not a number"),
        ("group", group, "'memory' is 'lots', not an object"),
    )
    for name, head, message in cases:
        assert not run_compare(tmp_path / name, base_sweep(), head).failed
        with pytest.raises(KvbenchError, match=message):
            run_compare(tmp_path / f"{name}-absolute", base_sweep(), head, absolute=True)


@pytest.mark.parametrize(("side", "note"), [("base", "base has no value"), ("head", "head has no value")])
def test_null_on_one_side_and_a_number_on_the_other_fails(tmp_path, side, note):
    nulled = base_sweep()
    point_of(nulled, "paged", 10)["kv_mean_used_bytes"] = None
    base, head = (nulled, base_sweep()) if side == "base" else (base_sweep(), nulled)
    comparison = run_compare(tmp_path, base, head)
    found = row(comparison, "paged", 10, "kv_mean_used_bytes")
    assert found.verdict is Verdict.MISSING and note in found.note
    assert comparison.failed


def test_a_null_throughput_fails_through_its_ratio(tmp_path):
    base = base_sweep()
    point_of(base, "paged", 10)["output_throughput"] = None  # absolute throughput is not judged by default
    comparison = run_compare(tmp_path, base, base_sweep())
    ratio = row(comparison, "paged/contiguous", 10, RATIO)
    assert ratio.verdict is Verdict.MISSING and "base has no value" in ratio.note
    assert comparison.failed


# --- deterministic metrics ---------------------------------------------------------------------


def test_identical_runs_pass_with_ratios_derived(tmp_path):
    comparison = run_compare(tmp_path, base_sweep(), base_sweep())
    assert not comparison.failed
    assert set(comparison.counts) == {v.value for v in Verdict}
    assert comparison.counts["unchanged"] + comparison.counts["info"] == len(comparison.rows)
    ratio = row(comparison, "paged/contiguous", 10, RATIO)
    assert ratio.base == pytest.approx(41 / 32)


@pytest.mark.parametrize("simulated", [False, True])
def test_counts_and_peak_bytes_are_exact_in_any_run(tmp_path, simulated):
    head = base_sweep(simulated)
    point_of(head, "contiguous", 30)["preemptions"] = 4
    point_of(head, "paged", 30)["rejected"] = 1
    point_of(head, "paged", 10)["kv_peak_allocated_bytes"] = 1_000_000_016
    point_of(head, "contiguous", 10)["kv_peak_used_bytes"] = 899_000_000
    comparison = run_compare(tmp_path, base_sweep(simulated), head)
    assert row(comparison, "contiguous", 30, "preemptions").verdict is Verdict.REGRESSED
    assert row(comparison, "paged", 30, "rejected").verdict is Verdict.REGRESSED
    assert row(comparison, "paged", 10, "kv_peak_allocated_bytes").verdict is Verdict.REGRESSED
    assert row(comparison, "contiguous", 10, "kv_peak_used_bytes").verdict is Verdict.IMPROVED


@pytest.mark.parametrize("pool", [1_900_000_000, 2_100_000_000])
def test_a_changed_pool_is_a_changed_setting_either_way(tmp_path, pool):
    head = base_sweep()
    point_of(head, "paged", 10)["kv_pool_bytes"] = pool
    assert row(run_compare(tmp_path, base_sweep(), head), "paged", 10, "kv_pool_bytes").verdict is Verdict.REGRESSED


def test_simulated_runs_judge_every_metric_exactly_but_not_the_last_bits(tmp_path):
    head = base_sweep(simulated=True)
    point_of(head, "paged", 10)["output_throughput"] = 41.0 * 0.99
    point_of(head, "paged", 30)["p99_tpot_ms"] = 25.5
    point_of(head, "contiguous", 10)["kv_mean_used_bytes"] = 600_000_000 * (1 + 1e-12)  # another numpy
    point_of(head, "contiguous", 30)["waste"]["external_pct"] = 5.0 + 1e-13
    comparison = run_compare(tmp_path, base_sweep(simulated=True), head)
    assert comparison.simulated
    assert row(comparison, "paged", 10, "output_throughput").verdict is Verdict.REGRESSED
    assert row(comparison, "paged", 30, "p99_tpot_ms").verdict is Verdict.REGRESSED
    assert row(comparison, "paged/contiguous", 10, RATIO).verdict is Verdict.REGRESSED
    assert row(comparison, "contiguous", 10, "kv_mean_used_bytes").verdict is Verdict.UNCHANGED
    assert row(comparison, "contiguous", 30, "waste.external_pct").verdict is Verdict.UNCHANGED
    assert not any(r.verdict is Verdict.INFO for r in comparison.rows)


def test_simulated_runs_leave_memory_to_absolute(tmp_path):
    comparison = run_compare(tmp_path, base_sweep(simulated=True), base_sweep(simulated=True))
    assert all(not r.metric.startswith("memory.") for r in comparison.rows)


# --- measured runs: noisy metrics ---------------------------------------------------------------


def test_time_weighted_metrics_tolerate_measured_noise_but_not_a_real_change(tmp_path):
    head = base_sweep()
    point_of(head, "paged", 10)["kv_mean_used_bytes"] = 600_000_000 * 1.4  # inside x1.6
    point_of(head, "paged", 30)["kv_mean_used_bytes"] = 600_000_000 * 2  # beyond
    point_of(head, "contiguous", 10)["waste"]["internal_pct"] = 15.0 * 1.7
    point_of(head, "contiguous", 30)["waste"]["reservation_pct"] = 20.0 / 1.7
    point_of(head, "paged", 30)["fragmentation_mean"] = 0.05 * 1.3
    comparison = run_compare(tmp_path, base_sweep(), head)
    assert row(comparison, "paged", 10, "kv_mean_used_bytes").verdict is Verdict.UNCHANGED
    assert row(comparison, "paged", 30, "kv_mean_used_bytes").verdict is Verdict.REGRESSED
    assert row(comparison, "contiguous", 10, "waste.internal_pct").verdict is Verdict.REGRESSED
    assert row(comparison, "contiguous", 30, "waste.reservation_pct").verdict is Verdict.IMPROVED
    assert row(comparison, "paged", 30, "fragmentation_mean").verdict is Verdict.UNCHANGED


def test_a_tiny_share_growing_many_times_is_caught_and_a_tiny_wobble_is_not(tmp_path):
    base, head = base_sweep(), base_sweep()
    point_of(base, "paged", 10)["waste"]["internal_pct"] = 0.0025  # paging: almost no internal waste
    point_of(head, "paged", 10)["waste"]["internal_pct"] = 5.0
    point_of(base, "paged", 30)["waste"]["internal_pct"] = 0.0025
    point_of(head, "paged", 30)["waste"]["internal_pct"] = 0.05  # x20, but under the 0.1-point floor
    comparison = run_compare(tmp_path, base, head)
    assert row(comparison, "paged", 10, "waste.internal_pct").verdict is Verdict.REGRESSED
    assert row(comparison, "paged", 30, "waste.internal_pct").verdict is Verdict.UNCHANGED


def test_single_run_throughput_ratio_is_judged_within_the_measured_noise(tmp_path):
    head = base_sweep()
    point_of(head, "paged", 10)["output_throughput"] = 41.0 * 0.5  # ratio x2: within single-run noise
    point_of(head, "paged", 30)["output_throughput"] = 57.0 / 3  # ratio x3: beyond
    comparison = run_compare(tmp_path, base_sweep(), head)
    assert row(comparison, "paged/contiguous", 10, RATIO).verdict is Verdict.UNCHANGED
    assert row(comparison, "paged/contiguous", 30, RATIO).verdict is Verdict.REGRESSED


def _interleaved(data: dict, duration: float) -> dict:
    """The sweep as a run whose paged and contiguous engines stepped in turn at each point, for ``duration`` s."""
    data = copy.deepcopy(data)
    for point in data["points"]:
        other = "contiguous" if point["engine"] == "paged" else "paged"
        point.update(interleaved_with=[other], duration=duration)
    return data


@pytest.mark.parametrize(
    ("interleaved", "duration", "verdict", "threshold"),
    [
        (True, 5.0, Verdict.REGRESSED, "x1.35"),  # engines stepped in turn shared the load: a 30% drop shows
        (False, 5.0, Verdict.UNCHANGED, "x2.5"),  # run one after the other: a single run is too noisy for it
        (True, 0.5, Verdict.INFO, "not gated"),  # too short to time on this machine, interleaved or not
    ],
)
def test_a_single_run_thirty_percent_ratio_drop_is_caught_where_the_engines_ran_in_turn_long_enough(
    tmp_path, interleaved, duration, verdict, threshold
):
    base = _interleaved(base_sweep(), duration) if interleaved else base_sweep()
    if not interleaved:
        for point in base["points"]:
            point["duration"] = duration
    head = copy.deepcopy(base)
    point_of(head, "paged", 10)["output_throughput"] *= 0.7
    judged = row(run_compare(tmp_path, base, head), "paged/contiguous", 10, RATIO)
    assert (judged.verdict, judged.threshold) == (verdict, threshold)


def test_single_run_tail_ratios_are_reported_not_gated_unless_a_rule_asks(tmp_path):
    head = base_sweep()
    point_of(head, "paged", 30)["p99_ttft_ms"] = 1200.0  # x10
    comparison = run_compare(tmp_path, base_sweep(), head)
    tail = row(comparison, "paged/contiguous", 30, "paged_over_contiguous_p99_ttft_ms")
    assert tail.verdict is Verdict.INFO and "repeat each point 4+ times" in tail.note and not comparison.failed
    asked = run_compare(tmp_path / "rule", base_sweep(), head, "*p99_ttft_ms:50%")
    assert row(asked, "paged/contiguous", 30, "paged_over_contiguous_p99_ttft_ms").verdict is Verdict.REGRESSED


def test_absolute_timing_is_machine_dependent(tmp_path):
    head = base_sweep()
    for point in head["points"]:
        point["output_throughput"] *= 0.5  # a busier machine: both engines twice as slow
    comparison = run_compare(tmp_path, base_sweep(), head)
    assert not comparison.failed
    assert all(r.metric != "output_throughput" for r in comparison.rows)
    absolute = run_compare(tmp_path / "abs", base_sweep(), head, absolute=True)
    assert row(absolute, "paged", 10, "output_throughput").verdict is Verdict.INFO
    assert not absolute.failed
    ruled = run_compare(tmp_path / "rule", base_sweep(), head, "output_throughput:20%")
    assert row(ruled, "paged", 10, "output_throughput").verdict is Verdict.REGRESSED


def test_absolute_judges_memory(tmp_path):
    head = base_sweep()
    point_of(head, "paged", 10)["memory"]["rss_peak_bytes"] = 3_500_000_000
    assert not run_compare(tmp_path, base_sweep(), head).failed
    absolute = run_compare(tmp_path / "abs", base_sweep(), head, absolute=True)
    assert row(absolute, "paged", 10, "memory.rss_peak_bytes").verdict is Verdict.REGRESSED
    assert all(r.metric != "memory.torch_allocated_peak_bytes" for r in absolute.rows)  # null both sides


def test_fail_on_threshold_overrides_the_default(tmp_path):
    head = base_sweep()
    point_of(head, "paged", 10)["output_throughput"] = 36.0  # -12% ratio
    point_of(head, "paged", 10)["waste"]["internal_pct"] = 26.0  # x1.73
    assert failing(run_compare(tmp_path, base_sweep(), head)) == [
        ("paged c=10 article", "waste.internal_pct", "regressed")
    ]
    lenient = run_compare(tmp_path / "lenient", base_sweep(), head, f"{RATIO}:15%", "waste.*:20")
    assert not lenient.failed
    strict = run_compare(tmp_path / "strict", base_sweep(), head, "paged_over_*:20%", f"{RATIO}:10%")
    assert row(strict, "paged/contiguous", 10, RATIO).verdict is Verdict.REGRESSED  # last match wins


def test_missing_point_fails_and_new_point_is_reported(tmp_path):
    head = base_sweep()
    head["points"] = [p for p in head["points"] if (p["engine"], p["concurrency"]) != ("paged", 30)]
    head["points"].append(sweep_point("paged", 50, 49.0))
    comparison = run_compare(tmp_path, base_sweep(), head)
    assert row(comparison, "paged", 30, "(point)").verdict is Verdict.MISSING
    assert row(comparison, "paged/contiguous", 30, "(point)").verdict is Verdict.MISSING
    assert row(comparison, "paged", 50, "(point)").verdict is Verdict.NEW
    assert comparison.failed
    assert comparison.counts["missing"] == 2 and comparison.counts["new"] == 1
    assert comparison.count(Verdict.MISSING) == 2 and comparison.count(Verdict.NEW) == 1
    assert comparison.count(Verdict.REGRESSED) == comparison.counts["regressed"]


def test_new_point_alone_passes(tmp_path):
    head = base_sweep()
    head["points"].append(sweep_point("paged", 50, 49.0))
    comparison = run_compare(tmp_path, base_sweep(), head)
    assert not comparison.failed and comparison.counts["new"] == 1


def test_a_metric_dropped_from_head_is_missing_and_one_added_is_new(tmp_path):
    head = base_sweep()
    del point_of(head, "paged", 10)["fragmentation_mean"]
    point_of(head, "paged", 30)["max_concurrency"] = 30
    comparison = run_compare(tmp_path, base_sweep(), head)
    assert row(comparison, "paged", 10, "fragmentation_mean").verdict is Verdict.MISSING
    assert row(comparison, "paged", 30, "max_concurrency").verdict is Verdict.NEW


def test_status_change_to_oom_regresses_and_skips_the_points_metrics(tmp_path):
    head = base_sweep()
    point_of(head, "contiguous", 30).update(status="oom", output_throughput=None, completed=0)
    comparison = run_compare(tmp_path, base_sweep(), head)
    status = row(comparison, "contiguous", 30, "status")
    assert status.verdict is Verdict.REGRESSED and (status.base, status.head) == ("ok", "oom")
    assert [r.metric for r in comparison.rows if r.point == PointKey("contiguous", 30, "article")] == ["status"]


def test_waste_runs_compare_max_concurrency(tmp_path):
    def waste(max_concurrency: int) -> dict:
        point = {
            "engine": "paged-16",
            "concurrency": 64,
            "scenario": "waste",
            "waste": {
                "token_state_pct": 96.0,
                "reservation_pct": 0.0,
                "internal_pct": 4.0,
                "external_pct": 0.0,
            },
            "fragmentation_mean": 0.04,
            "kv_peak_allocated_bytes": 123_456_789,
            "max_concurrency": max_concurrency,
        }
        return summary_data([point], kind="waste", simulated=True)

    comparison = run_compare(tmp_path, waste(50), waste(48))
    assert row(comparison, "paged-16", 64, "max_concurrency", "waste").verdict is Verdict.REGRESSED


def test_share_runs_judge_their_deterministic_blocks(tmp_path):
    def share(mean_blocks: float) -> dict:
        point = {
            "engine": "paged-shared",
            "concurrency": 2,
            "scenario": "share-parallel",
            "status": "ok",
            "mean_blocks": mean_blocks,
            "peak_blocks": 6,
            "mean_bytes": mean_blocks * 8192,
            "peak_bytes": 49152,
        }
        return summary_data([point], kind="share")

    assert not run_compare(tmp_path / "same", share(4.25), share(4.25)).failed
    comparison = run_compare(tmp_path / "grown", share(4.25), share(4.5))
    assert row(comparison, "paged-shared", 2, "mean_blocks", "share-parallel").verdict is Verdict.REGRESSED
    assert row(comparison, "paged-shared", 2, "mean_bytes", "share-parallel").verdict is Verdict.REGRESSED


def test_rule_matching_nothing_and_bad_rules_are_refused(tmp_path):
    with pytest.raises(KvbenchError, match="matches no metric"):
        run_compare(tmp_path, base_sweep(), base_sweep(), "max_concurrency:1")
    for text in ("output_throughput", "output_throughput:fast", ":5%", "output_throughput:-1"):
        with pytest.raises(KvbenchError, match=f"rule {text!r}"):
            parse_rule(text)
    rule = parse_rule("waste.internal_pct:0.5")
    assert (rule.threshold.value, rule.threshold.mode) == (0.5, Mode.ABSOLUTE)
    assert parse_rule(f"{RATIO}:5%").threshold.value == pytest.approx(0.05)


def test_thresholds_by_mode():
    factor = Threshold(2.0, Mode.FACTOR)
    assert factor.judge(10.0, 5.1, +1) == 0 and factor.judge(10.0, 4.9, +1) == -1
    assert factor.judge(10.0, 21.0, +1) == 1 and factor.judge(10.0, 21.0, -1) == -1
    assert factor.judge(0.0, 1.0, -1) == -1 and factor.judge(0.0, 0.0, -1) == 0
    floored = Threshold(2.0, Mode.FACTOR, floor=0.1)
    assert floored.judge(0.001, 0.05, -1) == 0
    relative, absolute = Threshold(0.05, Mode.RELATIVE), Threshold(0.5, Mode.ABSOLUTE)
    assert relative.judge(100.0, 94.0, +1) == -1 and relative.judge(100.0, 96.0, +1) == 0
    assert absolute.judge(15.0, 15.6, -1) == -1 and absolute.judge(15.0, 15.4, -1) == 0
    assert str(factor) == "x2" and str(relative) == "5%" and str(floored) == "x2 (min 0.1)"


def test_metric_classes():
    assert str(metric_policy("completed", simulated=False).single) == "exact"
    assert metric_policy("kv_mean_used_bytes", simulated=False).single.mode is Mode.FACTOR
    assert metric_policy("kv_mean_used_bytes", simulated=True).single.mode is Mode.RELATIVE
    assert metric_policy("paged_over_contiguous_p99_ttft_ms", simulated=False).single is None
    assert not metric_policy("output_throughput", simulated=False).by_default
    assert metric_policy("output_throughput", simulated=True).by_default
    assert metric_policy("waste.free_pct", simulated=False) is None


# --- repeats and Mann-Whitney ----------------------------------------------------------------


def with_samples(data: dict, engine: str, concurrency: int, values: list[float]) -> dict:
    point = point_of(data, engine, concurrency)
    point["output_throughput"] = sum(values) / len(values)
    point["repeats"] = len(values)
    point["samples"] = {"output_throughput": values}
    return data


def repeated(paged: list[float], contiguous: list[float]) -> dict:
    data = with_samples(base_sweep(), "paged", 10, paged)
    return with_samples(data, "contiguous", 10, contiguous)


def test_significant_ratio_drop_with_samples_regresses(tmp_path):
    contiguous = [32.0, 32.1, 31.9, 32.0, 32.2]
    base = repeated([41.0, 41.2, 40.8, 41.1, 40.9], contiguous)
    head = repeated([29.0, 29.2, 28.8, 29.1, 28.9], contiguous)  # -29%
    ratio = row(run_compare(tmp_path, base, head), "paged/contiguous", 10, RATIO)
    assert ratio.verdict is Verdict.REGRESSED
    assert ratio.p_value == pytest.approx(2 / 252)  # 5 vs 5, complete separation: exact p = 2 / C(10, 5)


def test_significant_but_small_change_is_within_the_sampled_threshold(tmp_path):
    contiguous = [32.0, 32.1, 31.9, 32.0, 32.2]
    base = repeated([41.0, 41.2, 40.8, 41.1, 40.9], contiguous)
    head = repeated([36.0, 36.2, 35.8, 36.1, 35.9], contiguous)  # -12%: significant, but load shifts do that
    ratio = row(run_compare(tmp_path, base, head), "paged/contiguous", 10, RATIO)
    assert ratio.verdict is Verdict.UNCHANGED and ratio.p_value < 0.05


def test_noisy_drop_beyond_threshold_is_not_significant(tmp_path):
    contiguous = [32.0] * 5
    base = repeated([20.0, 60.0, 35.0, 58.0, 32.0], contiguous)  # mean 41
    head = repeated([19.0, 49.0, 20.0, 25.0, 21.0], contiguous)  # mean 26.8: -35%
    ratio = row(run_compare(tmp_path, base, head), "paged/contiguous", 10, RATIO)
    assert ratio.verdict is Verdict.UNCHANGED
    assert ratio.p_value is not None and ratio.p_value >= 0.05
    assert "not significant" in ratio.note


def test_three_samples_fall_back_to_the_single_run_tolerance(tmp_path):
    contiguous = [32.0, 32.0, 32.0]
    base = repeated([41.0, 41.0, 41.0], contiguous)
    head = repeated([12.0, 12.1, 11.9], contiguous)  # x3.4
    ratio = row(run_compare(tmp_path, base, head), "paged/contiguous", 10, RATIO)
    assert ratio.verdict is Verdict.REGRESSED
    assert ratio.p_value is None and "3 vs 3 samples cannot reach p<0.05" in ratio.note
    assert str(ratio.threshold) == "x2.5"


def test_tail_ratios_with_enough_samples_are_gated(tmp_path):
    base, head = base_sweep(), base_sweep()
    for data, paged in ((base, [100.0, 101.0, 99.0, 100.5, 99.5]), (head, [900.0, 901.0, 899.0, 900.5, 899.5])):
        for engine, values in (("paged", paged), ("contiguous", [100.0, 100.2, 99.8, 100.1, 99.9])):
            point_of(data, engine, 10)["p99_ttft_ms"] = sum(values) / 5
            point_of(data, engine, 10)["samples"] = {"p99_ttft_ms": values}
    comparison = run_compare(tmp_path, base, head)
    assert row(comparison, "paged/contiguous", 10, "paged_over_contiguous_p99_ttft_ms").verdict is Verdict.REGRESSED
    assert row(comparison, "paged/contiguous", 30, "paged_over_contiguous_p99_ttft_ms").verdict is Verdict.INFO


def test_smallest_attainable_p_is_known():
    assert min_two_sided_p(3, 3) == pytest.approx(0.1)  # 2 of the C(6, 3) = 20 orderings
    assert min_two_sided_p(3, 4) == pytest.approx(2 / 35)
    assert min_two_sided_p(4, 4) == pytest.approx(2 / 70)
    assert min_two_sided_p(5, 5) == pytest.approx(2 / 252)
    assert min_two_sided_p(1, 1) == 1.0


@pytest.mark.parametrize(("n", "m"), [(3, 3), (3, 5), (4, 4), (5, 7)])
def test_smallest_attainable_p_is_what_the_exact_test_gives_for_complete_separation(n, m):
    low, high = [float(i) for i in range(n)], [float(100 + i) for i in range(m)]
    assert mann_whitney_p(low, high) == pytest.approx(min_two_sided_p(n, m))


def test_mann_whitney_known_values():
    assert mann_whitney_p([1, 2, 3], [4, 5, 6]) == pytest.approx(0.1)
    assert mann_whitney_p([1, 2, 4], [3, 5, 6]) == pytest.approx(0.2)  # U = 1: 2 of 20 orderings each side
    tied = mann_whitney_p([1, 2, 2, 3], [2, 3, 4, 5])  # ties: normal approximation with tie correction
    assert tied == pytest.approx(0.1367, abs=1e-4)
    assert tied == pytest.approx(mannwhitneyu([1, 2, 2, 3], [2, 3, 4, 5], method="asymptotic").pvalue)
    assert mann_whitney_p([5, 5, 5], [5, 5, 5]) == 1.0
    assert mann_whitney_p([1, 2, 3], [1, 2, 3]) == 1.0


# --- real runs: identical settings pass, a real 30% drop is caught --------------------------------


def real(name: str):
    return load_summary(REAL_RUNS / f"{name}.json")


@pytest.mark.parametrize(("a", "b"), [("article-single-a", "article-single-b"), ("ci-smoke-a", "ci-smoke-b")])
def test_real_identical_sweeps_pass_both_ways(a, b):
    """The pairs of identical CPU sweeps whose throughput ratios differed most (x1.61 and x1.74)."""
    for base, head in ((a, b), (b, a)):
        comparison = compare(real(base), real(head))
        assert failing(comparison) == []
        assert comparison.counts["improved"] == 0


def test_real_single_run_thirty_percent_drop_is_within_its_noise(tmp_path):
    """A single run cannot tell a 30% drop from this machine's noise: the ratio is not gated that tight."""
    head = scaled_paged_throughput(real("article-single-a").path, 0.7)
    comparison = compare(real("article-single-a"), load_summary(write(tmp_path, "head", head)))
    assert row(comparison, "paged/contiguous", 10, RATIO).verdict is Verdict.UNCHANGED
    assert str(row(comparison, "paged/contiguous", 10, RATIO).threshold) == "x2.5"


def test_real_interleaved_sweeps_of_long_points_pass_both_ways_and_catch_a_thirty_percent_drop(tmp_path):
    """Two identical sweeps of 600 requests a point (8-12 s each, the engines stepped in turn) on a busy Zen 1
    (a core 71% and 85% of the time): their ratios differ under 1%, and a 30% drop in one run is caught."""
    a, b = real("article-interleaved-a"), real("article-interleaved-b")
    for base, head in ((a, b), (b, a)):
        assert failing(compare(base, head)) == []
    dropped = load_summary(write(tmp_path, "head", scaled_paged_throughput(a.path, 0.7)))
    comparison = compare(b, dropped)
    for concurrency in (10, 30):
        judged = row(comparison, "paged/contiguous", concurrency, RATIO)
        assert (judged.verdict, str(judged.threshold)) == (Verdict.REGRESSED, "x1.35")


def test_real_repeated_sweep_catches_a_thirty_percent_drop(tmp_path):
    base = real("article-repeat4")
    head = load_summary(write(tmp_path, "head", scaled_paged_throughput(base.path, 0.7)))
    comparison = compare(base, head)
    for concurrency in (10, 30):
        ratio = row(comparison, "paged/contiguous", concurrency, RATIO)
        assert ratio.verdict is Verdict.REGRESSED
        assert ratio.relative_change == pytest.approx(-0.3)
        assert ratio.p_value == pytest.approx(2 / 70)  # 4 vs 4 samples, completely separated
    assert comparison.failed
    assert compare(base, real("article-repeat4")).counts["unchanged"] == len(compare(base, base).rows)


def scaled_paged_throughput(path: Path, factor: float) -> dict:
    data = json.loads(path.read_text())
    for point in data["points"]:
        if point["engine"] != "paged":
            continue
        for metric in ("output_throughput", "total_token_throughput", "request_throughput"):
            point[metric] *= factor
            if metric in point.get("samples", {}):
                point["samples"][metric] = [value * factor for value in point["samples"][metric]]
    return data


# --- rendering -------------------------------------------------------------------------------


def regressed_comparison(tmp_path: Path) -> Comparison:
    head = base_sweep()
    point_of(head, "paged", 10).update(sweep_point("paged", 10, 12.0))  # ratios x3.4 lower
    head["points"] = [p for p in head["points"] if (p["engine"], p["concurrency"]) != ("contiguous", 30)]
    return run_compare(tmp_path, base_sweep(), head)


def test_markdown_renders_a_summary_line_and_a_table(tmp_path):
    comparison = regressed_comparison(tmp_path)
    text = to_markdown(comparison)
    first = text.splitlines()[0]
    assert first.startswith("**kvbench compare: FAIL") and "3 regressed" in first and "2 missing" in first
    assert "measured runs" in text and "reported, not gated" in text
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert table[0] == "| point | metric | base | head | change | verdict | rule |"
    assert table[1] == "|---|---|---|---|---|---|---|"
    body = [line for line in table[2:] if not line.startswith("| point |") and not line.startswith("|---")]
    assert len(body) == len(comparison.rows)
    assert all(line.count(" | ") == 6 for line in body)
    assert any(RATIO in line and "**regressed**" in line and "-70.7%" in line for line in body)


def test_junit_parses_with_one_case_per_row_and_failure_counts(tmp_path):
    comparison = regressed_comparison(tmp_path)
    root = ET.fromstring(to_junit(comparison))
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    failures = suite.findall("testcase/failure")
    assert int(suite.get("tests")) == len(cases) == len(comparison.rows)
    assert int(suite.get("failures")) == len(failures) == 5
    assert {f.get("type") for f in failures} == {"regressed", "missing"}


def test_json_report_round_trips(tmp_path):
    comparison = regressed_comparison(tmp_path)
    document = json.loads(to_json(comparison))
    assert document["failed"] is True and document["simulated"] is False
    assert document["counts"] == comparison.counts
    assert len(document["rows"]) == len(comparison.rows)
    assert {"engine", "concurrency", "scenario", "metric", "verdict", "p_value"} <= set(document["rows"][0])


# --- baseline --------------------------------------------------------------------------------


def test_update_baseline_copies_head_summary(tmp_path):
    head = load_summary(write(tmp_path, "head", base_sweep()))
    written = update_baseline(head, tmp_path / "reports" / "baseline" / "sweep")
    assert written == tmp_path / "reports" / "baseline" / "sweep" / "summary.json"
    assert written.read_bytes() == head.path.read_bytes()
    assert update_baseline(head, tmp_path / "b.json") == tmp_path / "b.json"


# --- property --------------------------------------------------------------------------------

finite = st.floats(min_value=0.0, max_value=1e6, allow_nan=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    throughputs=st.lists(finite, min_size=2, max_size=2),
    waste=st.floats(min_value=0, max_value=100),
    samples=st.lists(finite, min_size=3, max_size=6),
    status=st.sampled_from(["ok", "oom", "error"]),
    simulated=st.booleans(),
)
def test_a_run_never_regresses_against_itself(tmp_path_factory, throughputs, waste, samples, status, simulated):
    data = summary_data(
        [
            sweep_point("paged", 10, throughputs[0], samples={"output_throughput": samples}),
            sweep_point("contiguous", 10, throughputs[1], status=status),
        ],
        simulated=simulated,
    )
    point_of(data, "paged", 10)["waste"]["internal_pct"] = waste
    tmp_path = tmp_path_factory.mktemp("self")
    comparison = run_compare(tmp_path, data, copy.deepcopy(data), absolute=True)
    assert not comparison.failed
    assert comparison.counts["unchanged"] + comparison.counts["info"] == len(comparison.rows)
