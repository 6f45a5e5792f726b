"""The sweep's console line per finished point: an OOM point is marked, with no throughput figure."""

from __future__ import annotations

from kvbench.report.progress import point_line
from kvbench.results.point import Point


def test_an_ok_point_prints_its_figures():
    point = Point(
        "paged",
        30,
        "article",
        completed=120,
        output_throughput=7_597.9,
        steady_output_throughput=7_700.0,
        steady_window_pct=80.0,
    )
    line = point_line(point)
    assert "7,597.9 output tok/s" in line and "steady 7,700.0 over 80% of the run" in line and "120 done" in line


def test_an_oom_point_prints_its_mark_and_no_figure():
    point = Point("contiguous", 50, "article", status="oom", completed=30, rejected=170, output_throughput=13_344.7)
    line = point_line(point)
    assert "OOM: 170 of 200 requests rejected" in line and "30 done, 170 rejected" in line
    assert "13,344" not in line and "tok/s" not in line
