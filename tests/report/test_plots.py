"""Plots of degenerate data (one time point, values a rounding error apart) draw without numpy warnings."""

from __future__ import annotations

import warnings

import pytest

from kvbench.report import plots

NEAR = [12.766909583128982, 12.766909583128982, 12.766909583128983]  # equal TTFTs, one float apart


@pytest.mark.parametrize(("xs", "logx"), [(NEAR, True), (NEAR, False), ([0.0], False), ([3.0, 3.0], True)])
def test_a_flat_range_draws_without_a_runtime_warning(tmp_path, xs, logx):
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        path = plots.lines(
            {"a": (xs, [0.5] * len(xs))}, tmp_path / "a.png", "t", "x", "y", "higher", markers=False, logx=logx
        )
        plots.line_panels({"p": {"paged p50": (xs, NEAR[: len(xs)])}}, tmp_path / "b.png", "t", "x", "y", "lower")
        plots.usage_panels({"p": {"instance 0": (xs, [1.0] * len(xs))}}, tmp_path / "c.png", "t", "x", "y", 80, "h")
    assert path.read_bytes()[:4] == b"\x89PNG"


@pytest.fixture()
def drawn(monkeypatch):
    """Figures the plot functions draw, kept open for inspection (what is drawn, not pixels)."""
    figures = []

    def keep(fig, path):
        fig.canvas.draw()  # tick labels are formatted at draw time
        figures.append(fig)
        return path

    monkeypatch.setattr(plots, "_save", keep)
    yield figures
    for fig in figures:  # kept open for the test only: pyplot holds every figure until it is closed
        plots.plt.close(fig)


def test_a_log_axis_reads_plain_numbers(tmp_path, drawn):
    """The fleet's TTFT CDF spans under two decades: its ticks read 20, 50, 100, never 2x10^1."""
    xs = [14.0, 20.0, 35.0, 60.0, 130.0]
    plots.lines(
        {"round-robin": (xs, [0.1, 0.3, 0.6, 0.9, 1.0])},
        tmp_path / "a.png",
        "t",
        "TTFT (ms)",
        "share",
        "left / higher is better",
        markers=False,
        logx=True,
    )
    ax = drawn[0].axes[0]
    labels = [t.get_text() for t in [*ax.get_xticklabels(), *ax.get_xticklabels(minor=True)] if t.get_text()]
    assert labels and not any("10^" in label or "times" in label or "×" in label for label in labels)
    assert {"20", "50", "100"} <= set(labels), labels


def test_stacked_panels_fix_a_percentage_and_count_from_zero(tmp_path, drawn):
    """watch.png: KV usage on 0-100%; zero preemptions on the floor of a 0-1 axis with whole-number ticks."""
    times = [0.0, 1.0, 2.0]
    plots.stacked_panels(
        [
            ("usage", "%", {"KV usage": (times, [20.0, 25.0, 30.0])}, None),
            ("requests", "requests", {"running": (times, [3, 5, 4])}, None),
            ("preemptions", "n", {"preemptions": (times, [0.0, 0.0, 0.0])}, None),
        ],
        tmp_path / "w.png",
        "t",
        "s",
        y_ranges=[(0, 100), (0, None), (0, None)],
    )
    usage, requests, preemptions = drawn[0].axes
    assert usage.get_ylim() == (0, 100)
    assert preemptions.get_ylim()[0] == 0 and 1 <= preemptions.get_ylim()[1] <= 1.5
    assert all(float(t).is_integer() for t in preemptions.get_yticks())
    assert requests.get_ylim()[0] == 0 and requests.get_ylim()[1] >= 5


def test_a_series_with_only_marks_draws_no_line_and_no_made_up_scale(tmp_path, drawn):
    plots.lines(
        {"contiguous": ([], [])},
        tmp_path / "t.png",
        "t",
        "C",
        "tok/s",
        "higher",
        marks={"contiguous": [(50, "OOM (170 rejected)")]},
    )
    ax = drawn[0].axes[0]
    assert not ax.get_lines() and ax.get_ylim() == (0, 1) and list(ax.get_yticks()) == []
    assert ax.get_xlim()[0] < 50 < ax.get_xlim()[1]
    assert [c.get_label() for c in ax.collections] == ["contiguous: OOM, no figure"]


def test_repeated_points_draw_their_spread_and_levels_tick_whole_numbers(tmp_path, drawn):
    """--repeat: each point's 95% CI as an error bar; concurrency 2 and 4 tick 2, 3, 4, never 2.25."""
    plots.lines(
        {"local": ([2, 4], [1543.0, 2076.0])},
        tmp_path / "t.png",
        "t",
        "concurrency",
        "tok/s",
        "higher",
        errors={"local": [825.0, 1193.0]},
    )
    ax = drawn[0].axes[0]
    (bars,) = [c for c in ax.collections if c.get_segments()]
    assert [segment[:, 1].tolist() for segment in bars.get_segments()] == [[718.0, 2368.0], [883.0, 3269.0]]
    assert all(float(t).is_integer() for t in ax.get_xticks())


def test_latency_panels_over_concurrency_tick_whole_numbers(tmp_path, drawn):
    """A server sweep at C=1 and C=4 drew its latency panels with ticks at 1.5 and 2.5."""
    panels = {"TTFT": {"local p50": ([1, 4], [5.0, 9.0])}, "TPOT": {"local p50": ([1, 4], [2.0, 3.0])}}
    plots.line_panels(panels, tmp_path / "t.png", "t", "concurrency", "ms", "lower")
    for ax in drawn[0].axes:
        assert all(float(t).is_integer() for t in ax.get_xticks())
