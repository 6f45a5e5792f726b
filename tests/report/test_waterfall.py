"""The memory waterfall: levels outermost first, named gaps, unavailable levels null with a reason."""

from __future__ import annotations

import json

import pytest
from rich.console import Console

from kvbench.report.waterfall import (
    CPU_LEVELS,
    CUDA_LEVELS,
    device_kind,
    waterfall_levels,
    waterfall_plot,
    waterfall_plot_name,
    waterfall_table,
)
from kvbench.results.waterfall_level import WaterfallLevel

MIB = 1024**2


def cpu_point(**changes) -> dict:
    point = {
        "engine": "paged",
        "concurrency": 10,
        "status": "ok",
        "kv_pool_bytes": 64 * MIB,
        "kv_peak_allocated_bytes": 40 * MIB,
        "kv_peak_used_bytes": 36 * MIB,
        "kv_mean_used_bytes": 20 * MIB,
        "memory": {
            "rss_peak_bytes": 900 * MIB,
            "torch_allocated_peak_bytes": None,
            "torch_reserved_peak_bytes": None,
            "torch_inactive_split_peak_bytes": None,
            "nvml_used_peak_bytes": None,
            "nvml_process_peak_bytes": None,
        },
    }
    point.update(changes)
    return point


def cuda_point() -> dict:
    point = cpu_point()
    point["memory"] = {
        "rss_peak_bytes": 2000 * MIB,
        "nvml_used_peak_bytes": 9000 * MIB,
        "nvml_process_peak_bytes": 8000 * MIB,
        "torch_reserved_peak_bytes": 7000 * MIB,
        "torch_allocated_peak_bytes": 6000 * MIB,
        "torch_inactive_split_peak_bytes": 100 * MIB,
    }
    return point


def assert_monotone(levels):
    measured = [lv.bytes for lv in levels if lv.bytes is not None]
    assert measured == sorted(measured, reverse=True), measured


def test_cpu_levels_are_monotone_with_named_gaps():
    levels = waterfall_levels(cpu_point())
    assert (
        [lv.level for lv in levels]
        == [name for name, _, _ in CPU_LEVELS]
        == ["process RSS", "KV pool", "KV allocated", "token states"]
    )
    assert_monotone(levels)
    assert [lv.bytes for lv in levels] == [900 * MIB, 64 * MIB, 40 * MIB, 36 * MIB]
    assert [lv.gap_bytes for lv in levels] == [836 * MIB, 24 * MIB, 4 * MIB, None]
    assert levels[0].gap_name == "rest of the process: weights, activations, Python"
    assert levels[1].gap_name.startswith("free KV blocks")
    assert levels[2].gap_name == "reservation + internal"
    assert levels[3].gap_name is None
    assert all(lv.reason is None for lv in levels)
    assert [WaterfallLevel.from_json(json.loads(json.dumps(lv.to_json()))) for lv in levels] == levels  # summary.json


def test_unmeasurable_levels_are_null_with_a_reason_and_never_crash():
    point = cpu_point()
    point["memory"]["rss_peak_bytes"] = None
    del point["kv_peak_used_bytes"]  # a point from an older kvbench
    levels = waterfall_levels(point)
    assert levels[0].bytes is None and "RSS" in levels[0].reason and levels[0].gap_bytes is None
    assert levels[-1].bytes is None and "older" in levels[-1].reason
    assert levels[2].gap_bytes is None  # no inner level to subtract
    assert levels[1].gap_bytes == 24 * MIB
    assert waterfall_levels({"engine": "x", "concurrency": 1})  # nothing at all: all null, still a waterfall


def test_cuda_layout_names_every_gap_and_nvml_missing_is_null():
    levels = waterfall_levels(cuda_point())
    assert device_kind(cuda_point()) == "cuda" and device_kind(cpu_point()) == "cpu"
    assert (
        [lv.level for lv in levels]
        == [name for name, _, _ in CUDA_LEVELS]
        == [
            "NVML device used",
            "NVML process used",
            "torch reserved",
            "torch allocated",
            "KV pool",
            "KV allocated",
            "token states",
        ]
    )
    assert_monotone(levels)
    gaps = {lv.level: lv.gap_name for lv in levels}
    assert gaps["NVML process used"] == "CUDA context and other libraries"
    assert gaps["torch reserved"] == "caching-allocator slack"
    assert gaps["torch allocated"] == "weights and activations"
    reserved = levels[2]
    assert reserved.gap_bytes == 1000 * MIB and reserved.inactive_split_bytes == 100 * MIB
    assert "inactive_split" in reserved.gap_note

    point = cuda_point()
    point["memory"].update(nvml_used_peak_bytes=None, nvml_process_peak_bytes=None)  # torch.cuda but no NVML
    levels = waterfall_levels(point)
    assert levels[0].bytes is None and levels[1].bytes is None and "NVML" in levels[0].reason
    assert levels[2].bytes == 7000 * MIB


def test_simulated_points_say_so_and_peaks_out_of_step_are_flagged():
    levels = waterfall_levels(cpu_point(), device="simulated")
    assert levels[0].level == "NVML device used" and "simulated" in levels[0].reason
    assert levels[4].bytes == 64 * MIB
    levels = waterfall_levels(cpu_point(memory={"rss_peak_bytes": 10 * MIB}))  # RSS peak below the pool
    assert levels[0].gap_bytes < 0 and "different instants" in levels[0].gap_note


@pytest.mark.parametrize("point", [cpu_point(), cuda_point(), cpu_point(memory={})])
def test_table_and_plot(point, tmp_path):
    console = Console(record=True, width=140)
    console.print(waterfall_table(point))
    text = console.export_text()
    assert "KV allocated" in text and "reservation + internal" in text and "peaks during the run" in text
    path = waterfall_plot(point, tmp_path / waterfall_plot_name(point), "tiny on cpu")
    assert path.name == "waterfall-paged-c10.png"
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000


def test_an_oom_points_waterfall_says_so():
    from kvbench.report.waterfall import point_label

    assert point_label({"engine": "paged", "concurrency": 50, "status": "ok"}) == "paged C=50"
    oom = {"engine": "contiguous", "concurrency": 50, "status": "oom", "completed": 30, "rejected": 170}
    assert point_label(oom) == "contiguous C=50 (OOM: 170 of 200 requests rejected)"
