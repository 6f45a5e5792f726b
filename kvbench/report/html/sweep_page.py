"""The report of a sweep: paged vs contiguous (and a reference engine) at each concurrency."""

from __future__ import annotations

from typing import Any

from kvbench.report.diagnose import diagnose_points
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.report.html.common import (
    draw,
    figures_block,
    findings_section,
    provenance_section,
    spec_table,
    waterfall_section,
)
from kvbench.report.html.page import Page, Section, Table, Text, Verdict
from kvbench.report.html.run_files import RunFiles
from kvbench.report.sweep_report import (
    POINT_TABLE,
    POINT_TABLE_NOTE,
    article_spec,
    output_length_spec,
    shows_output_lengths,
    steady_warnings,
    with_output_lengths,
    write_plots,
)
from kvbench.report.sweep_verdict import sweep_verdict
from kvbench.results.article import ArticleRow, article_rows
from kvbench.results.point import Point
from kvbench.results.run_meta import RunMeta
from kvbench.results.sweep_summary import SweepSummary
from kvbench.units import recorded


def build(run: RunFiles) -> Page:
    summary = SweepSummary.from_json(run.document)
    if summary.endpoint is not None:  # servers over HTTP (sweep --target): a page of their own
        from kvbench.report.html import endpoint_page

        return endpoint_page.build(run, summary)
    meta, points = summary.meta, summary.points
    rows = summary.article_table or article_rows(points)
    badges = ["SIMULATED"] if meta.simulated else []
    if meta.interrupted:
        badges.append("INTERRUPTED")
    title = f"kvbench sweep: paged vs contiguous — {recorded(meta.model_name, '?')} on {recorded(meta.device, '?')}"
    subtitle = f"scenario {recorded(meta.scenario, '?')}"
    if meta.scenario_description:
        subtitle += f": {meta.scenario_description}"

    figures = draw(lambda: write_plots(run.directory, meta, points))
    waterfalls = {f.name: f for f in figures if f.name.startswith("waterfall-")}
    plots = [f for f in figures if f.name not in waterfalls]

    typed = summary.typed_points
    sections = [
        headline_section(rows, typed, meta),
        findings_section(diagnose_points(points, meta, Thresholds(), str(run.directory), kind="sweep")),
    ]
    if plots:
        sections.append(Section("plots", "Plots", [figures_block(plots)]))
    sections.append(points_section(typed, meta))
    waterfall = waterfall_section(points, waterfalls)
    if waterfall is not None:
        sections.append(waterfall)
    sections.append(provenance_section(meta.to_json(), run.files()))
    return Page("sweep", title, subtitle, badges, sections)


# -- the headline ---------------------------------------------------------------------------------------


def headline_table(rows: list[ArticleRow], meta: RunMeta | None = None) -> Table:
    """The article's table (:func:`~kvbench.report.sweep_report.article_spec`) as the page draws it."""
    spec = article_spec(rows, meta is not None and meta.simulated)
    return spec_table(spec, rows, "headline-table", f"{spec.caption}.")


def headline_section(rows: list[ArticleRow], points: list[Point], meta: RunMeta) -> Section:
    said = sweep_verdict(rows, points, meta)
    blocks: list[Any] = [Verdict(said.headline, said.tone, said.sentences), headline_table(rows, meta)]
    if meta.stop_description or meta.budget_source:
        blocks.append(
            Text(
                [
                    f"KV budget: {meta.budget_source}." if meta.budget_source else "",
                    f"Stop: {meta.stop_description}." if meta.stop_description else "",
                ],
                tone="note",
            )
        )
    return Section("headline", "Verdict", blocks)


# -- per point ------------------------------------------------------------------------------------------


def points_section(typed: list[Point], meta: RunMeta) -> Section:
    blocks: list[Any] = []
    warnings = steady_warnings(typed)
    if warnings:
        blocks.append(Text([w[0].upper() + w[1:] + "." for w in warnings], tone="warn"))
    blocks.append(spec_table(POINT_TABLE, typed, "points-table", POINT_TABLE_NOTE))
    if shows_output_lengths(meta):
        spec = output_length_spec(meta)
        note = "Output lengths in tokens; internal: % of the KV pool, time-averaged."
        blocks.append(spec_table(spec, with_output_lengths(typed), "output-lengths-table", note))
    return Section("points", "Per point", blocks)
