"""The report of a fleet run: routing policies side by side on the same arrivals."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvbench.report.diagnose import diagnose_points
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.report.fleet_report import (
    INSTANCE_TABLE,
    POLICY_TABLE,
    POLICY_TABLE_NOTE,
    SIM_COLUMNS,
    fleet_verdict,
    simulator_rows,
    simulator_sentence,
)
from kvbench.report.html import units
from kvbench.report.html.common import draw, figures_block, findings_section, provenance_section, spec_table
from kvbench.report.html.page import Cell, Column, Page, Section, Table, Text, Verdict
from kvbench.report.html.run_files import RunFiles
from kvbench.report.run_input import read_run_json


def build(run: RunFiles) -> Page:
    document = run.document
    meta, points = document["meta"], document["points"]
    simulated = bool(meta.get("simulated"))
    badges = (["SIMULATED"] if simulated else []) + (["INTERRUPTED"] if meta.get("interrupted") else [])
    policies = f"{len(points)} routing polic{'y' if len(points) == 1 else 'ies'}"
    if meta.get("servers"):
        names = ", ".join(str(server.get("name")) for server in meta["servers"])
        title = (
            f"kvbench fleet: {len(meta['servers'])} servers over HTTP ({names}) behind kvbench's router — {policies}"
        )
    else:
        title = (
            f"kvbench fleet: {meta.get('instances', '?')} instances of {meta.get('model_name', '?')} behind a "
            f"router — {policies}"
        )
    subtitle = f"arrivals: {meta.get('arrivals', '?')}; {units.count(meta.get('requests'))} requests"
    if meta.get("budget_source"):
        subtitle += f"; KV pool: {meta['budget_source']}"
    series = _series(run, points)
    sections = [
        headline_section(points, meta),
        findings_section(diagnose_points(points, meta, Thresholds(), str(run.directory), kind="fleet"), "policies"),
    ]
    if series:
        from kvbench.report.fleet_report import write_plots

        figures = draw(lambda: write_plots(run.directory, series, simulated, meta.get("autoscale")))
        sections.append(Section("plots", "Plots", [figures_block(figures)]))
    if meta.get("simulator_check"):
        sections.append(simulator_section(meta["simulator_check"]))
    sections.append(points_section(points))
    sections.append(provenance_section(meta, run.files()))
    return Page("fleet", title, subtitle, badges, sections)


def _series(run: RunFiles, points: list[dict]) -> list[dict]:
    """Each policy's plot series (fleet-<policy>.json), in the order of the points; a missing file is skipped."""
    found = []
    for point in points:
        data = read_run_json(run.directory, f"fleet-{point.get('policy')}.json")
        if data is not None:
            found.append(data)
    return found


def verdict(points: list[dict], meta: dict) -> Verdict:
    return Verdict(*fleet_verdict(points, meta))


def headline_section(points: list[dict], meta: dict) -> Section:
    blocks: list[Any] = [
        verdict(points, meta),
        spec_table(POLICY_TABLE, points, "headline-table", POLICY_TABLE_NOTE),
    ]
    if meta.get("autoscale"):
        a = meta["autoscale"]
        blocks.append(
            Text(
                [
                    f"Autoscaling: add an instance above {units.share(a.get('scale_up'), 0)} fleet block usage, "
                    f"drain one below {units.share(a.get('scale_down'), 0)}, over {a.get('window_s')} s "
                    f"windows; {a.get('min_instances')} to {a.get('max_instances')} instances; start-up "
                    f"{a.get('startup_s')}."
                ],
                tone="note",
            )
        )
    return Section("headline", "Verdict", blocks)


def simulator_section(check: dict) -> Section:
    columns = [Column(name, False) for name in SIM_COLUMNS]
    rows = [[Cell(text) for text in row] for row in simulator_rows(check)]
    note = simulator_sentence(check) + (
        " The same arrivals ran through the simulator with one instance per server, each given its server's "
        "KV pool in blocks and the step times fitted to this run; its router read the instances at every "
        "scrape interval, as this run's did."
    )
    return Section(
        "simulator",
        "The simulator against this run",
        [Table("The simulator against this run", columns, rows, id="simulator-table", note=note)],
    )


def points_section(points: list[dict]) -> Section:
    subsections = []
    for p in points:
        instances = p.get("instances") or []
        if instances:
            subsections.append(
                Section(
                    f"instances-{p['policy']}",
                    f"Instances under {p['policy']}",
                    [spec_table(replace(INSTANCE_TABLE, title=f"Instances under {p['policy']}"), instances, "")],
                )
            )
    return Section("points", "Per instance", [], subsections)
