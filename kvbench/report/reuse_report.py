"""The reuse study's table (console, Markdown and HTML from one column list), summary and plots."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from kvbench.report.columns import markdown_table
from kvbench.values import human_bytes

GIB = 1024**3
CURVE_FILE = "reuse.png"
DISTANCE_FILE = "reuse_distance.png"


def _pct(value: Any) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _seconds(value: Any) -> str:
    return "-" if value is None else f"{value:,.1f}"


@dataclass(frozen=True)
class ReuseColumn:
    field: str
    label: str  # with its unit
    text: Callable[[Any], str]
    offload: bool = False  # only when the run had a CPU tier


COLUMNS = (
    ReuseColumn("kv_bytes", "KV memory", lambda v: human_bytes(v)),
    ReuseColumn("kv_blocks", "KV blocks", lambda v: f"{v:,}"),
    ReuseColumn("label", "deployment", lambda v: v or ""),
    ReuseColumn("hit_rate_pct", "prefix hit rate", _pct),
    ReuseColumn("share_of_unbounded_pct", "share of never-evicting", _pct),
    ReuseColumn("total_hit_rate_pct", "with CPU tier", _pct, offload=True),
    ReuseColumn("prefill_time_saved_pct", "prefill time saved", _pct),
    ReuseColumn("pinned_peak_pct", "pinned by running (peak)", _pct),
    ReuseColumn("queue_wait_mean_s", "mean wait (s)", _seconds),
    ReuseColumn("refused", "refused (too long)", lambda v: f"{v:,}"),
)


def columns(document: dict[str, Any]) -> list[ReuseColumn]:
    offload = bool(document["deployment"].get("offload_bytes"))
    return [c for c in COLUMNS if offload or not c.offload]


def cell_texts(document: dict[str, Any]) -> list[list[str]]:
    shown = columns(document)
    return [[c.text(point.get(c.field)) for c in shown] for point in document["points"]]


def title(document: dict[str, Any]) -> str:
    deployment, trace = document["deployment"], document["trace"]
    return (
        f"Prefix reuse: {deployment['model_name']} on {deployment['gpu']}, blocks of {deployment['block_size']} "
        f"tokens; {trace['requests']:,} requests over {trace['duration_s'] / 60:,.1f} min"
    )


def print_reuse(console: Any, document: dict[str, Any], run_dir: Path | None = None) -> None:
    table = Table(title=title(document), title_justify="left")
    for column in columns(document):
        table.add_column(column.label, justify="left" if column.field == "label" else "right")
    for row in cell_texts(document):
        table.add_row(*row)
    console.print(table)
    unbounded = document["unbounded"]
    console.print(f"A cache that never evicts: {unbounded['hit_rate_pct']:.1f}% of prompt tokens.")
    for line in document["findings"]:
        console.print(f"- {line}")
    if run_dir is not None:
        console.print(f"wrote {run_dir}/ (summary.json, summary.csv, summary.md, {CURVE_FILE}, {DISTANCE_FILE})")


def reuse_markdown(document: dict[str, Any]) -> str:
    trace = document["trace"]
    head = (
        f"# kvbench reuse\n\n{title(document)} (simulated).\n\nTrace: {trace['source']}, "
        f"{trace['prompt_tokens']:,} prompt tokens in blocks of {trace['trace_block_size']} per hash id.\n\n"
        f"A cache that never evicts serves {document['unbounded']['hit_rate_pct']:.1f}% of prompt tokens.\n\n"
    )
    table = markdown_table([c.label for c in columns(document)], cell_texts(document))
    findings = "\n".join(f"- {line}" for line in document["findings"])
    return f"{head}{table}\n{findings}\n"


def reuse_plot(document: dict[str, Any], path: Path) -> None:
    """The curve at ``path`` and the reuse distances beside it."""
    from kvbench.report.plots import reuse_curve, reuse_distance

    points = document["points"]
    series = {"GPU prefix cache": ([p["kv_bytes"] / GIB for p in points], [p["hit_rate_pct"] for p in points])}
    offload = document["deployment"].get("offload_bytes")
    if offload:
        series[f"with a {human_bytes(offload)} CPU tier"] = (
            [p["kv_bytes"] / GIB for p in points],
            [p["total_hit_rate_pct"] for p in points],
        )
    marks = [
        (d["kv_bytes"] / GIB, d["hit_rate_pct"], f"{d['gpus']} GPU" + ("s" if d["gpus"] != 1 else ""))
        for d in document["deployments"]
    ]
    reuse_curve(series, marks, document["unbounded"]["hit_rate_pct"], path, title(document))
    distance = document["reuse_distance"]
    if distance.get("reuses"):
        seconds, written = distance["seconds_histogram"], distance["new_kv_bytes_histogram"]
        reuse_distance(
            [
                (seconds["edges"], seconds["blocks"], "time since the block's last use (s; 0 in the first bin)"),
                ([e / GIB for e in written["edges"]], written["blocks"], "new KV written in between (GiB)"),
            ],
            path.with_name(DISTANCE_FILE),
            f"Reuse distance of {distance['reused_blocks']:,} reused KV blocks",
        )
