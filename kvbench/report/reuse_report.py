"""The reuse study's table (console, Markdown and HTML from one column list), summary and plots."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.table import Table

from kvbench.report.columns import Col, TableSpec
from kvbench.results.reuse_curve import CurvePoint, ReuseCurve
from kvbench.units import count, human_bytes, num, pct, sort_key

GIB = 1024**3
CURVE_FILE = "reuse.png"
DISTANCE_FILE = "reuse_distance.png"
TABLE_TITLE = "Hit rate per KV size"  # report.html's caption; the console's title is the run's (:func:`title`)


def _column(heading: str, field: str, value: Callable[[CurvePoint], Any], text: Callable[..., str]) -> Col[CurvePoint]:
    """A numeric column: a point's value in a units formatter with the console's "-" for none, so the table reads
    the same on the console, in Markdown and on report.html; ordered in report.html by the value."""
    return Col(heading, lambda p: text(value(p), missing="-"), field, sort=lambda p: sort_key(value(p)))


KV_MEMORY = _column("KV memory", "kv_bytes", lambda p: p.kv_bytes, human_bytes)
KV_BLOCKS = _column("KV blocks", "kv_blocks", lambda p: p.kv_blocks, count)
DEPLOYMENT = Col[CurvePoint]("deployment", lambda p: p.label, "label", numeric=False)
HIT_RATE = _column("prefix hit rate", "hit_rate_pct", lambda p: p.hit_rate_pct, pct)
SHARE = _column("share of never-evicting", "share_of_unbounded_pct", lambda p: p.share_of_unbounded_pct, pct)
WITH_TIER = _column("with CPU tier", "total_hit_rate_pct", lambda p: p.total_hit_rate_pct, pct)
REST = (
    _column("prefill time saved", "prefill_time_saved_pct", lambda p: p.prefill_time_saved_pct, pct),
    _column("pinned by running (peak)", "pinned_peak_pct", lambda p: p.pinned_peak_pct, pct),
    _column("mean wait (s)", "queue_wait_mean_s", lambda p: p.queue_wait_mean_s, num),
    _column("refused (too long)", "refused", lambda p: p.refused, count),
)


def curve_spec(curve: ReuseCurve) -> TableSpec[CurvePoint]:
    """The curve's table as the console, summary.md and report.html show it: the CPU tier's column only when the
    run had one."""
    tier = (WITH_TIER,) if curve.offload else ()
    return TableSpec(TABLE_TITLE, (KV_MEMORY, KV_BLOCKS, DEPLOYMENT, HIT_RATE, SHARE, *tier, *REST))


def title(curve: ReuseCurve) -> str:
    deployment, trace = curve.deployment, curve.trace
    return (
        f"Prefix reuse: {deployment.model_name} on {deployment.gpu}, blocks of {deployment.block_size} "
        f"tokens; {trace.requests:,} requests over {trace.duration_s / 60:,.1f} min"
    )


def print_reuse(console: Any, curve: ReuseCurve, run_dir: Path | None = None) -> None:
    spec = curve_spec(curve)
    table = Table(title=title(curve), title_justify="left")
    for column in spec.columns:
        table.add_column(column.heading, justify="right" if column.numeric else "left")
    for row in spec.rows(curve.points):
        table.add_row(*row)
    console.print(table)
    console.print(f"A cache that never evicts: {curve.unbounded.hit_rate_pct:.1f}% of prompt tokens.")
    for line in curve.findings:
        console.print(f"- {line}")
    if run_dir is not None:
        console.print(f"wrote {run_dir}/ (summary.json, summary.csv, summary.md, {CURVE_FILE}, {DISTANCE_FILE})")


def reuse_markdown(curve: ReuseCurve) -> str:
    trace = curve.trace
    head = (
        f"# kvbench reuse\n\n{title(curve)} (simulated).\n\nTrace: {trace.source}, "
        f"{trace.prompt_tokens:,} prompt tokens in blocks of {trace.trace_block_size} per hash id.\n\n"
        f"A cache that never evicts serves {curve.unbounded.hit_rate_pct:.1f}% of prompt tokens.\n\n"
    )
    table = curve_spec(curve).markdown(curve.points)
    findings = "\n".join(f"- {line}" for line in curve.findings)
    return f"{head}{table}\n{findings}\n"


def reuse_plot(curve: ReuseCurve, path: Path) -> None:
    """The curve at ``path`` and the reuse distances beside it."""
    from kvbench.report.plots import reuse_curve, reuse_distance

    points = curve.points
    sizes = [p.kv_bytes / GIB for p in points]
    series = {"GPU prefix cache": (sizes, [p.hit_rate_pct for p in points])}
    offload = curve.deployment.offload_bytes
    totals = [p.tier.total_hit_rate_pct for p in points if p.tier is not None]
    if offload and len(totals) == len(points):
        series[f"with a {human_bytes(offload)} CPU tier"] = (sizes, totals)
    marks = [
        (d.kv_bytes / GIB, d.hit_rate_pct, f"{d.gpus} GPU" + ("s" if d.gpus != 1 else "")) for d in curve.deployments
    ]
    reuse_curve(series, marks, curve.unbounded.hit_rate_pct, path, title(curve))
    distance = curve.reuse_distance
    seconds, written = distance.seconds_histogram, distance.new_kv_bytes_histogram
    if distance.reuses and seconds is not None and written is not None:
        reuse_distance(
            [
                (seconds.edges, seconds.blocks, "time since the block's last use (s; 0 in the first bin)"),
                ([e / GIB for e in written.edges], written.blocks, "new KV written in between (GiB)"),
            ],
            path.with_name(DISTANCE_FILE),
            f"Reuse distance of {distance.reused_blocks:,} reused KV blocks",
        )
