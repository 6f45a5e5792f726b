"""The waste study's table, Markdown summary and plot."""

from __future__ import annotations

from pathlib import Path

from kvbench.report.columns import Col, TableSpec, print_whole
from kvbench.report.rundir import wrote_line
from kvbench.report.sweep_report import (
    output_length_spec,
    output_length_table,
    output_length_title,
    shows_output_lengths,
    with_output_lengths,
)
from kvbench.results.strategy_point import StrategyPoint
from kvbench.results.waste_shares import ShareOf
from kvbench.results.waste_study import WasteMeta, WasteStudy
from kvbench.units import human_bytes, num
from kvbench.workload.dataset import left_out, sample_note

EOS_NOTE = (
    "answers end at their real length while every reservation plans for max-len - prompt; the oracle is "
    "told the real lengths: a hindsight bound, not a runnable engine"
)
LENGTH_NOTE = "every request runs to its drawn or reference output length, and each strategy reserves knowing it"


def stop_text(stop: str) -> str:
    """The stop mode and what it means for the strategies' reservations."""
    return f"{stop}: {EOS_NOTE if stop == 'eos' else LENGTH_NOTE}"


def _caption(meta: WasteMeta) -> str:
    """Under the table: the stop mode, and what a dataset's filter left out."""
    parts = [f"stop {meta.stop}"]
    dataset = meta.dataset
    if dataset:
        lost = left_out(dataset.to_json())
        parts.append(
            f"{Path(dataset.path).name}: {dataset.requests} of {dataset.records} records"
            + (f", left out {lost}" if lost else "")
        )
    return "; ".join(parts)


def strategy_label(point: StrategyPoint) -> str:
    return point.engine + (" (hindsight bound)" if point.hindsight_bound else "")


def _share(name: str, share: ShareOf, heading: str, short: str) -> Col[StrategyPoint]:
    return Col(heading, lambda p: num(share(p.shares), missing="-"), f"waste.{name}", short, figure=False)


SHARES: tuple[tuple[str, ShareOf, str, str], ...] = (  # field, the share, heading, the console's where it is wider
    ("token_state_pct", lambda s: s.token_state_pct, "token states", "token\nstates"),
    ("reservation_pct", lambda s: s.reservation_pct, "reservation", "reserv."),
    ("internal_pct", lambda s: s.internal_pct, "internal", "int."),
    ("external_pct", lambda s: s.external_pct, "external", "ext."),
    ("free_pct", lambda s: s.free_pct, "free", ""),
)
SHARE_TABLE: TableSpec[StrategyPoint] = TableSpec(
    "KV pool shares per strategy, time-averaged (% of the pool; simulated)",
    (
        Col("strategy", strategy_label, "engine", key=True, figure=False, numeric=False),
        Col(
            "effective usage",
            lambda p: num(p.effective_usage_pct, missing="-"),
            "effective_usage_pct",
            "eff.",
            figure=False,
        ),
        *(_share(*share) for share in SHARES),
        Col("mean running", lambda p: f"{p.mean_running:.1f}", "mean_running", "run\nmean", figure=False),
        Col("peak running", lambda p: f"{p.peak_running:,}", "peak_running", "run\npeak", figure=False),
        Col("out tok/s", lambda p: f"{p.output_throughput:,.0f}", "output_throughput", "out\ntok/s"),
        Col("preemptions", lambda p: f"{p.preemptions:,}", "preemptions", "pre-\nempt", figure=False),
    ),
)
SHARE_NOTE = (
    "Shares of the KV pool in %, averaged over the run weighted by step time: token states, reservation, "
    "internal (int.) and external (ext.) fragmentation, free; run: requests running. Effective (eff.) usage, "
    "the PagedAttention paper's measure: token states over everything allocated or blocked. Output tok/s from "
    "the roofline simulator."
)


def waste_markdown(study: WasteStudy) -> str:
    meta = study.meta
    head = (
        f"# kvbench waste\n\nModel {meta.model_name} ({meta.model_dtype}), GPU {meta.gpu}, "
        f"max-len {meta.max_len}, {meta.workload}, {meta.requests} requests, "
        f"concurrency {meta.concurrency} (simulated).\n\n"
    )
    if (analytic := study.analytic) is not None:
        head += (
            f"Analytic estimate (max-len reservation): {analytic.at_mean_len_pct:.1f}% wasted at mean length "
            f"{analytic.mean_len}; {analytic.at_sampled_mean_pct:.1f}% at the sampled mean "
            f"{analytic.sampled_mean_len:.0f}.\n\n"
        )
    head += f"Stop: {stop_text(meta.stop)}.\n\n"
    if meta.dataset:
        head += f"Dataset: {sample_note(meta.dataset.to_json())}.\n\n"
    text = head + SHARE_TABLE.markdown(study.points) + f"\n{SHARE_NOTE}\n"
    if shows_output_lengths(meta):
        lengths = with_output_lengths(study.points)
        text += f"\n## {output_length_title(meta)}\n\n" + output_length_spec(meta).markdown(lengths)
    return text


def print_waste(console, study: WasteStudy, run_dir: Path) -> None:
    meta, points = study.meta, study.points
    if (analytic := study.analytic) is not None:
        console.print(
            f"[bold]Analytic estimate[/bold] (article: reserve max-len for everyone): "
            f"waste = (max_len - actual) / max_len = ({meta.max_len} - {analytic.mean_len}) / {meta.max_len} = "
            f"[bold]{analytic.at_mean_len_pct:.1f}%[/bold]  (at the sampled mean {analytic.sampled_mean_len:.0f}: "
            f"{analytic.at_sampled_mean_pct:.1f}%)"
        )
    console.print(
        f"{meta.model_name} on {meta.gpu}: pool {human_bytes(meta.kv_budget_bytes)}, "
        f"{meta.pool_slots:,} token slots, {points[0].bytes_per_token if points else 0:,} B/token"
    )
    table = SHARE_TABLE.rich(points)
    table.caption = f"{_caption(meta)}; eff.: effective usage; int./ext.: internal/external fragmentation"
    print_whole(console, table)
    if shows_output_lengths(meta):
        console.print(output_length_table(points, meta, caption=f"stop {stop_text(meta.stop)}"))
    elif meta.stop == "eos":
        console.print(f"stop {stop_text(meta.stop)}")
    console.print(wrote_line(run_dir, "summary.json, summary.csv, summary.md, waste.png"))


def waste_plot(study: WasteStudy, path: Path) -> None:
    from kvbench.report.plots import waste_breakdown  # matplotlib loads only when a plot is drawn

    meta, points = study.meta, study.points
    title = f"KV pool breakdown: {meta.model_name} {meta.model_dtype} on {meta.gpu}, max-len {meta.max_len}"
    subtitle = f"{meta.workload}; {meta.requests} requests, concurrency {meta.concurrency}; simulated"
    if meta.stop == "eos":
        subtitle += "; answers end at EOS, reservations plan for max-len"
    waste_breakdown(
        [strategy_label(p).replace(" (", "\n(") for p in points], [p.shares for p in points], path, title, subtitle
    )
