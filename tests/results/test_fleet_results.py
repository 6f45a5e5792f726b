"""The fleet's typed results: a policy's point, its instances, the plot series, the simulator check and the
fleet's part of the metadata read back from real files and written key for key as they were; older or hand-made
documents that lack a field read its empty value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.cli import main
from kvbench.engine.timing import MeasuredTiming
from kvbench.results.fleet_meta import FleetAutoscale, FleetMeta, RateChosen
from kvbench.results.fleet_point import FleetInstance, FleetPoint
from kvbench.results.fleet_series import FleetSeries
from kvbench.results.fleet_summary import FleetSummary
from kvbench.results.simulator_check import PolicyCheck, SimulatorCheck

TARGET_RUN = json.loads((Path(__file__).parent / "data" / "fleet_target_run.json").read_text())


def _same(document, typed) -> None:
    """The typed object writes the document back exactly: equal, and the same text (key order included)."""
    assert typed.to_json() == document
    assert json.dumps(typed.to_json()) == json.dumps(document)


@pytest.fixture(scope="module")
def simulated_run(tmp_path_factory) -> Path:
    """A small simulated fleet with an SLO, autoscaling and the rate chosen from its capacity."""
    out = tmp_path_factory.mktemp("fleet") / "run"
    code = main(
        [
            "fleet", "--simulate", "--requests", "40", "--seed", "3", "--instances", "2", "--autoscale",
            "--max-instances", "3", "--policies", "round-robin,most-free-blocks", "--slo", "ttft=2000",
            "--out", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    return out


def test_a_simulated_runs_files_read_back_and_write_the_same_text(simulated_run):
    summary = json.loads((simulated_run / "summary.json").read_text())
    lines = [json.loads(line) for line in (simulated_run / "results.jsonl").read_text().splitlines()]
    assert len(summary["points"]) == len(lines) == 2
    for point, line in zip(summary["points"], lines, strict=True):
        typed = FleetPoint.from_json(point)
        _same(point, typed)
        _same(line, FleetPoint.from_json(line))
        assert typed.slo_ms == {"ttft": 2000.0} and typed.request_goodput is not None
        assert typed.p99_ttft_ms == point["p99_ttft_ms"] and typed.latency("p50", "e2el") == point["p50_e2el_ms"]
        assert [i.routed for i in typed.instances] == [i["routed"] for i in point["instances"]]
        series = json.loads((simulated_run / f"fleet-{typed.policy}.json").read_text())
        _same(series, FleetSeries.from_json(series))
    _same(summary, FleetSummary.from_json(summary))
    meta = summary["meta"]
    fleet = FleetSummary.from_json(summary).meta
    assert fleet.simulated and not fleet.interrupted and fleet.engine == meta["engines"][0]
    assert fleet.instances == 2 and fleet.requests == meta["requests"] and fleet.simulator_check is None
    assert fleet.autoscale is not None and fleet.rate_chosen is not None
    _same(meta["autoscale"], fleet.autoscale)
    _same(meta["rate_chosen"], fleet.rate_chosen)
    assert fleet.to_json() == meta and list(fleet.to_json()) == list(meta)  # the record, key for key


def test_a_fleet_of_servers_point_and_its_simulator_check_read_back_exactly():
    for name in ("killed_point", "slo_point"):
        _same(TARGET_RUN[name], FleetPoint.from_json(TARGET_RUN[name]))
    killed = FleetPoint.from_json(TARGET_RUN["killed_point"])
    alive, dead = killed.instances
    assert dead.name == "doomed" and dead.state == "dead" and dead.failure and alive.failure is None
    assert alive.label == "0 alive" and killed.rejected_by_reason == {"disconnect": 1}
    for name in ("check", "skipped_check"):
        _same(TARGET_RUN[name], SimulatorCheck.from_json(TARGET_RUN[name]))
    check = SimulatorCheck.from_json(TARGET_RUN["check"])
    assert check.timing.decode_s == TARGET_RUN["check"]["timing"]["decode_s"] and len(check.compared) == 6
    older = {
        **TARGET_RUN["check"],
        "timing": {k: v for k, v in TARGET_RUN["check"]["timing"].items() if k != "decode_per_running_s"},
    }
    assert SimulatorCheck.from_json(older).timing == check.timing  # a check without the batch term: none
    assert check.timed_by == "requests"  # fake servers count no steps
    counted = {**TARGET_RUN["check"], "timed_by": "step counters"}
    assert SimulatorCheck.from_json(counted).timed_by == "step counters"
    unsaid = {k: v for k, v in counted.items() if k != "timed_by"}
    assert SimulatorCheck.from_json(unsaid).timed_by == "requests"  # written before servers counted their steps
    skipped = SimulatorCheck.from_json(TARGET_RUN["skipped_check"])
    assert skipped.compared == [] and all(p.skipped for p in skipped.policies)
    meta = FleetMeta.from_json({"servers": TARGET_RUN["servers"], "simulator_check": TARGET_RUN["check"]})
    assert [s.name for s in meta.servers] == ["alive", "doomed"]
    assert [s.to_json() for s in meta.servers] == TARGET_RUN["servers"]
    assert meta.simulator_check == check


def test_an_older_point_without_the_later_fields_reads_their_empty_values():
    """Points written before ``duration``/``total_*_tokens`` and instance names; no SLO, no error, no notes."""
    old = {
        key: value
        for key, value in TARGET_RUN["killed_point"].items()
        if key not in ("duration", "total_input_tokens", "total_output_tokens")
    }
    old["instances"] = [{k: v for k, v in i.items() if k != "name"} for i in old["instances"]]
    point = FleetPoint.from_json(old)
    assert point.duration == 0.0 and point.total_input_tokens == 0 and point.instances[1].name is None
    assert point.instances[1].label == "1"
    written = point.to_json()
    assert "slo_ms" not in written and "error" not in written and "notes" not in written
    added = ("duration", "total_input_tokens", "total_output_tokens")
    assert [key for key in written if key not in added] == list(old)  # the old keys, in their order


def test_a_hand_made_point_keeps_what_it_has_and_reads_none_for_the_figures_it_lacks():
    point = FleetPoint.from_json({"policy": "random", "p99_ttft_ms": 12.5, "instances": [{"routed": 3}]})
    assert point.ok and point.completed == 0 and point.preemptions == 0 and point.p99_ttft_ms == 12.5
    assert point.p50_ttft_ms is None and point.kv_usage_mean is None and point.prefix_hit_rate is None
    assert point.instances == [FleetInstance(routed=3)] and point.notes == [] and point.error is None
    failed = FleetPoint.from_json({"policy": "x", "status": "error", "error": "no request completed", "notes": ["n"]})
    assert not failed.ok and failed.to_json()["error"] == "no request completed" and failed.to_json()["notes"] == ["n"]
    with pytest.raises(KeyError):
        FleetPoint.from_json({"status": "ok"})  # a point names its policy


def test_a_series_file_from_before_placements_and_names_reads_them_empty():
    series = FleetSeries.from_json({"policy": "random", "usage": {"0": [[0.0, 0.5]]}, "ttft_cdf": [], "instances": []})
    assert series.placement == [] and series.names == {} and series.events == []
    assert series.label("0") == "instance 0"
    named = FleetSeries.from_json({"policy": "random", "names": {"0": "a"}})
    assert named.label("0") == "instance 0 (a)" and named.label("1") == "instance 1"


def test_a_check_and_metadata_missing_parts_read_defaults():
    check = SimulatorCheck.from_json({"policies": [{"policy": "random", "skipped": "a server died"}]})
    assert check.timing == MeasuredTiming(0.0, 0.0, 0.0) and check.blocks_per_instance == []
    assert check.policies[0].to_json() == {"policy": "random", "skipped": "a server died"}
    assert PolicyCheck.from_json({"policy": "p", "skipped": ""}).skipped is None  # an empty reason compares it
    meta = FleetMeta.from_json({})
    assert FleetSummary.from_json({}) == FleetSummary(meta, []) and meta.to_json() == {}
    assert meta == FleetMeta() and meta.engine == "?" and meta.autoscale is None and meta.rate_chosen is None
    assert FleetMeta.from_json({"autoscale": {}, "rate_chosen": {}}).autoscale is None  # empty: none recorded
    assert FleetAutoscale.from_json({"scale_up": 0.8}).to_json()["scale_down"] is None
    assert RateChosen.from_json({"usage": 0.85}) == RateChosen(0.85, None)
