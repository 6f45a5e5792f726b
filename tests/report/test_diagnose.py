"""Diagnosis rules on recorded points and on live exposition text, thresholds, and the alerting rules."""

from __future__ import annotations

import json
import math
import re
from dataclasses import fields

import pytest

from kvbench.engine.request import Request
from kvbench.engine.scheduler import Scheduler
from kvbench.errors import KvbenchError
from kvbench.kv.block_pool import BlockPool
from kvbench.kv.contiguous import ContiguousManager
from kvbench.measure.exporter import KvMetrics
from kvbench.report.diagnose import (
    Thresholds,
    alerting_rules,
    diagnose_points,
    diagnose_states,
    histogram_quantile,
    load_thresholds,
    read_states,
    rules_yaml,
)
from kvbench.report.diagnose.thresholds import KEYS, UNITS, parse_assignments, unknown_key
from kvbench.results.run_meta import RunMeta

META = RunMeta.from_json({"block_size": 16, "max_len": 2048, "reserve": "max"})
EXPORTED_METRICS = (
    "kvbench_kv_cache_blocks_used",
    "kvbench_kv_cache_blocks_free",
    "kvbench_kv_cache_blocks_capacity",
    "kvbench_kv_cache_fragmentation",
    "kvbench_block_alloc_latency_seconds",
    "kvbench_num_preemptions_total",
    "kvbench_requests_running",
    "kvbench_requests_waiting",
)


def healthy(**changes) -> dict:
    """A paged point with nothing wrong."""
    point = {
        "engine": "paged",
        "concurrency": 10,
        "scenario": "s",
        "status": "ok",
        "completed": 100,
        "rejected": 0,
        "preemptions": 3,
        "peak_running": 10,
        "kv_pool_bytes": 1000,
        "kv_peak_allocated_bytes": 700,
        "fragmentation_mean": 0.05,
        "waste": {
            "token_state_pct": 55.0,
            "reservation_pct": 2.0,
            "internal_pct": 1.0,
            "external_pct": 0.0,
            "free_pct": 42.0,
        },
        "metrics": {"block_alloc_latency_p99_seconds": 2e-5, "block_alloc_count": 500},
    }
    point.update(changes)
    return point


def rules_fired(points, thresholds=None) -> dict[str, list[str]]:
    diagnosis = diagnose_points(points, META, thresholds or Thresholds(), "test")
    fired: dict[str, list[str]] = {}
    for finding in diagnosis.findings:
        fired.setdefault(finding.rule, []).append(finding.source)
    return fired


def test_a_healthy_point_fires_nothing():
    diagnosis = diagnose_points([healthy()], META, Thresholds())
    assert not diagnosis.fired and diagnosis.checked == 1


CASES = {
    "fragmentation": dict(fragmentation_mean=0.31),
    "free_blocks": dict(
        waste={
            "token_state_pct": 85.0,
            "reservation_pct": 4.0,
            "internal_pct": 2.0,
            "external_pct": 0.0,
            "free_pct": 9.0,
        }
    ),
    "alloc_latency": dict(metrics={"block_alloc_latency_p99_seconds": 0.051, "block_alloc_count": 10}),
    "preemption_storm": dict(preemptions=60),
    "reservation_waste": dict(
        engine="contiguous",
        fragmentation_mean=0.2,
        waste={
            "token_state_pct": 20.0,
            "reservation_pct": 45.0,
            "internal_pct": 10.0,
            "external_pct": 0.0,
            "free_pct": 25.0,
        },
    ),
    "concurrency_capped": dict(peak_running=6),
}


@pytest.mark.parametrize("rule", sorted(CASES))
def test_each_rule_fires_on_its_own_evidence(rule):
    fired = rules_fired([healthy(**CASES[rule])])
    assert set(fired) == {rule}, fired
    finding = diagnose_points([healthy(**CASES[rule])], META, Thresholds()).findings[0]
    assert finding.source == ("contiguous C=10" if rule == "reservation_waste" else "paged C=10")
    assert finding.evidence and finding.suggestion and finding.values
    assert any(ch.isdigit() for ch in finding.evidence)  # numbers, not just words


def test_thresholds_are_exclusive_bounds_and_adjustable():
    assert not rules_fired([healthy(fragmentation_mean=0.3)])  # > 0.3 fires, 0.3 does not
    assert not rules_fired([healthy(preemptions=50)])  # 0.5 per request: at the bound
    assert "fragmentation" in rules_fired([healthy(fragmentation_mean=0.2)], Thresholds(fragmentation=0.1))
    assert not rules_fired([healthy(**CASES["alloc_latency"])], Thresholds(alloc_latency_p99_ms=100))


def test_suggestions_fit_the_engine_and_oom_is_critical():
    point = healthy(
        engine="contiguous",
        status="oom",
        status_reason="3 request(s) rejected: oom: no room",
        fragmentation_mean=0.8,
        peak_running=4,
    )
    findings = diagnose_points([point], META, Thresholds()).findings
    assert findings[0].severity == "critical" and findings[0].rule == "concurrency_capped"
    assert "OOM" in findings[0].evidence and "4 of concurrency 10" in findings[0].evidence
    frag = next(f for f in findings if f.rule == "fragmentation")
    assert "paged" in frag.suggestion and "--reserve" in frag.suggestion
    paged = diagnose_points([healthy(fragmentation_mean=0.5)], META, Thresholds()).findings[0]
    assert "--block-size" in paged.suggestion and "16" in paged.suggestion


def test_fewer_requests_than_concurrency_is_not_a_cap_and_a_failed_point_is_a_finding():
    assert not rules_fired([healthy(concurrency=50, completed=8, peak_running=8)])
    diagnosis = diagnose_points(
        [{"engine": "paged", "concurrency": 2, "status": "error", "error": "boom"}], META, Thresholds()
    )
    assert diagnosis.fired and diagnosis.checked == 0
    (finding,) = diagnosis.findings
    assert finding.rule == "point_failed" and finding.severity == "critical" and "boom" in finding.evidence
    # a point without metrics or free_pct (older runs): free share from the other parts, no latency rule
    old = healthy()
    del old["metrics"], old["waste"]["free_pct"]
    assert not rules_fired([old])


def test_threshold_file_flags_and_bad_values(tmp_path):
    path = tmp_path / "t.toml"
    path.write_text('[thresholds]\nfragmentation = 0.25\nalloc_latency_p99_ms = 20\nfor = "10m"\n')
    t = load_thresholds(path, free_blocks=0.2, fragmentation=None)
    assert (t.fragmentation, t.alloc_latency_p99_ms, t.alert_for, t.free_blocks) == (0.25, 20.0, "10m", 0.2)
    path.write_text("fragmentation = 0.4\n")  # top-level keys work too; flags win over the file
    assert load_thresholds(path, fragmentation=0.35).fragmentation == 0.35
    for text, message in [
        ("bogus = 1\n", "unknown key 'bogus'"),
        ("fragmentation = 1.5\n", "between 0 and 1"),
        ("free_blocks = -0.1\n", "non-negative"),
        ('for = "soon"\n', "duration"),
        ("fragmentation = \n", "not valid TOML"),
    ]:
        path.write_text(text)
        with pytest.raises(KvbenchError, match=message):
            load_thresholds(path)
    with pytest.raises(KvbenchError, match="cannot read"):
        load_thresholds(tmp_path / "missing.toml")


def test_key_value_assignments_by_the_files_keys(tmp_path):
    """KEY=VALUE names a threshold by its file key (``for``, not the field) and wins over the file."""
    assert parse_assignments(["fragmentation=0.25", "for=10m", "alloc_latency_p99_ms=20"]) == {
        "fragmentation": 0.25,
        "alert_for": "10m",
        "alloc_latency_p99_ms": 20.0,
    }
    path = tmp_path / "t.toml"
    path.write_text('fragmentation = 0.4\nfree_blocks = 0.2\nfor = "2m"\n')
    t = load_thresholds(path, **parse_assignments(["fragmentation=0.35", "for=1h"]))
    assert (t.fragmentation, t.free_blocks, t.alert_for, t.reservation_waste) == (0.35, 0.2, "1h", 0.5)
    for texts, message in [
        (["fragmentation"], "expected KEY=VALUE"),
        (["=0.2"], "expected KEY=VALUE"),
        (["nope=1"], "unknown key 'nope'; known: fragmentation, "),
        (["alert_for=5m"], "unknown key 'alert_for'"),
        (["fragmentation=abc"], "'abc' is not a number"),
        (["for=5m", "for=10m"], "for given twice"),
    ]:
        with pytest.raises(KvbenchError, match=message):
            parse_assignments(texts)
    for text, message in [
        ("fragmentation=2", "between 0 and 1"),
        ("max_reuse_gap=1.5", "between 0 and 1"),
        ("preemptions_per_request=2", None),  # a rate, not a share
        ("for=5x", "duration"),
        ("fragmentation=nan", "finite"),
        ("alloc_latency_p99_ms=inf", "finite"),
        ("alloc_latency_p99_ms=-1", "non-negative"),
    ]:
        if message is None:
            load_thresholds(None, **parse_assignments([text]))
            continue
        with pytest.raises(KvbenchError, match=message):
            load_thresholds(None, **parse_assignments([text]))


def test_every_threshold_is_described_once_and_reachable_by_its_key(tmp_path):
    """Each field has a key, a meaning and a unit; an unknown key, from a file or KEY=VALUE, lists them all."""
    assert [d.name for d in KEYS.values()] == [f.name for f in fields(Thresholds)]
    assert all(d.means and d.unit in UNITS for d in KEYS.values())
    assert KEYS["for"].name == "alert_for" and "alert_for" not in KEYS
    path = tmp_path / "t.toml"
    path.write_text("".join(f"{key} = {json.dumps(value)}\n" for key, value in _non_defaults().items()))
    from_file = load_thresholds(path)
    from_keys = load_thresholds(None, **parse_assignments(f"{key}={value}" for key, value in _non_defaults().items()))
    assert from_file == from_keys and all(
        getattr(from_file, d.name) != getattr(Thresholds(), d.name) for d in KEYS.values()
    )
    path.write_text("nope = 1\n")
    with pytest.raises(KvbenchError) as from_file_error:
        load_thresholds(path)
    with pytest.raises(KvbenchError) as from_key_error:
        parse_assignments(["nope=1"])
    assert str(from_file_error.value).endswith(unknown_key("nope"))
    assert str(from_key_error.value).endswith(unknown_key("nope"))


def _non_defaults() -> dict[str, float | str]:
    """A valid value other than the default for every key."""
    return {key: "1h" if d.unit == "duration" else 0.05 if d.default != 0.05 else 0.06 for key, d in KEYS.items()}


def test_histogram_quantile_matches_prometheus():
    buckets = [(0.001, 90.0), (0.01, 99.0), (0.1, 100.0), (math.inf, 100.0)]
    assert histogram_quantile(0.99, buckets) == pytest.approx(0.01)
    assert histogram_quantile(0.5, buckets) == pytest.approx(0.001 * 50 / 90)
    assert histogram_quantile(0.995, buckets) == pytest.approx(0.01 + 0.09 * 0.5)
    assert histogram_quantile(0.99, [(0.05, 0.0), (math.inf, 10.0)]) == 0.05  # all in +Inf: highest finite bound
    assert histogram_quantile(0.99, [(0.05, 0.0), (math.inf, 0.0)]) is None


def _live_contiguous() -> KvMetrics:
    """A real exporter fed by a real scheduler: max-len slabs, a queue, and one slow allocation."""
    metrics = KvMetrics(device="cpu")
    scheduler = Scheduler(ContiguousManager(BlockPool(10, 4), "max", 20))
    for i in range(3):
        scheduler.add(Request(i, 4, 4))
    metrics.begin_run("contiguous")
    scheduler.alloc_observer = metrics.alloc_observer("contiguous")
    scheduler.admit(0)  # two 5-block slabs fit, the third request waits
    for request in scheduler.running.values():
        request.output_token_ids.append(1)
    metrics.alloc_observer("contiguous")(0.09)  # a 90 ms allocation
    metrics.observe("contiguous", scheduler)
    return metrics


def test_live_rules_on_parsed_exposition():
    series = read_states(_live_contiguous().exposition())
    assert len(series) == 1 and series[0].labels == {"engine": "contiguous", "device": "cpu"}
    diagnosis = diagnose_states(series, Thresholds(), "test")
    fired = {f.rule for f in diagnosis.findings}
    # 8 token states in 40 slots: fragmentation 0.8, 0 of 10 blocks free with a request waiting
    assert fired == {"fragmentation", "free_blocks", "alloc_latency", "reservation_waste", "concurrency_capped"}
    latency = next(f for f in diagnosis.findings if f.rule == "alloc_latency")
    assert latency.severity == "critical" and latency.values["alloc_latency_p99_ms"] > 50
    loose = Thresholds(fragmentation=0.9, free_blocks=0.0, alloc_latency_p99_ms=200, reservation_waste=0.9)
    assert not diagnose_states(series, loose).fired
    with pytest.raises(KvbenchError, match="none of the metric families kvbench reads"):
        read_states("# nothing\n", "http://x")


def test_alerting_rules_follow_the_prometheus_schema_and_thresholds():
    yaml = pytest.importorskip("yaml")
    t = Thresholds(fragmentation=0.25, free_blocks=0.15, alloc_latency_p99_ms=40, alert_for="2m")
    document = yaml.safe_load(rules_yaml(t))
    assert document == alerting_rules(t)
    assert set(document) == {"groups"} and len(document["groups"]) == 1
    group = document["groups"][0]
    assert isinstance(group["name"], str) and group["name"]
    names = set()
    for rule in group["rules"]:
        assert set(rule) == {"alert", "expr", "for", "labels", "annotations"}
        assert rule["alert"].isidentifier() and rule["alert"] not in names
        names.add(rule["alert"])
        assert isinstance(rule["expr"], str) and rule["expr"].count("(") == rule["expr"].count(")")
        assert rule["for"] == "2m"
        assert rule["labels"]["severity"] in ("critical", "warning", "info")
        assert set(rule["annotations"]) == {"summary", "description"}
    exprs = {rule["alert"]: rule["expr"] for rule in group["rules"]}
    assert exprs["KvCacheFragmentationHigh"] == "kvbench_kv_cache_fragmentation > 0.25"
    assert exprs["KvCacheFreeBlocksLow"].endswith("< 0.15")
    assert "kvbench_block_alloc_latency_seconds_bucket" in exprs["KvBlockAllocLatencyHigh"]
    assert exprs["KvBlockAllocLatencyHigh"].endswith("> 0.04")
    used = set(re.findall(r"kvbench_\w+", " ".join(exprs.values())))
    exported = {name.removesuffix("_total") for name in EXPORTED_METRICS} | {"kvbench_requests_finished"}
    assert {name.removesuffix("_bucket").removesuffix("_total") for name in used} <= exported
    assert {
        "kvbench_kv_cache_fragmentation",
        "kvbench_kv_cache_blocks_free",
        "kvbench_kv_cache_blocks_capacity",
        "kvbench_num_preemptions_total",
        "kvbench_requests_waiting",
    } <= used


def test_waste_run_suggestions_know_contiguous_strategies_and_paged_block_sizes(tmp_path):
    """Waste runs name engines contiguous-max / paged-16: the advice must match the strategy."""
    import json as _json

    from kvbench.report.diagnose import Thresholds, diagnose_run

    base = {
        "status": "ok",
        "completed": 10,
        "rejected": 0,
        "preemptions": 0,
        "peak_running": 30,
        "concurrency": 256,
        "scenario": "waste",
        "fragmentation_mean": 0.75,
        "waste": {
            "token_state_pct": 24.0,
            "reservation_pct": 8.0,
            "internal_pct": 65.0,
            "external_pct": 0.0,
            "free_pct": 3.0,
        },
    }
    points = [{**base, "engine": "contiguous-max"}, {**base, "engine": "paged-16"}]
    (tmp_path / "summary.json").write_text(
        _json.dumps({"schema_version": 1, "kind": "waste", "meta": {"max_len": 2048}, "points": points})
    )
    text = _json.dumps(diagnose_run(tmp_path, Thresholds()).as_dict())
    assert "compare the paged strategies in the same table" in text and "now 16" in text and "now ?" not in text
    assert "--engines" not in text and "--reserve" not in text  # flags waste does not take


def test_findings_are_grouped_by_rule_and_ranked_worst_and_widest_first():
    from kvbench.report.diagnose.findings import Finding, grouped

    def finding(rule: str, severity: str, source: str) -> Finding:
        return Finding(rule, severity, source, f"{rule} at {source}", f"fix {rule}", {})

    findings = [
        finding("free_blocks", "warning", "contiguous C=30"),
        finding("fragmentation", "warning", "contiguous C=10"),
        finding("fragmentation", "warning", "contiguous C=30"),
        finding("concurrency_capped", "critical", "contiguous C=50"),
        finding("fragmentation", "warning", "contiguous C=50"),
        finding("preemptions", "info", "paged C=50"),
    ]
    groups = grouped(findings)
    assert [(g.severity, g.rule, len(g.cases)) for g in groups] == [
        ("critical", "concurrency_capped", 1),
        ("warning", "fragmentation", 3),
        ("warning", "free_blocks", 1),
        ("info", "preemptions", 1),
    ]
    assert [source for source, _ in groups[1].cases] == ["contiguous C=10", "contiguous C=30", "contiguous C=50"]
    assert sum(len(g.cases) for g in groups) == len(findings)  # nothing lost by grouping


def test_a_summary_with_a_mistyped_field_is_one_error_line(tmp_path, capfd):
    from kvbench.cli import main

    run = tmp_path / "run"
    assert main(["waste", "--requests", "20", "--strategies", "contiguous-max,paged", "--json", "--out", str(run)]) == 0
    capfd.readouterr()
    summary = json.loads((run / "summary.json").read_text())
    summary["points"][0]["waste"] = "a string where an object goes"
    (run / "summary.json").write_text(json.dumps(summary))
    assert main(["diagnose", str(run)]) == 2
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot diagnose it, its points lack or mistype a field" in err
