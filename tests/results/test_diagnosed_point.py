"""A point as the run rules read it: any command's point (sweep, waste, fleet), a missing or non-numeric figure
None (the rule needing it does not fire), a part that is not an object an error (a corrupt file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.results.diagnosed_point import DiagnosedPoint
from kvbench.results.fleet_point import FleetInstance
from kvbench.results.waste_shares import WasteShares
from kvbench.values import number

DATA = Path(__file__).parent / "data"


def test_a_sweep_point_s_figures():
    point = DiagnosedPoint.from_json(
        {
            "engine": "contiguous",
            "concurrency": 8,
            "status": "oom",
            "status_reason": "2 rejected",
            "completed": 6,
            "peak_running": 4,
            "fragmentation_mean": 0.4,
            "waste": {"token_state_pct": 50.0, "reservation_pct": 30.0, "internal_pct": 0.0, "external_pct": 5.0},
            "metrics": {"block_alloc_latency_p99_seconds": 2e-5, "block_alloc_count": 500},
        }
    )
    assert point.label == "contiguous C=8" and not point.is_fleet and point.status_reason == "2 rejected"
    assert point.peak_running == 4.0 and point.rejected is None and point.preemptions is None
    assert point.waste.free_share == pytest.approx(0.15) and point.alloc_latency_p99_s == 2e-5
    assert point.alloc_count == 500


def test_what_a_point_lacks_or_mistypes_is_none_and_a_part_that_is_not_an_object_is_an_error():
    point = DiagnosedPoint.from_json(
        {"concurrency": 2, "preemptions": True, "completed": "12", "duration": float("nan")}
    )
    assert point.label == "None C=2" and point.engine is None
    assert point.preemptions is None and point.completed is None and point.duration is None
    assert point.waste == WasteShares() and point.waste.free_share is None and point.alloc_count == "?"
    assert number(float("inf")) == float("inf") and number(3) == 3.0 and number(None) is None
    with pytest.raises(AttributeError):
        DiagnosedPoint.from_json({"engine": "paged", "concurrency": 1, "waste": "a string where an object goes"})
    with pytest.raises(AttributeError):
        DiagnosedPoint.from_json({"engine": "paged", "concurrency": 1, "instances": ["not an instance"]})


def test_a_fleet_point_and_its_instances():
    point = DiagnosedPoint.from_json(
        {
            "engine": "paged/round-robin",
            "policy": "round-robin",
            "concurrency": 0,
            "free_blocks_imbalance_mean": 600.0,
            "instances": [
                {"index": 0, "free_share_mean": 0.02, "routed": 90, "preemptions": 7, "total_blocks": 1000},
                {"index": 1, "usage_mean": 0.5, "total_blocks": 500},
            ],
        }
    )
    assert point.is_fleet and point.label == "fleet paged/round-robin" and point.free_blocks_imbalance_mean == 600.0
    first, second = point.instances
    assert first == FleetInstance(0, routed=90, preemptions=7, total_blocks=1000, free_share_mean=0.02)
    assert second.free_share_mean is None and second.usage_mean == 0.5 and second.preemptions == 0


def test_an_instance_s_figure_that_is_not_a_number_reads_none_and_a_number_reads_as_written():
    point = DiagnosedPoint.from_json(
        {
            "engine": "paged/random",
            "policy": "random",
            "concurrency": 0,
            "instances": [{"index": 3, "free_share_mean": "low", "usage_mean": float("nan"), "total_blocks": True}],
        }
    )
    (instance,) = point.instances
    assert instance.free_share_mean is None and instance.usage_mean is None and instance.total_blocks is None
    written = FleetInstance.from_json({"total_blocks": 512, "usage_mean": 0.25})
    assert type(written.total_blocks) is int and written.to_json()["total_blocks"] == 512


def test_a_written_server_point_reads_as_its_sweep_label():
    data = json.loads((DATA / "endpoint_points.jsonl").read_text().splitlines()[1])
    point = DiagnosedPoint.from_json(data)
    assert point.label == f"{data['engine']} C={data['concurrency']}" and point.duration == data["duration"]
    assert point.status == data["status"] == "error" and point.error == data["error"]
