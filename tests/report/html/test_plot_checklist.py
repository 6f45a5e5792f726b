"""One checklist over every plot of every run kind, as its report draws it: a title, labelled axes, which way is
better (where a direction exists), ticks legible at the page's size, whole-number ticks where the axis counts
things, and the axes a ratio or a share is read from starting at zero."""

from __future__ import annotations

import math

import pytest
from run_kinds import RUN_KINDS

from kvbench.report import figure_capture
from kvbench.report.html import build_page

RUNS = RUN_KINDS
# plots that describe rather than rank (no side of them is better; the server's KV usage says what its top means)
NO_DIRECTION = ("lengths.png", "waterfall-", "kv_usage.png")
DIRECTION_WORDS = ("better", "further left: less memory")
MIN_TICK_POINTS = 8.0  # at the page's size a figure is shown at most at its own width: 8 pt stays legible
MIN_TEXT_POINTS = 7.0  # annotations and legends beside the data may be a little smaller, never the 5 px of old
COUNT_LABELS = ("concurrency", "requests", "blocks in use", "instances")  # axes that count whole things
FROM_ZERO = ("output tokens / s", "share of kv pool", "blocks in use", "(%)")  # read as ratios or shares


def _figures(request, run: str, monkeypatch) -> list[tuple[str, object]]:
    drawn: list[tuple[str, object]] = []
    real = figure_capture.render

    def keep(fig, name):
        drawn.append((name, fig))
        return real(fig, name)

    monkeypatch.setattr(figure_capture, "render", keep)
    build_page(request.getfixturevalue(run))
    return drawn


def _counts(label: str) -> bool:
    label = label.lower()
    shares = "%" in label or "/ s" in label or "share" in label
    return any(word in label for word in COUNT_LABELS) and not shares


@pytest.mark.parametrize("run", RUNS)
def test_every_plot_passes_the_checklist(request, run, monkeypatch):
    figures = _figures(request, run, monkeypatch)
    assert figures, f"{run} drew no plot"
    for name, fig in figures:
        title = figure_capture.figure_title(fig)
        assert title, f"{name}: no title"
        axes = [ax for ax in fig.get_axes() if ax.get_visible() and (ax.lines or ax.patches or ax.collections)]
        labels = [label for ax in axes for label in (ax.get_xlabel(), ax.get_ylabel()) if label.strip()]
        assert axes and labels, f"{name}: axes without labels"
        if not name.startswith(NO_DIRECTION):
            said = " ".join([title, *labels]).lower()
            assert any(word in said for word in DIRECTION_WORDS), f"{name}: which way is better is not said"
        texts = [t for t in fig.findobj(match=lambda artist: hasattr(artist, "get_fontsize")) if t.get_text()]
        smallest = min(texts, key=lambda t: t.get_fontsize())
        assert smallest.get_fontsize() >= MIN_TEXT_POINTS, f"{name}: {smallest.get_text()!r} is too small to read"
        for ax in axes:
            ticks = [t for t in ax.get_xticklabels() + ax.get_yticklabels() if t.get_text()]
            assert min(t.get_fontsize() for t in ticks) >= MIN_TICK_POINTS, f"{name}: tick labels too small"
            for label, axis, low_high in (
                (ax.get_xlabel(), ax.xaxis, ax.get_xlim()),
                (ax.get_ylabel(), ax.yaxis, ax.get_ylim()),
            ):
                if _counts(label) and axis.get_scale() == "linear":
                    shown = [v for v in axis.get_majorticklocs() if min(low_high) <= v <= max(low_high)]
                    assert all(math.isclose(v, round(v)) for v in shown), f"{name}: {label!r} ticks {shown}"
            ylabel = ax.get_ylabel().lower()
            if ax.get_yscale() == "linear" and any(word in ylabel for word in FROM_ZERO):
                assert min(ax.get_ylim()) <= 0, f"{name}: {ylabel!r} does not start at zero ({ax.get_ylim()})"
