"""``kvbench report RUN_DIR``: (re)build a run's self-contained report.html from its files."""

from __future__ import annotations

from pathlib import Path

import typer

from kvbench.commands._flags import OUT
from kvbench.commands._options import not_an_input, output_file
from kvbench.units import human_bytes

HELP = """Build a run's self-contained report.html from its files.

Build report.html, one self-contained page of a run: the verdict first (the finding in words), then
the findings of `kvbench diagnose`, the plots, the per-point table, the memory waterfall and the provenance
(command line, versions, git commit, model and shape, device, threads, packages, date).

RUN_DIR is the directory of any earlier run (sweep, waste, share, dataset, fleet, or a watch's folder); only
its files are read, so the page is the same as the one the run wrote at its end. CSS, script and every plot are
inside the file, and it makes no request: it opens offline, in any browser, and prints to PDF with its plots.
For a comparison of two runs: kvbench compare BASE HEAD --html FILE.
"""


def register(app: typer.Typer) -> None:
    app.command("report", help=HELP)(report)


def report(
    run_dir: Path = typer.Argument(..., help="Run directory (or its summary.json, or a watch's timeline.jsonl)."),
    out: str | None = OUT(None, "Write the page here (default RUN_DIR/report.html)."),
) -> None:
    from kvbench.report.html import write_report
    from kvbench.report.html.run_files import load_run

    target = output_file(out, "--out")
    not_an_input(target, "--out", load_run(run_dir).files())
    written = write_report(run_dir, target)
    typer.echo(f"wrote {written.path} ({human_bytes(written.size_bytes)} in {written.seconds:.1f} s)")
