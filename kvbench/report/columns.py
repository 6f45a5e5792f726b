"""A table described once: each column's heading, cell text, field and place, rendered from one description to
the console, Markdown and report.html, with one rule for a point that failed (its figures never shown).

Adding a column to such a table is one entry in its column tuple; every output picks it up.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from rich.table import Table as RichTable

from kvbench.results.fields import value_at
from kvbench.results.fleet_point import FleetPoint
from kvbench.results.point import Point

Row = TypeVar("Row")  # what a table's rows are: points (with a status) or a table's own typed rows
ERROR_TEXT_CHARS = 40  # a failed point's reason, cut to fit a console cell


@dataclass(frozen=True)
class Col(Generic[Row]):
    """One column: the text of each cell and where the column shows.

    ``figure`` columns hold what a point measured (throughput, latency): a point that did not finish its load
    (OOM, error) shows its mark in the first of them and "-" in the rest, in every output. ``key`` columns name
    the point and are the only ones an error row keeps.
    """

    heading: str  # Markdown and report.html; with its unit or its table's title giving it
    text: Callable[[Row], str]
    field: str = ""  # the summary field shown, dotted when nested (report.html's data-field); orders the rows there
    short: str = ""  # the console heading where the full one is too wide (a line break allowed)
    wide: bool = False  # only in the wide console table and Markdown (and report.html with ``page``)
    page: bool = False  # a wide column report.html shows too (its table fits 1,280 px without it otherwise)
    figure: bool = True
    key: bool = False
    numeric: bool = True  # right-aligned, and ordered as a number in report.html
    sort: Callable[[Row], Any] | None = None  # the value report.html orders by (default: the field's value)
    tone: Callable[[Row], str] | None = None  # report.html's colour of a cell: good, bad, muted, or none ("")

    def sort_value(self, row: Row) -> Any:
        if self.sort is not None:
            return self.sort(row)
        if not self.field:
            return None
        if isinstance(row, Point):
            return row.value(self.field)
        return value_at(row, self.field) if isinstance(row, Mapping) else None


@dataclass(frozen=True)
class TableSpec(Generic[Row]):
    title: str
    columns: tuple[Col[Row], ...]
    caption: str = ""  # under the console table
    narrow_caption: str = ""  # under the narrow console table only: what the wide one adds
    partial_errors: bool = False  # an error point measured what it completed: its figures stay, in red

    def failed(self, point: Row) -> bool:
        """Whether a point is drawn as failed (red) with its figures kept (``partial_errors``)."""
        return self.partial_errors and _status(point) not in ("ok", None)

    def shown(self, wide: bool) -> list[Col[Row]]:
        return [c for c in self.columns if wide or not c.wide]

    def on_page(self) -> list[Col[Row]]:
        return [c for c in self.columns if c.page or not c.wide]

    def row(self, point: Row, wide: bool = True) -> list[str]:
        """A point's cell texts; a failed point's figures replaced by its mark (OOM, or error and why)."""
        return [text for text, _ in self.marked_row(point, self.shown(wide))]

    def marked_row(self, point: Row, columns: Sequence[Col[Row]]) -> list[tuple[str, bool]]:
        """Each cell's text and whether it is a failed point's mark or a hidden figure (no value to order by).
        A row that is not a point (no status) shows every cell as its column writes it."""
        status = _status(point)
        if self.partial_errors or status is None:
            return [(c.text(point), False) for c in columns]
        if status == "error":
            cells = [(c.text(point), False) if c.key else ("", True) for c in columns]
            free = [i for i, c in enumerate(columns) if not c.key]
            reason = str(_error(point) or "no reason recorded")[:ERROR_TEXT_CHARS]
            for at, text in zip(free, ("error", reason), strict=False):
                cells[at] = (text, True)
            return cells
        if status == "ok":  # only an ok point's figures are shown (results.point.shows_figures)
            return [(c.text(point), False) for c in columns]
        mark = "OOM" if status == "oom" else str(status)
        cells, marked = [], False
        for c in columns:
            if c.figure:
                cells.append(("-" if marked else mark, True))
                marked = True
            else:
                cells.append((c.text(point), False))
        return cells

    def rows(self, points: Sequence[Row], wide: bool = True) -> list[list[str]]:
        return [self.row(p, wide) for p in points]

    def rich(self, points: Sequence[Row], wide: bool = False) -> RichTable:
        """The console table; a column narrows down to its longest word (a heading wraps at spaces, a name at
        its hyphens never), so at any terminal width a value is whole and rows stay distinct."""
        caption = " ".join(t for t in (self.caption, "" if wide else self.narrow_caption) if t)
        table = RichTable(title=self.title, caption=caption or None, show_edge=False)
        columns = self.shown(wide)
        rows = [self.row(point, wide) for point in points]
        for at, c in enumerate(columns):
            heading = c.short or c.heading
            words = [w for text in (heading, *(row[at] for row in rows)) for w in text.replace("\n", " ").split(" ")]
            narrowest = max((len(w) for w in words), default=1)
            if not c.numeric:  # a name stays on one line: "contigu…" and "contiguous-…" both lose what differs
                narrowest = max([narrowest, *(len(row[at]) for row in rows)])
            table.add_column(heading, justify="right" if c.numeric else "left", min_width=narrowest, overflow="fold")
        for point, row in zip(points, rows, strict=True):
            table.add_row(*row, style="red" if self.failed(point) else None)
        return table

    def markdown(self, points: Sequence[Row]) -> str:
        return markdown_table([c.heading for c in self.columns], self.rows(points))


def _status(row: Any) -> str | None:
    """A point's status (a JSON point, or a typed ``Point`` or ``FleetPoint``); None for a row that is not a point."""
    if isinstance(row, Mapping):
        return str(row.get("status", "ok"))
    return row.status if isinstance(row, (Point, FleetPoint)) else None


def _error(row: Any) -> Any:
    return row.get("error") if isinstance(row, Mapping) else getattr(row, "error", None)


def print_whole(console: Any, table: RichTable) -> None:
    """Print ``table`` with every column: one wider than the console (off a terminal, 160 columns) is laid out at
    its own width and left to the terminal to wrap, never cropped at the edge (the right-hand columns vanished)."""
    needed = console.measure(table).minimum
    console.print(table, width=max(console.width, needed), crop=False)


def markdown_table(headers: list[str], rows: list[list[Any]]) -> str:
    def cell(value: Any) -> str:
        if value is None:
            return "-"
        if isinstance(value, float):
            return f"{value:,.2f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
