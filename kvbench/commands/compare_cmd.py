"""``kvbench compare BASE HEAD``: a CI regression report between two runs."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from kvbench.errors import KvbenchError
from kvbench.fileio import write_text_atomic
from kvbench.report.baseline import update_baseline
from kvbench.report.compare import DEFAULT_ALPHA, Comparison, compare
from kvbench.report.compare_policy import parse_rule
from kvbench.report.compare_render import ReportFormat, render, summary_line, to_rich_table
from kvbench.report.summary_load import Summary, load_summary

HELP = """Compare HEAD's results with BASE's, point by point; exit 1 on a regression or missing point.

BASE and HEAD are run directories or summary.json files. Points match by (engine, concurrency,
scenario). By default only machine-independent metrics are judged: deterministic ones (counts
exactly; waste.*_pct within 0.5 points; fragmentation_mean within 0.005; kv_*_bytes within 1%)
and in-run ratios such as paged_over_contiguous_output_throughput (within 5%). Absolute
throughput, latency and memory.* are judged (within 10%) only with --absolute or when a --fail-on
rule names them. With --repeat samples (3 or more a side) a Mann-Whitney U test must also find the
change significant at --alpha.

Exit codes: 0 pass, 1 regression or missing point/metric, 2 unusable input.

Refreshing the committed CI baseline on purpose: run the reference sweep, then
`kvbench compare reports/baseline/sweep RUN_DIR --update-baseline`, review the printed changes,
and commit reports/baseline/. --update-baseline copies HEAD's summary.json onto BASE after the
report (creating BASE if it does not hold a usable summary) and exits 0.
"""


def register(app: typer.Typer) -> None:
    app.command("compare", help=HELP)(compare_command)


def compare_command(
    base: Path = typer.Argument(..., help="Baseline run directory or summary.json."),
    head: Path = typer.Argument(..., help="Run directory or summary.json to judge."),
    fail_on: list[str] | None = typer.Option(
        None,
        "--fail-on",
        metavar="METRIC:THRESHOLD",
        help="Tolerance for a metric (fnmatch pattern): '5%' relative to base, '0.5' absolute change. "
        "Repeatable; the last matching rule wins. E.g. paged_over_contiguous_output_throughput:5%.",
    ),
    fmt: ReportFormat = typer.Option(
        ReportFormat.markdown, "--format", help="Report format: markdown, json, junit, or a rich table."
    ),
    output: Path | None = typer.Option(
        None,
        "--output",
        "-o",
        help="Write the report to this file (atomically); stdout gets one summary line.",
    ),
    absolute: bool = typer.Option(
        False, "--absolute", help="Also judge absolute throughput, latency and memory."
    ),
    alpha: float = typer.Option(
        DEFAULT_ALPHA, "--alpha", help="Significance level of the Mann-Whitney U test."
    ),
    refresh: bool = typer.Option(
        False, "--update-baseline", help="After reporting, copy HEAD's summary.json onto BASE and exit 0."
    ),
) -> None:
    rules = tuple(parse_rule(text) for text in fail_on or ())
    head_summary = load_summary(head)
    base_summary = _load_base(base, tolerate_unusable=refresh)
    comparison = None
    if base_summary is not None:
        comparison = compare(base_summary, head_summary, rules, absolute=absolute, alpha=alpha)
        _emit(comparison, fmt, output)
    if refresh:
        written = update_baseline(head_summary, base)
        typer.echo(f"baseline updated: {written}", err=True)
    elif comparison is not None and comparison.failed:
        raise typer.Exit(code=1)


def _load_base(base: Path, *, tolerate_unusable: bool) -> Summary | None:
    try:
        return load_summary(base)
    except KvbenchError as err:
        if not tolerate_unusable:
            raise
        typer.echo(f"no usable baseline ({err}); writing a fresh one", err=True)
        return None


def _emit(comparison: Comparison, fmt: ReportFormat, output: Path | None) -> None:
    if output is not None:
        write_text_atomic(output, render(comparison, fmt))
        typer.echo(f"{summary_line(comparison)} (report: {output})")
    elif fmt is ReportFormat.table and sys.stdout.isatty():
        Console().print(to_rich_table(comparison))
    else:
        typer.echo(render(comparison, fmt), nl=False)
