"""Plots drawn into memory instead of files, for the HTML report.

Every plot function ends in ``plots._save``, which hands the finished figure to :func:`take`. Outside
:func:`capture` nothing changes (the PNG file is written); inside it the figure is rendered to SVG and collected
instead, so the report embeds exactly the plots the run wrote, from the same code.

The SVG keeps text as text (smaller, searchable, read by screen readers), carries no date (the same data gives
the same bytes), and its internal ids are salted with the figure's name and pruned to those it references, so
several figures share one HTML page without clashing ids. A figure whose SVG would be very large (a line with
hundreds of thousands of points) is embedded as a PNG instead.
"""

from __future__ import annotations

import base64
import io
import re
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path

SVG_LIMIT_BYTES = 600_000  # above this, a PNG is smaller and draws faster
PNG_DPI = 110  # the run's own PNG files use the same

_ACTIVE: ContextVar[list[CapturedFigure] | None] = ContextVar("kvbench_figure_capture", default=None)


@dataclass(frozen=True)
class CapturedFigure:
    name: str  # the file name the plot is written to in a run directory (throughput.png)
    title: str  # the figure's titles, one line: its text alternative
    mime: str  # image/svg+xml or image/png
    data: str  # the SVG markup, or the PNG in base64
    aspect: float = 1.5  # width / height, so a page can give wide figures a full row

    @property
    def wide(self) -> bool:
        return self.aspect > 1.9

    @property
    def is_svg(self) -> bool:
        return self.mime == "image/svg+xml"

    @property
    def size_bytes(self) -> int:
        return len(self.data.encode("utf-8"))


@contextmanager
def capture() -> Iterator[list[CapturedFigure]]:
    """Collect, in drawing order, every figure the plot functions finish while the block runs."""
    sink: list[CapturedFigure] = []
    token = _ACTIVE.set(sink)
    try:
        yield sink
    finally:
        _ACTIVE.reset(token)


def take(fig, path: Path) -> bool:
    """Called by ``plots._save``: keep ``fig`` when capturing (True), else leave it to be written (False)."""
    sink = _ACTIVE.get()
    if sink is None:
        return False
    sink.append(render(fig, Path(path).name))
    return True


def figure_title(fig) -> str:
    """The suptitle and every axes title, newlines folded: what the figure shows, in words."""
    parts = []
    suptitle = getattr(fig, "_suptitle", None)
    if suptitle is not None and suptitle.get_text().strip():
        parts.append(suptitle.get_text())
    for ax in fig.get_axes():
        if ax.get_visible() and ax.get_title().strip():
            parts.append(ax.get_title())
    return " — ".join(_one_line(part) for part in parts)


def _one_line(title: str) -> str:
    """A title's lines as one: joined by a dash, a line in parentheses (a comment on the one above) by a space."""
    lines = [" ".join(line.split()) for line in title.splitlines() if line.strip()]
    text = lines[0] if lines else ""
    for line in lines[1:]:
        text += f" {line}" if line.startswith("(") else f" — {line}"
    return text


def render(fig, name: str) -> CapturedFigure:
    import matplotlib

    title = figure_title(fig)
    width, height = fig.get_size_inches()
    aspect = float(width / height) if height else 1.5
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": name}):
        buffer = io.BytesIO()
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None, "Format": None, "Type": None})
    svg = clean_svg(buffer.getvalue().decode("utf-8"))
    if len(svg.encode("utf-8")) <= SVG_LIMIT_BYTES:
        return CapturedFigure(name, title, "image/svg+xml", svg, aspect)
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=PNG_DPI, metadata={"Software": None})
    return CapturedFigure(name, title, "image/png", base64.b64encode(buffer.getvalue()).decode("ascii"), aspect)


_PROLOGUE = re.compile(r"\A.*?(?=<svg\b)", re.S)
_METADATA = re.compile(r"\s*<metadata>.*?</metadata>", re.S)
_ID = re.compile(r'\sid="([^"]*)"')
_REFERENCE = re.compile(r'(?:href="#|url\(#)([^")]+)')
_SIZE = re.compile(r'\s(width|height)="[^"]*pt"')


def clean_svg(svg: str) -> str:
    """Matplotlib's SVG as an element to place in HTML: no XML prologue or metadata, no fixed size (CSS scales
    it by its viewBox), and only the ids something inside refers to (group ids such as ``figure_1`` would
    repeat on a page holding several figures)."""
    svg = _PROLOGUE.sub("", svg, count=1)
    svg = _METADATA.sub("", svg)
    referenced = set(_REFERENCE.findall(svg))
    svg = _ID.sub(lambda m: m.group(0) if m.group(1) in referenced else "", svg)
    head_end = svg.index(">")
    return _SIZE.sub("", svg[:head_end]) + svg[head_end:]
