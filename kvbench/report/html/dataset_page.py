"""The report of a dataset run: prompt and answer lengths, and the KV waste they imply at a max-len."""

from __future__ import annotations

from kvbench import units
from kvbench.report.dataset_report import dataset_plot, len_label
from kvbench.report.html.common import draw, figures_block, provenance_section
from kvbench.report.html.page import Cell, Column, Page, Section, Table, Text, Verdict
from kvbench.report.html.run_files import RunFiles
from kvbench.results.dataset_result import DatasetResult


def build(run: RunFiles) -> Page:
    result = DatasetResult.from_json(run.document)
    meta = result.meta
    title = f"kvbench dataset: token lengths of {len_label(result)}"
    subtitle = f"max-len {units.count(meta.max_len)}; tokens counted with {meta.model or '?'}"
    figures = draw(lambda: dataset_plot(result, run.directory / "lengths.png"))
    sections = [headline_section(result)]
    if figures:
        sections.append(Section("plots", "Plots", [figures_block(figures)]))
    sections.append(Section("points", "Lengths", [lengths_table(result)]))
    sections.append(provenance_section(meta.to_json(), run.files()))
    return Page("dataset", title, subtitle, [], sections)


def verdict(result: DatasetResult) -> Verdict:
    max_len, analytic, points = result.meta.max_len, result.analytic, result.points
    contiguous = result.point("contiguous-max")
    paged = [p for p in points if p.engine.startswith("paged")]
    if contiguous is not None:
        headline = (
            f"A max-len reservation ({max_len:,} tokens) would leave "
            f"{units.pct(contiguous.waste_pct)} of its slots unwritten on these requests"
        )
    else:
        headline = f"Token lengths of {len(points)} strategies' reservations"
    sentences = []
    if analytic is not None and analytic.at_mean_len_pct is not None:
        sentences.append(
            f"The article's estimate, (max-len − mean) / max-len = ({max_len:,} − "
            f"{analytic.mean_len:,.0f}) / {max_len:,} = "
            f"{analytic.at_mean_len_pct:.1f}%."
        )
    for p in paged:
        sentences.append(
            f"{p.engine}: {units.pct(p.waste_pct, 2)} of its slots never written (the empty "
            "tail of each request's last block)."
        )
    return Verdict(headline, "neutral", sentences)


def headline_section(result: DatasetResult) -> Section:
    rows = [
        [
            Cell(p.engine, p.engine, field="engine"),
            Cell(units.count(p.held_tokens), units.sort_key(p.held_tokens), field="held_tokens"),
            Cell(units.count(p.written_tokens), units.sort_key(p.written_tokens), field="written_tokens"),
            Cell(units.pct(p.waste_pct), units.sort_key(p.waste_pct), field="waste_pct"),
        ]
        for p in result.points
    ]
    table = Table(
        "Analytic waste at each request's final length",
        [
            Column("strategy", False),
            Column("slots held at the end (tokens)"),
            Column("token states (tokens)"),
            Column("never written (%)"),
        ],
        rows,
        id="headline-table",
    )
    return Section(
        "headline",
        "Verdict",
        [verdict(result), table, Text([result.meta.note], tone="note")],
    )


def lengths_table(result: DatasetResult) -> Table:
    rows = []
    for name, s in result.lengths.items():
        rows.append(
            [
                Cell(name, name),
                Cell(units.count(s.count), units.sort_key(s.count)),
                Cell(units.num(s.mean, 1), units.sort_key(s.mean)),
                *(Cell(units.num(v, 0), units.sort_key(v)) for v in (s.p50, s.p90, s.p99, s.min, s.max)),
            ]
        )
    return Table(
        "Token lengths (tokens)",
        [
            Column("", False),
            Column("requests"),
            Column("mean"),
            Column("p50"),
            Column("p90"),
            Column("p99"),
            Column("min"),
            Column("max"),
        ],
        rows,
        id="lengths-table",
    )
