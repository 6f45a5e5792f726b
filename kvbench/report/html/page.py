"""What an HTML report page holds, independent of the run kind: sections of blocks (text, a verdict, tables,
figures, findings, facts). Each run kind's builder fills a :class:`Page`; one template draws every kind, so a
new kind needs only its builder, and a section appears only when the run has its data."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvbench.report.figure_capture import CapturedFigure


@dataclass
class Text:
    """Paragraphs; ``tone`` 'warn' or 'note' draws them as a call-out."""

    paragraphs: list[str]
    tone: str = ""
    kind: str = "text"


@dataclass
class Verdict:
    """The headline: one line that answers the run's question, and the sentences that explain it."""

    headline: str
    tone: str  # good | bad | warn | neutral
    sentences: list[str] = field(default_factory=list)
    kind: str = "verdict"


@dataclass
class Column:
    label: str  # with its unit, e.g. "output throughput (tok/s)"
    numeric: bool = True


@dataclass
class Cell:
    text: str
    sort: float | str | None = None  # the value a sortable table orders by (None: the text)
    tone: str = ""
    field: str = ""  # the summary field it shows (data-field), for readers and tests


@dataclass
class Table:
    caption: str
    columns: list[Column]
    rows: list[list[Cell]]
    note: str = ""
    sortable: bool = True
    id: str = ""
    collapsed: bool = False  # drawn closed, its caption the line that opens it (rows a reader rarely needs)
    kind: str = "table"


@dataclass
class Figure:
    figure: CapturedFigure
    caption: str = ""
    kind: str = "figure"

    @property
    def title(self) -> str:
        return self.figure.title


@dataclass
class Figures:
    """Plots laid out side by side where the page is wide enough."""

    items: list[Figure]
    kind: str = "figures"


@dataclass
class FindingItem:
    severity: str  # critical | warning | info
    rule: str
    cases: list[tuple[str, str]]  # (source, evidence) of each point or series the rule fired on
    suggestion: str


@dataclass
class Findings:
    summary: str
    items: list[FindingItem]
    not_evaluated: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    measurements: list[str] = field(default_factory=list)
    kind: str = "findings"


@dataclass
class Fact:
    label: str
    value: str
    code: bool = False  # monospace (a command line, a revision, a path)


@dataclass
class Facts:
    items: list[Fact]
    kind: str = "facts"


@dataclass
class Section:
    id: str
    title: str
    blocks: list[Any] = field(default_factory=list)  # Text, Verdict, Table, Figure, Figures, Findings, Facts
    subsections: list[Section] = field(default_factory=list)
    layout: str = ""  # "pair": its blocks side by side on a wide page (a table beside its plot)

    @property
    def empty(self) -> bool:
        return not self.blocks and all(sub.empty for sub in self.subsections)


@dataclass
class Page:
    kind: str  # sweep, waste, ..., compare
    title: str
    subtitle: str = ""
    badges: list[str] = field(default_factory=list)  # SIMULATED, INTERRUPTED, ...
    sections: list[Section] = field(default_factory=list)  # the first is the headline

    def figures(self) -> list[CapturedFigure]:
        """Every embedded plot, in page order."""
        found: list[CapturedFigure] = []

        def walk(blocks: list[Any], subsections: list[Section]) -> None:
            for block in blocks:
                if isinstance(block, Figure):
                    found.append(block.figure)
                elif isinstance(block, Figures):
                    found.extend(item.figure for item in block.items)
            for sub in subsections:
                walk(sub.blocks, sub.subsections)

        for section in self.sections:
            walk(section.blocks, section.subsections)
        return found
