"""The fleet's table, summary files and plots: one row per routing policy, on the same arrivals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rich.table import Table

from kvbench.report.columns import markdown_table
from kvbench.report.run_input import read_run_json
from kvbench.report.rundir import flatten, write_summary
from kvbench.results.run_meta import summary_document

_COLUMNS = (
    "policy",
    "done/rej",
    "out tok/s",
    "p50/p99 TTFT ms",
    "p50/p99 TPOT ms",
    "preempt",
    "KV use mean",
    "imbalance mean/p99 (blocks)",
    "queued peak",
    "inst-s",
    "prefix hit",
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def policy_rows(points: list[dict]) -> list[list[str]]:
    rows = []
    for p in points:
        rows.append(
            [
                p["policy"] + (" (ERROR)" if p["status"] == "error" else ""),
                f"{p['completed']}/{p['rejected']}" + (f" ({p['rerouted']} re-routed)" if p.get("rerouted") else ""),
                _num(p["output_throughput"], 1),
                f"{_ms(p['p50_ttft_ms'])} / {_ms(p['p99_ttft_ms'])}",
                f"{_ms(p['p50_tpot_ms'])} / {_ms(p['p99_tpot_ms'])}",
                str(p["preemptions"]),
                _pct(p["kv_usage_mean"]),
                f"{_num(p['free_blocks_imbalance_mean'])} / {_num(p['free_blocks_imbalance_p99'])}",
                _num(p["queued_peak"]),
                _num(p["instance_seconds"], 1),
                _pct(p["prefix_hit_rate"]),
            ]
        )
    return rows


def fleet_table(points: list[dict], simulated: bool) -> Table:
    table = Table(
        title="Routing policies on the same arrivals (latency: lower is better; imbalance = max - min free "
        "blocks across instances)" + (" — SIMULATED" if simulated else "")
    )
    for column in _COLUMNS:
        table.add_column(column, justify="left" if column == "policy" else "right")
    for row in policy_rows(points):
        table.add_row(*row)
    return table


def instance_table(point: dict) -> Table:
    table = Table(title=f"Instances under {point['policy']}")
    for column in (
        "instance",
        "state",
        "routed",
        "finished",
        "preempt",
        "KV use mean/peak",
        "min free blocks",
        "prefix hit",
        "start-up s",
        "failure",
    ):
        table.add_column(column, justify="left" if column in ("state", "failure") else "right")
    for inst in point["instances"]:
        table.add_row(
            str(inst["index"]),
            inst["state"],
            str(inst["routed"]),
            str(inst["finished"]),
            str(inst["preemptions"]),
            f"{_pct(inst['usage_mean'])} / {_pct(inst['usage_peak'])}",
            _num(inst["free_blocks_min"]),
            _pct(inst["prefix_hit_rate"]),
            _num(inst["startup_s"], 2),
            inst["failure"] or "",
        )
    return table


def write_outputs(run_dir: Path, meta: dict[str, Any], points: list[dict]) -> dict[str, Any]:
    """summary.json/csv/md and the plots; returns the summary document."""
    document = summary_document("fleet", meta, points)
    rows = [flatten({k: v for k, v in p.items() if k != "instances"}) for p in points]
    markdown = (
        f"# kvbench fleet{' (SIMULATED)' if meta.get('simulated') else ''}\n\n"
        f"{meta.get('instances')} instances of {meta.get('model_name')} ({meta.get('engines', ['?'])[0]} "
        f"engine), {meta.get('requests')} requests, arrivals: {meta.get('arrivals')}\n\n"
        + markdown_table(list(_COLUMNS), policy_rows(points))
    )
    write_summary(run_dir, document, rows, markdown)
    read = [_read_series(run_dir, p["policy"]) for p in points]
    series = [s for s in read if s is not None]
    if series:
        write_plots(run_dir, series, bool(meta.get("simulated")), meta.get("autoscale"))
    return document


def _read_series(run_dir: Path, policy: str) -> dict | None:
    return read_run_json(run_dir, f"fleet-{policy}.json")


def write_plots(run_dir: Path, series: list[dict], simulated: bool, autoscale: dict | None) -> list[Path]:
    from kvbench.report import plots  # matplotlib loads only when a plot is drawn

    tag = " (SIMULATED)" if simulated else ""
    up = (autoscale or {}).get("scale_up", 0.8)
    paths = [
        plots.usage_panels(
            {
                s["policy"]: {
                    f"instance {i}": ([t for t, _ in xs], [100 * u for _, u in xs]) for i, xs in s["usage"].items()
                }
                for s in series
            },
            run_dir / "fleet_usage.png",
            f"KV block usage per instance over time, per policy{tag}",
            "time since the first arrival (s)",
            "blocks in use (% of the instance's pool)",
            100 * up,
            "lines close together: balanced; one line high while others idle: the router missed free memory",
        )
    ]
    paths.append(
        plots.lines(
            {
                s["policy"]: ([1000 * t for t, _ in s["ttft_cdf"]], [q for _, q in s["ttft_cdf"]])
                for s in series
                if s["ttft_cdf"]
            },
            run_dir / "fleet_ttft_cdf.png",
            f"Time to first token, CDF per policy{tag}",
            "TTFT (ms, log scale)",
            "share of requests with TTFT at most x",
            "left / higher is better",
            markers=False,
            logx=True,
        )
    )
    paths.append(
        plots.lines(
            {s["policy"]: ([t for t, _, _ in s["instances"]], [n + m for _, n, m in s["instances"]]) for s in series},
            run_dir / "fleet_instances.png",
            f"Instances over time (serving + starting), per policy{tag}",
            "time since the first arrival (s)",
            "instances",
            "fewer for the same latency is cheaper",
            markers=False,
            steps=True,
        )
    )
    return paths
