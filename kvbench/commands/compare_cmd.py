"""``kvbench compare BASE HEAD``: a CI regression report between two runs."""

from __future__ import annotations

import sys
from pathlib import Path

import typer
from rich.console import Console

from kvbench.commands._flags import VERBOSE
from kvbench.commands._options import not_an_input, output_file
from kvbench.errors import KvbenchError
from kvbench.fileio import replaceable, write_text_atomic
from kvbench.report.baseline import baseline_file, update_baseline
from kvbench.report.compare import DEFAULT_ALPHA, DEFAULT_MIN_DURATION_S, Comparison, compare
from kvbench.report.compare_policy import parse_rule
from kvbench.report.compare_render import ReportFormat, render, summary_line, to_rich_table, to_summary
from kvbench.results.summary_load import Summary, load_summary

HELP = """Compare HEAD's run with BASE's; exit 1 on a regression or a missing point.

BASE and HEAD are run directories or summary.json files of the same kind (sweep, waste, share).
Points match by (engine, concurrency, scenario); each (concurrency, scenario) with a paged and a
contiguous engine also gets in-run ratios such as paged_over_contiguous_output_throughput.

Deterministic metrics (same seed and settings give the same value; the scheduler advances by engine
steps, not wall-clock time) are judged exactly in every run: completed, rejected, preemptions,
peak_running, max_concurrency, kv_peak_allocated_bytes, kv_peak_used_bytes, kv_pool_bytes (a
setting: any change fails) and share's mean/peak blocks and bytes.

Timing-dependent metrics: the time-weighted means (waste.*_pct, kv_mean_used_bytes,
kv_mean_allocated_bytes, fragmentation_mean, mean_running), throughput, latency and the ratios.
Simulated runs (meta.simulated: roofline step times) are deterministic in these too: all judged
exactly, absolute throughput and latency included. In measured runs they are noisy, and the
defaults have margin over identical CPU sweeps: time-weighted means within x1.6; throughput ratios
within x1.35 from single runs whose engines stepped in turn (x2.5 where they ran one after the
other); p99 latency ratios reported, not gated; absolute throughput and latency (--absolute)
reported, not gated. With --repeat samples (4 vs 4 or more, so that a
Mann-Whitney U test can reach --alpha) a ratio change must be significant and beyond x1.35 (p99
ratios: x8). memory.* is judged (within 10%) only with --absolute. A --fail-on rule gates any metric.
A measured point that ran under --min-duration (2 s) on either side is too short to time on a shared
machine: its timing-dependent metrics are reported, not gated, and the report says so. Runs made on
machines loaded differently (the engines' share of a core over their steps) are noted.

The terminal gets a few lines (the verdict, notes and what changed); --verbose or --output FILE gives the
full Markdown table.

A metric that is a string, a bool, NaN or infinite is unusable input (exit 2); one with a value on
one side and null on the other fails. Rows that are reported but not gated have the verdict "info".

Exit codes: 0 pass, 1 regression or missing point/metric/value, 2 unusable input.

Refreshing the committed CI baseline on purpose: run the reference sweep, then
`kvbench compare reports/baseline/sweep RUN_DIR --update-baseline`, review the printed changes,
and commit reports/baseline/. --update-baseline copies HEAD's summary.json onto BASE after the
report (creating BASE if it does not hold a usable summary) and exits 0.
"""


def register(app: typer.Typer) -> None:
    app.command("compare", help=_unwrapped(HELP))(compare_command)


def _unwrapped(text: str) -> str:
    """Paragraphs as single lines, so the terminal wraps them to its width instead of at 100 columns."""
    return "\n\n".join(" ".join(paragraph.split()) for paragraph in text.strip().split("\n\n"))


def compare_command(
    base: Path = typer.Argument(..., help="Baseline run directory or summary.json."),
    head: Path = typer.Argument(..., help="Run directory or summary.json to judge."),
    fail_on: list[str] | None = typer.Option(
        None,
        "--fail-on",
        metavar="METRIC:THRESHOLD",
        help="Tolerance for a metric (fnmatch pattern): '5%' relative to base, '0.5' absolute change; it also "
        "gates a metric that is otherwise only reported. Repeatable; the last matching rule wins. "
        "E.g. paged_over_contiguous_output_throughput:5%.",
    ),
    fmt: ReportFormat = typer.Option(
        ReportFormat.markdown, "--format", help="Report format: markdown, json, junit, or a rich table."
    ),
    output: str | None = typer.Option(
        None,
        "--output",
        "-o",
        help="Write the report to this file (atomically); stdout gets one summary line.",
    ),
    absolute: bool = typer.Option(
        False,
        "--absolute",
        help="Also judge memory.* and report absolute throughput and latency (judged exactly in simulated "
        "runs anyway; in measured runs gated only by --fail-on).",
    ),
    alpha: float = typer.Option(DEFAULT_ALPHA, "--alpha", help="Significance level of the Mann-Whitney U test."),
    min_duration: float = typer.Option(
        DEFAULT_MIN_DURATION_S,
        "--min-duration",
        min=0.0,
        metavar="SECONDS",
        help="A measured point that ran shorter than this on either side is too short to time on a shared "
        "machine: its timing-dependent metrics are reported, not gated (a --fail-on rule still gates them).",
    ),
    verbose: bool = VERBOSE(False, "Print the full Markdown table instead of the few-line summary."),
    refresh: bool = typer.Option(
        False, "--update-baseline", help="After reporting, copy HEAD's summary.json onto BASE and exit 0."
    ),
    html: str | None = typer.Option(
        None,
        "--html",
        help="Also write the report as one self-contained HTML page here: the verdict, each judged metric with "
        "base, head, ratio and why, both runs' plots and provenance.",
    ),
) -> None:
    rules = tuple(_rule(text) for text in fail_on or ())
    output_path = output_file(output, "--output")  # before reading anything: an empty or unwritable path
    html_path = output_file(html, "--html")
    head_summary = load_summary(head)
    base_summary = _load_base(base, tolerate_unusable=refresh)
    inputs = [head_summary.path] + ([base_summary.path] if base_summary is not None else [])
    inputs += [series for summary in inputs for series in _series_files(summary)]
    not_an_input(output_path, "--output", inputs)
    not_an_input(html_path, "--html", inputs)
    comparison = None
    if base_summary is not None:
        comparison = compare(
            base_summary, head_summary, rules, absolute=absolute, alpha=alpha, min_duration_s=min_duration
        )
        _emit(comparison, fmt, output_path, verbose)
        if html_path is not None:
            from kvbench.report.html import write_compare_report

            written = write_compare_report(comparison, html_path)
            typer.echo(f"HTML report: {written.path}", err=True)
    if refresh:
        updated = update_baseline(head_summary, base)
        typer.echo(f"baseline updated: {updated}", err=True)
    elif comparison is not None and comparison.failed:
        raise typer.Exit(code=1)


def _series_files(summary: Path) -> list[Path]:
    """The files beside a summary that a compare page draws from (its series), for the outputs to avoid."""
    from kvbench.report.html.run_files import SERIES_PATTERNS

    return [path for patterns in SERIES_PATTERNS.values() for p in patterns for path in summary.parent.glob(p)]


def _rule(text: str):
    try:
        return parse_rule(text)
    except KvbenchError as err:
        raise KvbenchError(f"--fail-on: {err}") from None


def _load_base(base: Path, *, tolerate_unusable: bool) -> Summary | None:
    try:
        return load_summary(base)
    except KvbenchError as err:
        if not tolerate_unusable:
            raise
        target = baseline_file(base)
        if (refused := replaceable(target)) is not None:  # nothing to read and nowhere to write: one error
            raise KvbenchError(f"no usable baseline ({err}), and {target} {refused}") from None
        typer.echo(f"no usable baseline ({err}); writing a fresh one", err=True)
        return None


def _emit(comparison: Comparison, fmt: ReportFormat, output: Path | None, verbose: bool) -> None:
    if output is not None:
        write_text_atomic(output, render(comparison, fmt))
        typer.echo(f"{summary_line(comparison)} (report: {output})")
    elif fmt is ReportFormat.table and sys.stdout.isatty():
        Console().print(to_rich_table(comparison))
    elif fmt is ReportFormat.markdown and not verbose:
        typer.echo(to_summary(comparison) + "the full table: --verbose, or --output FILE (Markdown)")
    else:
        typer.echo(render(comparison, fmt), nl=False)
