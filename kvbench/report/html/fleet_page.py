"""The report of a fleet run: routing policies side by side on the same arrivals."""

from __future__ import annotations

from typing import Any

from kvbench.report.diagnose import diagnose_points
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.report.fleet_report import (
    SIM_COLUMNS,
    fleet_verdict,
    instance_label,
    simulator_rows,
    simulator_sentence,
)
from kvbench.report.html import units
from kvbench.report.html.common import draw, figures_block, findings_section, provenance_section
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


POLICY_COLUMNS = [
    Column("policy", False),
    Column("completed"),
    Column("rejected"),
    Column("output (tok/s)"),
    Column("TTFT p50 (ms)"),
    Column("TTFT p99 (ms)"),
    Column("TPOT p50 (ms)"),
    Column("TPOT p99 (ms)"),
    Column("preemptions"),
    Column("KV usage mean (%)"),
    Column("imbalance mean (blocks)"),
    Column("imbalance p99 (blocks)"),
    Column("queued, peak"),
    Column("instance-seconds"),
    Column("prefix hits (%)"),
]


def policy_row(p: dict) -> list[Cell]:
    def cell(field: str, text: str, value: Any = None) -> Cell:
        return Cell(text, units.sort_key(p.get(field) if value is None else value), field=field)

    status = "" if p.get("status") == "ok" else f" ({str(p.get('status')).upper()})"
    return [
        Cell(p["policy"] + status, p["policy"], "bad" if status else "", "policy"),
        cell("completed", units.count(p.get("completed"))),
        cell(
            "rejected",
            units.count(p.get("rejected")) + (f" ({p['rerouted']} re-routed)" if p.get("rerouted") else ""),
        ),
        cell("output_throughput", units.num(p.get("output_throughput"))),
        cell("p50_ttft_ms", units.ms_number(p.get("p50_ttft_ms"))),
        cell("p99_ttft_ms", units.ms_number(p.get("p99_ttft_ms"))),
        cell("p50_tpot_ms", units.ms_number(p.get("p50_tpot_ms"))),
        cell("p99_tpot_ms", units.ms_number(p.get("p99_tpot_ms"))),
        cell("preemptions", units.count(p.get("preemptions"))),
        cell(
            "kv_usage_mean",
            units.num(100 * p["kv_usage_mean"]) if p.get("kv_usage_mean") is not None else units.MISSING,
        ),
        cell("free_blocks_imbalance_mean", units.count(p.get("free_blocks_imbalance_mean"))),
        cell("free_blocks_imbalance_p99", units.count(p.get("free_blocks_imbalance_p99"))),
        cell("queued_peak", units.count(p.get("queued_peak"))),
        cell("instance_seconds", units.num(p.get("instance_seconds"))),
        cell(
            "prefix_hit_rate",
            units.num(100 * p["prefix_hit_rate"]) if p.get("prefix_hit_rate") is not None else units.MISSING,
        ),
    ]


def headline_section(points: list[dict], meta: dict) -> Section:
    blocks: list[Any] = [
        verdict(points, meta),
        Table(
            "Routing policies on the same arrivals",
            POLICY_COLUMNS,
            [policy_row(p) for p in points],
            id="headline-table",
            note="Output: generated tokens per second, higher is better. Latency: lower is better. Imbalance: the "
            "most minus the fewest free KV blocks across the serving instances, sampled over the run. Prefix hits: "
            "the share of prompt tokens served from the prefix cache.",
        ),
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


INSTANCE_COLUMNS = [
    Column("instance"),
    Column("state", False),
    Column("routed"),
    Column("finished"),
    Column("preemptions"),
    Column("KV usage mean (%)"),
    Column("KV usage, peak (%)"),
    Column("free blocks, min"),
    Column("prefix hits (%)"),
    Column("start-up (s)"),
    Column("failure", False),
]


def _instance_row(inst: dict) -> list[Cell]:
    def pct(field: str) -> Cell:
        value = inst.get(field)
        return Cell(units.MISSING if value is None else units.num(100 * value), units.sort_key(value))

    return [
        Cell(instance_label(inst), inst.get("index")),
        Cell(str(inst.get("state", ""))),
        Cell(units.count(inst.get("routed")), units.sort_key(inst.get("routed"))),
        Cell(units.count(inst.get("finished")), units.sort_key(inst.get("finished"))),
        Cell(units.count(inst.get("preemptions")), units.sort_key(inst.get("preemptions"))),
        pct("usage_mean"),
        pct("usage_peak"),
        Cell(units.count(inst.get("free_blocks_min")), units.sort_key(inst.get("free_blocks_min"))),
        pct("prefix_hit_rate"),
        Cell(units.num(inst.get("startup_s"), 2), units.sort_key(inst.get("startup_s"))),
        Cell(inst.get("failure") or "", None, "bad" if inst.get("failure") else ""),
    ]


def simulator_section(check: dict) -> Section:
    columns = [Column(name, False) for name in SIM_COLUMNS]
    rows = [[Cell(text) for text in row] for row in simulator_rows(check)]
    note = simulator_sentence(check) + (
        " The same arrivals ran through the simulator with one instance per server, each given the smallest "
        "server's KV pool in blocks and the step times fitted to this run; its router read the instances at every "
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
                    [
                        Table(
                            f"Instances under {p['policy']}",
                            INSTANCE_COLUMNS,
                            [_instance_row(i) for i in instances],
                        )
                    ],
                )
            )
    return Section("points", "Per instance", [], subsections)
