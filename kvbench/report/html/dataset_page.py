"""The report of a dataset run: prompt and answer lengths, and the KV waste they imply at a max-len."""

from __future__ import annotations

from kvbench.report.dataset_report import dataset_plot, len_label
from kvbench.report.html import units
from kvbench.report.html.common import draw, figures_block, provenance_section
from kvbench.report.html.page import Cell, Column, Page, Section, Table, Text, Verdict
from kvbench.report.html.run_files import RunFiles


def build(run: RunFiles) -> Page:
    document = run.document
    meta = document["meta"]
    title = f"kvbench dataset: token lengths of {len_label(document)}"
    subtitle = f"max-len {units.count(meta.get('max_len'))}; tokens counted with {meta.get('model', '?')}"
    figures = draw(lambda: dataset_plot(document, run.directory / "lengths.png"))
    sections = [headline_section(document)]
    if figures:
        sections.append(Section("plots", "Plots", [figures_block(figures)]))
    sections.append(Section("points", "Lengths", [lengths_table(document)]))
    sections.append(provenance_section(meta, run.files()))
    return Page("dataset", title, subtitle, [], sections)


def verdict(document: dict) -> Verdict:
    meta, analytic, points = document["meta"], document.get("analytic") or {}, document["points"]
    by_engine = {p["engine"]: p for p in points}
    contiguous = by_engine.get("contiguous-max")
    paged = [p for p in points if p["engine"].startswith("paged")]
    if contiguous is not None:
        headline = (
            f"A max-len reservation ({meta.get('max_len'):,} tokens) would leave "
            f"{units.pct(contiguous.get('waste_pct'))} of its slots unwritten on these requests"
        )
    else:
        headline = f"Token lengths of {len(points)} strategies' reservations"
    sentences = []
    if analytic.get("at_mean_len_pct") is not None:
        sentences.append(
            f"The article's estimate, (max-len − mean) / max-len = ({meta.get('max_len'):,} − "
            f"{analytic.get('mean_len', 0):,.0f}) / {meta.get('max_len'):,} = "
            f"{analytic['at_mean_len_pct']:.1f}%."
        )
    for p in paged:
        sentences.append(
            f"{p['engine']}: {units.pct(p.get('waste_pct'), 2)} of its slots never written (the empty "
            "tail of each request's last block)."
        )
    return Verdict(headline, "neutral", sentences)


def headline_section(document: dict) -> Section:
    rows = [
        [
            Cell(p["engine"], p["engine"], field="engine"),
            Cell(units.count(p.get("held_tokens")), units.sort_key(p.get("held_tokens")), field="held_tokens"),
            Cell(
                units.count(p.get("written_tokens")),
                units.sort_key(p.get("written_tokens")),
                field="written_tokens",
            ),
            Cell(units.pct(p.get("waste_pct")), units.sort_key(p.get("waste_pct")), field="waste_pct"),
        ]
        for p in document["points"]
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
        [verdict(document), table, Text([document["meta"].get("note", "")], tone="note")],
    )


def lengths_table(document: dict) -> Table:
    rows = []
    for name, s in document["lengths"].items():
        rows.append(
            [
                Cell(name, name),
                *(
                    Cell(units.num(s.get(k), 1 if k == "mean" else 0), units.sort_key(s.get(k)))
                    for k in ("count", "mean", "p50", "p90", "p99", "min", "max")
                ),
            ]
        )
    rows = [[row[0], Cell(units.count(row[1].sort), row[1].sort), *row[2:]] for row in rows]
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
