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
        path = plots.lines({"a": (xs, [0.5] * len(xs))}, tmp_path / "a.png", "t", "x", "y", "higher",
                           markers=False, logx=logx)
        plots.line_panels({"p": {"paged p50": (xs, NEAR[: len(xs)])}}, tmp_path / "b.png", "t", "x", "y", "lower")
        plots.usage_panels({"p": {"instance 0": (xs, [1.0] * len(xs))}}, tmp_path / "c.png", "t", "x", "y", 80, "h")
    assert path.read_bytes()[:4] == b"\x89PNG"
