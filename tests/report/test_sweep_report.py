"""The sweep's report: the headline in words, one rule for OOM points, a per-point table that fits 100 columns."""

from __future__ import annotations

import pytest
from rich.console import Console

from kvbench.report import plots
from kvbench.report import sweep_report as report
from kvbench.report.sweep_verdict import sweep_verdict
from kvbench.results.article import article_rows
from kvbench.results.point import Point, oom_text, shows_figures
from kvbench.results.run_meta import RunMeta

MiB = 1024**2


def _point(engine: str, concurrency: int, status: str = "ok", **changes) -> dict:
    point = {
        "engine": engine,
        "concurrency": concurrency,
        "scenario": "article",
        "status": status,
        "completed": 200,
        "rejected": 0,
        "preemptions": 0,
        "output_throughput": 10_000.0,
        "steady_output_throughput": 10_500.0,
        "steady_window_s": 4.2,
        "steady_window_pct": 80.0,
        "p50_ttft_ms": 3.21,
        "p99_ttft_ms": 61.5,
        "p50_tpot_ms": 0.412,
        "p99_tpot_ms": 0.631,
        "mean_ttft_ms": 9.0,
        "std_ttft_ms": 14.0,
        "mean_tpot_ms": 0.45,
        "std_tpot_ms": 0.1,
        "p50_itl_ms": 0.4,
        "p99_itl_ms": 1.9,
        "p50_e2el_ms": 120.0,
        "p99_e2el_ms": 400.0,
        "peak_running": concurrency,
        "kv_pool_bytes": 30 * MiB,
        "kv_peak_allocated_bytes": 10 * MiB,
        "fragmentation_mean": 0.02,
        "waste": {
            "token_state_pct": 21.0,
            "reservation_pct": 0.4,
            "internal_pct": 0.3,
            "external_pct": 0.0,
            "free_pct": 78.3,
        },
    }
    point.update(changes)
    return point


def article_points() -> list[dict]:
    """The main job's shape: equal batch at C=10 and 30, the baseline out of KV memory at C=50."""
    return [
        _point("paged", 10, output_throughput=9_900.0, kv_peak_allocated_bytes=2 * MiB),
        _point("contiguous", 10, kv_peak_allocated_bytes=5 * MiB),
        _point("paged", 30, output_throughput=10_100.0, kv_peak_allocated_bytes=6 * MiB),
        _point("contiguous", 30, kv_peak_allocated_bytes=20 * MiB),
        _point("paged", 50, kv_peak_allocated_bytes=int(13.7 * MiB)),
        _point(
            "contiguous",
            50,
            "oom",
            completed=30,
            rejected=170,
            peak_running=30,
            output_throughput=13_344.7,
            steady_output_throughput=23_440.7,
            steady_window_s=0.01,
            steady_window_pct=2.0,
            kv_peak_allocated_bytes=int(29.7 * MiB),
        ),
    ]


def findings(points: list[dict], meta: dict | None = None) -> list[str]:
    """The verdict's sentences after its headline."""
    run = None if meta is None else RunMeta.from_json(meta)
    return sweep_verdict(article_rows(points), [Point.from_json(p) for p in points], run).sentences


def test_the_finding_in_words_is_computed_from_the_run():
    points = article_points()
    typed = [Point.from_json(p) for p in points]
    verdict = sweep_verdict(article_rows(points), typed, RunMeta.from_json({"reserve": "max", "max_len": 2048}))
    assert verdict.headline.startswith("Paging held the load the contiguous baseline could not: at C=50")
    assert verdict.tone == "good"
    memory, equal, oom, *_ = verdict.sentences
    assert (
        memory == "KV memory at peak: paged needed 60% to 70% less than contiguous where both completed (C=10, C=30)."
    )
    assert equal.startswith("At equal batch (C=10, C=30) both engines held the same requests. Paged ran at 0.99x and ")
    assert "1.01x contiguous's speed." in equal
    assert "equal within the ±10%" in equal and "less KV memory" not in equal  # said once, the sentence before
    assert "At C=50 the contiguous baseline ran out of KV memory" in oom
    assert (
        "Reserving max-len (2,048 tokens)" in oom and "held 30 requests at once in 29.70 MiB (99% of the pool)" in oom
    )
    assert "rejected 170 of 200." in oom and "Paging held all 50 in 13.70 MiB (46% of the pool)." in oom
    # short sentences: no sentence of either finding runs past 30 words
    for finding in verdict.sentences:
        assert max(len(sentence.split()) for sentence in finding.split(". ")) <= 30, finding


def test_the_finding_says_when_single_runs_differ_and_judges_repeats_by_their_intervals():
    points = article_points()[:2]
    points[0]["output_throughput"] = 7_000.0
    assert "not equal within ±10% in this single run" in findings(points)[0]
    for point, ci in zip(points, (200.0, 300.0), strict=True):
        point["output_throughput_ci95"] = ci
    assert "do not overlap: C=10" in findings(points)[0]
    points[0]["output_throughput"] = 9_600.0
    assert "equal: the 95% confidence intervals overlap" in findings(points)[0]
    same = [_point("paged", 10), _point("contiguous", 10)]
    assert "equal by construction" in findings(same, {"simulated": True})[0]


def test_a_baseline_that_queued_is_a_batch_difference_not_equal_batch():
    points = [_point("paged", 50), _point("contiguous", 50, peak_running=30, output_throughput=6_000.0)]
    line = findings(points)[0]
    assert "held only 30 requests at once" in line and "where paging held 50" in line and "1.67x" in line


def test_the_title_promises_a_confidence_interval_only_with_repeats():
    def title(points):
        console = Console(width=200, record=True)
        console.print(report.article_table(report.article_rows(points), simulated=False))
        return console.export_text().splitlines()[0]

    points = article_points()
    assert "±" not in title(points) and "(measured)" in title(points)
    for point in points:
        point["output_throughput_ci95"] = 12.0
    assert "± is the 95% CI over repeats" in title(points)


def test_the_per_point_table_fits_100_columns_one_line_per_point():
    points = article_points()
    points[0].update(output_throughput=123_456.7, p50_ttft_ms=12_345.0, p99_ttft_ms=98_765.0, completed=12_000)
    console = Console(width=100, record=True)
    console.print(report.POINT_TABLE.rich([Point.from_json(p) for p in points]))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 100
    rows = [line for line in lines if line.lstrip().startswith(("paged", "contiguous"))]
    assert len(rows) == len(points)  # no cell wrapped onto a second line
    assert "0.412/0.631" in rows[0]  # TPOT on a CPU: sub-millisecond, three figures
    assert "…" not in "".join(rows)  # nothing cut short either
    oom_row = next(row for row in rows if "30/170" in row)
    assert "OOM" in oom_row and "13,345" not in oom_row and "23,441" not in oom_row
    wide = Console(width=250, record=True)
    wide.print(report.POINT_TABLE.rich([Point.from_json(p) for p in points], wide=True))
    text = wide.export_text()
    assert "E2EL" in text and "preempt" in text and "29.70 MiB" in text


def test_one_rule_for_oom_points():
    points = article_points()
    oom = points[-1]
    assert not shows_figures(oom) and shows_figures(points[0])
    assert oom_text(oom) == "OOM: 170 of 200 requests rejected"
    series, latency, marks = report.plot_series([Point.from_json(p) for p in points])
    assert series["contiguous"] == ([10, 30], [10_000.0, 10_000.0]) and series["paged"][0] == [10, 30, 50]
    assert all(
        50 not in xs for panel in latency.values() for label, (xs, _) in panel.items() if label.startswith("contiguous")
    )
    assert marks == {"contiguous": [(50, "OOM (170 rejected)")]}


@pytest.fixture()
def drawn(monkeypatch):
    """Figures the plot functions draw, kept open for inspection."""
    figures = []

    def keep(fig, path):
        figures.append(fig)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    yield figures
    for fig in figures:  # kept open for the test only: pyplot holds every figure until it is closed
        plots.plt.close(fig)


def test_plots_mark_oom_points_and_never_draw_them(tmp_path, drawn):
    points = article_points()
    report.write_plots(
        tmp_path, RunMeta.from_json({"model_name": "tiny", "device": "cpu", "scenario": "article"}), points
    )
    by_name = {fig.axes[0].get_title().split("\n")[0]: fig for fig in drawn if fig.axes}
    throughput = by_name["Output throughput vs concurrency"].axes[0]
    drawn_lines = {line.get_label(): list(line.get_xdata()) for line in throughput.get_lines()}
    assert drawn_lines["contiguous"] == [10, 30] and drawn_lines["paged"] == [10, 30, 50]
    marks = [c for c in throughput.collections if "OOM" in c.get_label()]
    assert len(marks) == 1 and marks[0].get_offsets()[0][0] == 50
    assert any("OOM (170 rejected)" in text.get_text() for text in throughput.texts)
    latency = next(fig for fig in drawn if len(fig.axes) == 2 and "TTFT" in fig.axes[0].get_title())
    for ax in latency.axes:
        assert all(50 not in list(line.get_xdata()) for line in ax.get_lines() if "contiguous" in line.get_label())
        assert any("OOM" in c.get_label() for c in ax.collections)
    memory = by_name["KV memory breakdown per point"].axes[0]
    labels = [tick.get_text() for tick in memory.get_xticklabels()]
    assert labels[-2] == "contiguous\nC=50\nOOM"  # ordered by concurrency, then engine
    hatched = {round(patch.get_x() + patch.get_width() / 2) for patch in memory.patches if patch.get_hatch()}
    assert hatched == {4}


def test_blocks_over_time_is_titled_in_a_plain_sentence_and_marks_the_oom_line(tmp_path, drawn):
    import json

    points = article_points()
    for engine in ("paged", "contiguous"):
        (tmp_path / f"timeline-{engine}-c50.json").write_text(
            json.dumps(
                {"engine": engine, "concurrency": 50, "total_blocks": 3890, "time_s_blocks": [[0, 10], [1.0, 20]]}
            )
        )
    report.write_plots(
        tmp_path,
        RunMeta.from_json({"model_name": "tiny", "device": "cpu", "scenario": "article", "block_size": 16}),
        points,
    )
    fig = next(fig for fig in drawn if fig.axes and fig.axes[0].get_title().startswith("KV blocks in use"))
    title = fig.axes[0].get_title()
    assert title.splitlines()[0] == "KV blocks in use over time at concurrency 50, in a pool of 3,890 blocks"
    assert title.splitlines()[-1] == "(the same work in fewer blocks is better)"
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert "contiguous (OOM: 170 of 200 requests rejected)" in labels and "paged" in labels


def test_on_a_busy_machine_the_verdict_is_judged_per_cpu_second():
    """Wall-clock TPS 0.80x while the engines had a core 40% of the time: per CPU-second both did the same
    work, and the finding says so (and why the wall figure is off)."""
    paged = _point("paged", 30, output_throughput=8_000.0, total_output_tokens=30_000, duration=3.75, cpu_time_s=1.5)
    contiguous = _point("contiguous", 30, total_output_tokens=30_000, duration=3.0, cpu_time_s=1.52)
    line = findings([paged, contiguous], {"threads": {"threads": 1}})[0]
    assert "Paged ran at 0.80x contiguous's speed. The machine was busy" in line
    assert "a core for 40% of their steps' wall time" in line and "paged did 1.01x" in line
    assert "equal within the ±10%" in line
    quiet = [dict(paged, cpu_time_s=3.7, output_throughput=8_000.0), dict(contiguous, cpu_time_s=2.95)]
    assert "busy" not in findings(quiet)[0]  # a quiet machine: the wall clock is judged
    assert "not equal within ±10%" in findings(quiet)[0]
