"""kvbench compare: loading, matching, noise-aware verdicts and the three report formats."""

from __future__ import annotations

import copy
import json
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvbench.errors import KvbenchError
from kvbench.report.baseline import update_baseline
from kvbench.report.compare import Comparison, Verdict, compare
from kvbench.report.compare_policy import parse_rule
from kvbench.report.compare_render import to_json, to_junit, to_markdown
from kvbench.report.summary_load import PointKey, load_summary, parse_summary

RATIO = "paged_over_contiguous_output_throughput"


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
        "kv_pool_bytes": 2_000_000_000,
        "kv_peak_allocated_bytes": 1_000_000_000,
        "kv_mean_used_bytes": 600_000_000,
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


def summary_data(points: list[dict[str, Any]], kind: str = "sweep") -> dict[str, Any]:
    meta = {"command": "kvbench sweep", "scenario": "article", "seed": 0, "simulated": True}
    return {"schema_version": 1, "kind": kind, "meta": meta, "points": points}


def base_sweep() -> dict[str, Any]:
    return summary_data(
        [
            sweep_point("paged", 10, 41.0),
            sweep_point("contiguous", 10, 32.0),
            sweep_point("paged", 30, 57.0),
            sweep_point("contiguous", 30, 18.0),
        ]
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


def row(comparison: Comparison, engine: str, concurrency: int, metric: str):
    key = PointKey(engine, concurrency, "article")
    (found,) = [r for r in comparison.rows if r.point == key and r.metric == metric]
    return found


def point_of(data: dict, engine: str, concurrency: int) -> dict:
    (found,) = [p for p in data["points"] if (p["engine"], p["concurrency"]) == (engine, concurrency)]
    return found


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


# --- verdicts --------------------------------------------------------------------------------


def test_identical_runs_pass_with_ratios_derived(tmp_path):
    comparison = run_compare(tmp_path, base_sweep(), base_sweep())
    assert not comparison.failed
    assert set(comparison.counts) == {v.value for v in Verdict}
    assert comparison.counts["unchanged"] == len(comparison.rows)
    ratio = row(comparison, "paged/contiguous", 10, RATIO)
    assert ratio.base == pytest.approx(41 / 32)


def test_ratio_drop_beyond_threshold_regresses(tmp_path):
    head = base_sweep()
    point_of(head, "paged", 10)["output_throughput"] = 36.0  # ratio 1.281 -> 1.125: -12%
    comparison = run_compare(tmp_path, base_sweep(), head)
    assert row(comparison, "paged/contiguous", 10, RATIO).verdict is Verdict.REGRESSED
    assert comparison.failed


def test_ratio_change_inside_threshold_passes(tmp_path):
    head = base_sweep()
    point_of(head, "paged", 10)["output_throughput"] = 40.0  # -2.4%
    comparison = run_compare(tmp_path, base_sweep(), head)
    assert row(comparison, "paged/contiguous", 10, RATIO).verdict is Verdict.UNCHANGED
    assert not comparison.failed


def test_uniformly_slower_machine_is_not_a_regression_unless_absolute(tmp_path):
    head = base_sweep()
    for point in head["points"]:
        point["output_throughput"] *= 0.7  # a busier CI machine: both engines 30% slower
    assert not run_compare(tmp_path, base_sweep(), head).failed
    absolute = run_compare(tmp_path / "abs", base_sweep(), head, absolute=True)
    assert row(absolute, "paged", 10, "output_throughput").verdict is Verdict.REGRESSED


def test_a_rule_naming_an_absolute_metric_enables_it(tmp_path):
    head = base_sweep()
    point_of(head, "paged", 30)["p99_ttft_ms"] = 200.0
    comparison = run_compare(tmp_path, base_sweep(), head, "p99_ttft_ms:50%")
    assert row(comparison, "paged", 30, "p99_ttft_ms").verdict is Verdict.REGRESSED
    assert all(r.metric != "output_throughput" for r in comparison.rows)


def test_waste_share_increase_regresses_and_decrease_improves(tmp_path):
    head = base_sweep()
    point_of(head, "paged", 10)["waste"]["internal_pct"] = 16.0  # +1 point, tolerance 0.5
    point_of(head, "contiguous", 10)["waste"]["reservation_pct"] = 18.0
    point_of(head, "paged", 30)["waste"]["external_pct"] = 5.3  # inside tolerance
    comparison = run_compare(tmp_path, base_sweep(), head)
    assert row(comparison, "paged", 10, "waste.internal_pct").verdict is Verdict.REGRESSED
    assert row(comparison, "contiguous", 10, "waste.reservation_pct").verdict is Verdict.IMPROVED
    assert row(comparison, "paged", 30, "waste.external_pct").verdict is Verdict.UNCHANGED


def test_fail_on_threshold_overrides_the_default(tmp_path):
    head = base_sweep()
    point_of(head, "paged", 10)["output_throughput"] = 36.0  # -12% ratio
    point_of(head, "paged", 10)["waste"]["internal_pct"] = 16.0  # +1 point
    lenient = run_compare(tmp_path, base_sweep(), head, f"{RATIO}:15%", "waste.*:2")
    assert not lenient.failed
    strict = run_compare(tmp_path / "strict", base_sweep(), head, "paged_over_*:20%", f"{RATIO}:10%")
    assert row(strict, "paged/contiguous", 10, RATIO).verdict is Verdict.REGRESSED  # last match wins


def test_deterministic_counts_are_exact(tmp_path):
    head = base_sweep()
    point_of(head, "contiguous", 30)["preemptions"] = 4
    point_of(head, "paged", 30)["rejected"] = 1
    comparison = run_compare(tmp_path, base_sweep(), head)
    assert row(comparison, "contiguous", 30, "preemptions").verdict is Verdict.REGRESSED
    assert row(comparison, "paged", 30, "rejected").verdict is Verdict.REGRESSED


def test_kv_bytes_tolerate_one_percent(tmp_path):
    head = base_sweep()
    point_of(head, "paged", 10)["kv_peak_allocated_bytes"] = 1_005_000_000
    point_of(head, "paged", 30)["kv_peak_allocated_bytes"] = 1_050_000_000
    comparison = run_compare(tmp_path, base_sweep(), head)
    assert row(comparison, "paged", 10, "kv_peak_allocated_bytes").verdict is Verdict.UNCHANGED
    assert row(comparison, "paged", 30, "kv_peak_allocated_bytes").verdict is Verdict.REGRESSED


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


def test_new_point_alone_passes(tmp_path):
    head = base_sweep()
    head["points"].append(sweep_point("paged", 50, 49.0))
    comparison = run_compare(tmp_path, base_sweep(), head)
    assert not comparison.failed and comparison.counts["new"] == 1


def test_a_metric_dropped_from_head_is_missing_and_nulls_on_both_sides_are_skipped(tmp_path):
    head = base_sweep()
    del point_of(head, "paged", 10)["fragmentation_mean"]
    comparison = run_compare(tmp_path, base_sweep(), head, absolute=True)
    assert row(comparison, "paged", 10, "fragmentation_mean").verdict is Verdict.MISSING
    assert all(r.metric != "memory.torch_allocated_peak_bytes" for r in comparison.rows)


def test_status_change_to_oom_regresses_and_skips_the_points_metrics(tmp_path):
    head = base_sweep()
    point_of(head, "contiguous", 30).update(status="oom", output_throughput=None, completed=0)
    comparison = run_compare(tmp_path, base_sweep(), head)
    status = row(comparison, "contiguous", 30, "status")
    assert status.verdict is Verdict.REGRESSED and (status.base, status.head) == ("ok", "oom")
    assert [r.metric for r in comparison.rows if r.point == PointKey("contiguous", 30, "article")] == [
        "status"
    ]


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
        return summary_data([point], kind="waste")

    comparison = run_compare(tmp_path, waste(50), waste(48))
    assert row_in(comparison, "max_concurrency").verdict is Verdict.REGRESSED
    assert row_in(comparison, "max_concurrency").point == PointKey("paged-16", 64, "waste")


def row_in(comparison: Comparison, metric: str):
    (found,) = [r for r in comparison.rows if r.metric == metric]
    return found


def test_rule_matching_nothing_and_bad_rules_are_refused(tmp_path):
    with pytest.raises(KvbenchError, match="matches no metric"):
        run_compare(tmp_path, base_sweep(), base_sweep(), "max_concurrency:1")
    for text in ("output_throughput", "output_throughput:fast", ":5%", "output_throughput:-1"):
        with pytest.raises(KvbenchError, match="--fail-on"):
            parse_rule(text)
    rule = parse_rule("waste.internal_pct:0.5")
    assert (rule.threshold.value, rule.threshold.relative) == (0.5, False)
    assert parse_rule(f"{RATIO}:5%").threshold.value == pytest.approx(0.05)


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
    head = repeated([36.0, 36.2, 35.8, 36.1, 35.9], contiguous)
    ratio = row(run_compare(tmp_path, base, head), "paged/contiguous", 10, RATIO)
    assert ratio.verdict is Verdict.REGRESSED
    assert ratio.p_value == pytest.approx(2 / 252)  # 5 vs 5, complete separation: exact p = 2 / C(10, 5)


def test_noisy_drop_beyond_threshold_is_not_significant(tmp_path):
    contiguous = [32.0] * 5
    base = repeated([30.0, 50.0, 35.0, 48.0, 42.0], contiguous)  # mean 41
    head = repeated([29.0, 49.0, 30.0, 45.0, 33.0], contiguous)  # mean 37.2: -9%
    ratio = row(run_compare(tmp_path, base, head), "paged/contiguous", 10, RATIO)
    assert ratio.verdict is Verdict.UNCHANGED
    assert ratio.p_value is not None and ratio.p_value >= 0.05
    assert "not significant" in ratio.note


def test_three_samples_fall_back_to_the_threshold(tmp_path):
    contiguous = [32.0, 32.0, 32.0]
    base = repeated([41.0, 41.0, 41.0], contiguous)
    head = repeated([36.0, 36.1, 35.9], contiguous)
    ratio = row(run_compare(tmp_path, base, head), "paged/contiguous", 10, RATIO)
    assert ratio.verdict is Verdict.REGRESSED
    assert ratio.p_value is None and "threshold rule" in ratio.note


# --- rendering -------------------------------------------------------------------------------


def regressed_comparison(tmp_path: Path) -> Comparison:
    head = base_sweep()
    point_of(head, "paged", 10)["output_throughput"] = 36.0
    head["points"] = [p for p in head["points"] if (p["engine"], p["concurrency"]) != ("contiguous", 30)]
    return run_compare(tmp_path, base_sweep(), head)


def test_markdown_renders_a_summary_line_and_a_table(tmp_path):
    comparison = regressed_comparison(tmp_path)
    text = to_markdown(comparison)
    first = text.splitlines()[0]
    assert first.startswith("**kvbench compare: FAIL") and "1 regressed" in first and "2 missing" in first
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert table[0] == "| point | metric | base | head | change | verdict | rule |"
    assert table[1] == "|---|---|---|---|---|---|---|"
    body = [line for line in table[2:] if not line.startswith("| point |") and not line.startswith("|---")]
    assert len(body) == len(comparison.rows)
    assert all(line.count(" | ") == 6 for line in body)
    assert any(RATIO in line and "**regressed**" in line and "-12.2%" in line for line in body)


def test_junit_parses_with_one_case_per_row_and_failure_counts(tmp_path):
    comparison = regressed_comparison(tmp_path)
    root = ET.fromstring(to_junit(comparison))
    suite = root.find("testsuite")
    assert suite is not None
    cases = suite.findall("testcase")
    failures = suite.findall("testcase/failure")
    assert int(suite.get("tests")) == len(cases) == len(comparison.rows)
    assert int(suite.get("failures")) == len(failures) == 3
    assert {f.get("type") for f in failures} == {"regressed", "missing"}


def test_json_report_round_trips(tmp_path):
    comparison = regressed_comparison(tmp_path)
    document = json.loads(to_json(comparison))
    assert document["failed"] is True
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
)
def test_a_run_never_regresses_against_itself(tmp_path_factory, throughputs, waste, samples, status):
    data = summary_data(
        [
            sweep_point("paged", 10, throughputs[0], samples={"output_throughput": samples}),
            sweep_point("contiguous", 10, throughputs[1], status=status),
        ]
    )
    point_of(data, "paged", 10)["waste"]["internal_pct"] = waste
    tmp_path = tmp_path_factory.mktemp("self")
    comparison = run_compare(tmp_path, data, copy.deepcopy(data), absolute=True)
    assert not comparison.failed
    assert comparison.counts["unchanged"] == len(comparison.rows)
