"""Plots drawn into memory for report.html: the same plot functions, no file written, SVG that a page can hold
several of, the same bytes for the same data, and a PNG when an SVG would be too large."""

from __future__ import annotations

import base64
import re

from kvbench.report import figure_capture, plots


def _draw(tmp_path, name="a.png", n=5):
    return plots.lines(
        {"paged": (list(range(n)), [float(i * i) for i in range(n)])},
        tmp_path / name,
        "Throughput <vs> concurrency & more",
        "concurrency",
        "tok/s",
        "higher",
    )


def test_outside_a_capture_the_png_is_written(tmp_path):
    _draw(tmp_path)
    assert (tmp_path / "a.png").read_bytes().startswith(b"\x89PNG")


def test_inside_a_capture_nothing_is_written_and_the_svg_is_kept(tmp_path):
    with figure_capture.capture() as figures:
        _draw(tmp_path, "a.png")
        _draw(tmp_path, "b.png")
    assert list(tmp_path.iterdir()) == []
    assert [f.name for f in figures] == ["a.png", "b.png"]
    svg = figures[0].data
    assert figures[0].is_svg and svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert "<?xml" not in svg and "<metadata" not in svg and "DOCTYPE" not in svg
    assert not re.search(r'<svg[^>]*\swidth="', svg) and 'viewBox="' in svg  # scaled by CSS
    assert "Throughput &lt;vs&gt; concurrency &amp; more" in svg  # text kept as (escaped) text
    assert figures[0].title == "Throughput <vs> concurrency & more (higher is better)"
    ids_a = set(re.findall(r'\sid="([^"]+)"', figures[0].data))
    ids_b = set(re.findall(r'\sid="([^"]+)"', figures[1].data))
    assert ids_a and not ids_a & ids_b  # two figures on one page never share an id
    for ident in ids_a:  # only referenced ids are kept
        assert f"#{ident}" in svg


def test_the_same_figure_gives_the_same_bytes(tmp_path):
    with figure_capture.capture() as first:
        _draw(tmp_path)
    with figure_capture.capture() as second:
        _draw(tmp_path)
    assert first[0].data == second[0].data


def test_a_very_large_svg_becomes_a_png(tmp_path, monkeypatch):
    monkeypatch.setattr(figure_capture, "SVG_LIMIT_BYTES", 1000)
    with figure_capture.capture() as figures:
        _draw(tmp_path, n=500)
    assert figures[0].mime == "image/png"
    assert base64.b64decode(figures[0].data).startswith(b"\x89PNG")
