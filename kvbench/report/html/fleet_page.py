"""The report of a fleet run: routing policies side by side on the same arrivals."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvbench import units
from kvbench.report.diagnose import diagnose_points
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.report.fleet_report import (
    INSTANCE_TABLE,
    POLICY_TABLE,
    POLICY_TABLE_NOTE,
    SIM_COLUMNS,
    fleet_verdict,
    read_series,
    simulator_rows,
    simulator_sentence,
    write_plots,
)
from kvbench.report.html.common import draw, figures_block, findings_section, provenance_section, spec_table
from kvbench.report.html.page import Cell, Column, Page, Section, Table, Text, Verdict
from kvbench.report.html.run_files import RunFiles
from kvbench.results.fleet_meta import FleetMeta
from kvbench.results.fleet_point import FleetPoint
from kvbench.results.fleet_summary import FleetSummary
from kvbench.results.simulator_check import SimulatorCheck


def build(run: RunFiles) -> Page:
    summary = FleetSummary.from_json(run.document)
    meta, points = summary.meta, summary.points
    badges = (["SIMULATED"] if meta.simulated else []) + (["INTERRUPTED"] if meta.interrupted else [])
    policies = f"{len(points)} routing polic{'y' if len(points) == 1 else 'ies'}"
    if meta.servers:
        names = ", ".join(str(server.name) for server in meta.servers)
        title = f"kvbench fleet: {len(meta.servers)} servers over HTTP ({names}) behind kvbench's router — {policies}"
    else:
        title = (
            f"kvbench fleet: {_or_unknown(meta.instances)} instances of {_or_unknown(meta.model_name)} behind a "
            f"router — {policies}"
        )
    subtitle = f"arrivals: {_or_unknown(meta.arrivals)}; {units.count(meta.requests)} requests"
    if meta.budget_source:
        subtitle += f"; KV pool: {meta.budget_source}"
    series = [found for point in points if (found := read_series(run.directory, point.policy)) is not None]
    sections = [
        headline_section(points, meta),
        findings_section(
            # the rules read the points as summary.json holds them (a fleet's, a sweep's or a watch's)
            diagnose_points(run.document["points"], meta, Thresholds(), str(run.directory), kind="fleet"),
            "policies",
        ),
    ]
    if series:
        figures = draw(lambda: write_plots(run.directory, series, meta.simulated, meta.autoscale))
        sections.append(Section("plots", "Plots", [figures_block(figures)]))
    if meta.simulator_check is not None:
        sections.append(simulator_section(meta.simulator_check))
    sections.append(points_section(points))
    sections.append(provenance_section(meta.to_json(), run.files()))
    return Page("fleet", title, subtitle, badges, sections)


def _or_unknown(value: object) -> str:
    """A setting the run did not record shows as "?"."""
    return "?" if value is None else str(value)


def verdict(points: list[FleetPoint], meta: FleetMeta) -> Verdict:
    return Verdict(*fleet_verdict(points, meta))


def headline_section(points: list[FleetPoint], meta: FleetMeta) -> Section:
    blocks: list[Any] = [
        verdict(points, meta),
        spec_table(POLICY_TABLE, points, "headline-table", POLICY_TABLE_NOTE),
    ]
    if meta.autoscale is not None:
        a = meta.autoscale
        blocks.append(
            Text(
                [
                    f"Autoscaling: add an instance above {units.share(a.scale_up, 0)} fleet block usage, "
                    f"drain one below {units.share(a.scale_down, 0)}, over {a.window_s} s "
                    f"windows; {a.min_instances} to {a.max_instances} instances; start-up "
                    f"{a.startup_s}."
                ],
                tone="note",
            )
        )
    return Section("headline", "Verdict", blocks)


def simulator_section(check: SimulatorCheck) -> Section:
    columns = [Column(name, False) for name in SIM_COLUMNS]
    rows = [[Cell(text) for text in row] for row in simulator_rows(check)]
    note = simulator_sentence(check) + (
        " The same arrivals ran through the simulator with one instance per server, each given its server's "
        "KV pool in blocks and this run's step times (the table's decode step); its router read the instances at "
        "every scrape interval, as this run's did."
    )
    return Section(
        "simulator",
        "The simulator against this run",
        [Table("The simulator against this run", columns, rows, id="simulator-table", note=note)],
    )


def points_section(points: list[FleetPoint]) -> Section:
    subsections = []
    for p in points:
        if p.instances:
            subsections.append(
                Section(
                    f"instances-{p.policy}",
                    f"Instances under {p.policy}",
                    [spec_table(replace(INSTANCE_TABLE, title=f"Instances under {p.policy}"), p.instances, "")],
                )
            )
    return Section("points", "Per instance", [], subsections)
