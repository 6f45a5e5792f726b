"""The report of ``sweep --target``: servers over HTTP side by side, with their KV cache as /metrics showed it."""

from __future__ import annotations

from kvbench.report.diagnose import diagnose_points
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.report.endpoint_report import (
    FIND_MAX_COLUMNS,
    POINT_TABLE,
    find_max_rows,
    level_text,
    ordered,
    write_endpoint_plots,
)
from kvbench.report.html.common import draw, figures_block, findings_section, provenance_section, spec_table
from kvbench.report.html.page import Cell, Column, Page, Section, Table, Verdict
from kvbench.report.html.run_files import RunFiles
from kvbench.results.find_max_search import Search
from kvbench.results.point import Point
from kvbench.results.sweep_summary import SweepSummary
from kvbench.units import recorded


def build(run: RunFiles, summary: SweepSummary | None = None) -> Page:
    """The page of a ``sweep --target`` run (``summary``: its ``summary.json``, where the caller has read it)."""
    summary = summary or SweepSummary.from_json(run.document)
    meta, points = summary.meta, summary.typed_points
    title = f"kvbench sweep of servers over HTTP: {recorded(meta.model_name, '?')} at {recorded(meta.device, '?')}"
    subtitle = f"scenario {recorded(meta.scenario, '?')}"
    figures = draw(lambda: write_endpoint_plots(run.directory, meta, points))
    timelines = [f for f in figures if f.name.startswith("timeline-")]
    plots = [f for f in figures if f not in timelines]
    sections = [
        Section("headline", "Verdict", [verdict(points, summary.findings or []), points_table(points)]),
        findings_section(
            diagnose_points(summary.points, meta, Thresholds(), str(run.directory), run.directory, "sweep")
        ),
    ]
    searches = summary.endpoint.find_max if summary.endpoint else []
    if searches:
        sections.append(Section("find-max", "Highest load meeting the SLO", [find_max_table(searches)]))
    if plots:
        sections.append(Section("plots", "Plots", [figures_block(plots)]))
    if timelines:
        sections.append(
            Section(
                "timelines", "Per point over time: client throughput and server KV usage", [figures_block(timelines)]
            )
        )
    sections.append(provenance_section(meta.to_json(), run.files()))
    return Page("sweep", title, subtitle, [], sections)


def verdict(points: list[Point], findings: list[str]) -> Verdict:
    failed = [p for p in points if p.status != "ok"]
    lines = list(findings)
    if failed:
        lines.insert(
            0,
            f"{len(failed)} point(s) had failed requests: "
            + "; ".join(f"{p.engine} {level_text(p)}: {p.error}" for p in failed[:3]),
        )
    done = [p for p in points if p.completed]
    if not done:
        return Verdict("No point completed a request", "bad", lines)
    best = max(done, key=lambda p: p.output_throughput)
    headline = f"Best: {best.engine} at {level_text(best)}, {best.output_throughput:,.0f} output tok/s"
    return Verdict(headline, "bad" if failed else "neutral", lines)


def points_table(points: list[Point]) -> Table:
    note = (
        "Latencies in ms (p50/p99), vllm bench serve's definitions; KV use: the server's KV cache usage as its "
        "/metrics reported it, peak and mean over the point, in %; run/wait peak: requests running and "
        "waiting on the server; '-': not measured or not exposed by the server."
    )
    return spec_table(POINT_TABLE, ordered(points), "endpoint-table", note)


def find_max_table(searches: list[Search]) -> Table:
    columns = [Column(name, False) for name in FIND_MAX_COLUMNS]
    rows = [[Cell(text) for text in row] for row in find_max_rows(searches)]
    return Table("The highest load meeting the SLO", columns, rows, sortable=False)
