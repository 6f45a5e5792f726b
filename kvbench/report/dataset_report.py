"""``kvbench dataset``: length tables, text histograms, the analytic waste estimates, Markdown and a plot."""

from __future__ import annotations

from pathlib import Path

from rich.table import Table

from kvbench.report.columns import markdown_table
from kvbench.report.rundir import wrote_line
from kvbench.results.dataset_result import LENGTHS, DatasetResult, LengthStats

_BAR = 40  # characters of the longest histogram bar


def lengths_table(result: DatasetResult) -> Table:
    table = Table(title=f"Token lengths of {len_label(result)}")
    for column in ("", "requests", "mean", "p50", "p90", "p99", "min", "max"):
        table.add_column(column, justify="left" if not column else "right")
    for name, stats in result.lengths.items():
        table.add_row(
            name,
            f"{stats.count:,}",
            f"{stats.mean:,.1f}",
            f"{stats.p50:,.0f}",
            f"{stats.p90:,.0f}",
            f"{stats.p99:,.0f}",
            f"{stats.min:,}",
            f"{stats.max:,}",
        )
    return table


def len_label(result: DatasetResult) -> str:
    data = result.meta.dataset
    return "a dataset not recorded" if data is None else f"{Path(data.path).name} ({data.counted_by})"


def histogram_table(result: DatasetResult, which: str) -> Table:
    hist = result.histograms[which]
    edges, counts = hist.edges, hist.counts
    peak = max(counts) or 1
    table = Table(title=f"{which} lengths (tokens)", show_edge=False)
    for column in ("tokens", "requests", ""):
        table.add_column(column, justify="left" if column == "" else "right")
    for low, high, count in zip(edges[:-1], edges[1:], counts, strict=True):
        table.add_row(f"{low:,.0f}-{high:,.0f}", f"{count:,}", "█" * round(_BAR * count / peak))
    return table


def waste_table(result: DatasetResult) -> Table:
    analytic, max_len = result.analytic, result.meta.max_len
    assert analytic is not None and analytic.at_mean_len_pct is not None and max_len is not None  # as written
    table = Table(
        title=f"Analytic waste at each request's final length, max-len {max_len:,}",
        caption=f"article's estimate: (max_len - mean) / max_len = ({max_len:,} - "
        f"{analytic.mean_len:,.0f}) / {max_len:,} = {analytic.at_mean_len_pct:.1f}%",
    )
    for column in ("strategy", "slots held at the end", "token states", "never written"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for row in result.points:
        table.add_row(row.engine, f"{row.held_tokens:,.0f}", f"{row.written_tokens:,.0f}", f"{row.waste_pct:.1f}%")
    return table


def print_dataset(console, result: DatasetResult, run_dir: Path) -> None:
    console.print(result.meta.note)
    console.print(lengths_table(result))
    for which in ("prompt", "output"):
        console.print(histogram_table(result, which))
    console.print(waste_table(result))
    console.print(wrote_line(run_dir, "summary.json, summary.csv, summary.md, lengths.png"))


def _stats_row(name: str, s: LengthStats) -> list:
    return [name, s.count, s.mean, s.p50, s.p90, s.p99, s.min, s.max]


def dataset_markdown(result: DatasetResult) -> str:
    meta = result.meta
    head = f"# kvbench dataset\n\n{meta.note}\n\n"
    rows = [_stats_row(name, s) for name, s in result.lengths.items()]
    waste = [[r.engine, r.held_tokens, r.written_tokens, r.waste_pct] for r in result.points]
    return (
        head
        + markdown_table(["", "requests", "mean", "p50", "p90", "p99", "min", "max"], rows)
        + f"\nAnalytic waste at max-len {meta.max_len}:\n\n"
        + markdown_table(["strategy", "slots held at the end", "token states", "never written %"], waste)
    )


def dataset_plot(result: DatasetResult, path: Path) -> None:
    from kvbench.report import plots  # matplotlib loads only when a plot is drawn

    plots.length_histograms(
        {name: result.histograms[name] for name in LENGTHS},
        path,
        f"Token lengths of {len_label(result)}: {result.lengths['total'].count} requests",
        result.meta.max_len,
    )
