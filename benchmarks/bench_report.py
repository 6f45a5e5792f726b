"""How long report.html takes to build, and how large it is, for a run directory (by default the main job's).

    python benchmarks/bench_report.py [RUN_DIR] [--rounds 5]

Without RUN_DIR it first runs the main job (`kvbench sweep --concurrency 10,30,50` into a temporary folder).
Each round builds the page in this process, as the end of a run does (imports already paid): wall time and CPU
time of the whole page, of its plots alone (the run's plot functions drawn to SVG) and of everything else.
Medians over the rounds; the CPU's model and the load are printed with them.

Goal: the main job's page under 2 MB, and its build a small share of the run.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table


def _cpu_model() -> str:
    from kvbench.results.environment import cpu_model

    return cpu_model() or platform.processor() or "unknown CPU"


def _timed(function) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    value = function()
    return time.perf_counter() - wall, time.process_time() - cpu, value


def _rest(whole: float, plots: float) -> str:
    """The page's time beyond its plots; where the plots drawn alone took longer, it is within the rounds' noise."""
    return f"{whole - plots:.2f}" if whole >= plots else "in the noise"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", nargs="?", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    console = Console()
    run_dir = args.run_dir
    if run_dir is None:
        run_dir = Path(tempfile.mkdtemp(prefix="kvbench-bench-report-")) / "sweep"
        console.print(f"running the main job into {run_dir} ...")
        start = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "kvbench.cli",
                "sweep",
                "--concurrency",
                "10,30,50",
                "--out",
                str(run_dir),
                "--json",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        console.print(f"main job: {time.perf_counter() - start:.1f} s wall (report included)")

    from kvbench.report.html import build_page
    from kvbench.report.html.render import render_page

    build_page(run_dir)  # warm: imports, fonts, templates
    whole, plots, size = [], [], 0
    for _ in range(args.rounds):
        wall, cpu, (page, text) = _timed(lambda: _build_and_render(run_dir, build_page, render_page))
        whole.append((wall, cpu))
        size = len(text.encode("utf-8"))
        plots.append(sum(len(f.data) for f in page.figures()))
    _, _, page = _timed(lambda: build_page(run_dir))
    from kvbench.report.figure_capture import capture

    kind = page.kind
    figure_rounds = []
    for _ in range(args.rounds):
        wall, cpu, _ = _timed(lambda: _draw_only(run_dir, kind, capture))
        figure_rounds.append((wall, cpu))
    load = os.getloadavg()
    table = Table(
        title=f"report.html of {run_dir} ({kind}, {len(page.figures())} plots): medians of {args.rounds} "
        f"rounds on {_cpu_model()}, load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    for column in ("", "wall s", "CPU s"):
        table.add_column(column, justify="right")
    whole_wall, whole_cpu = statistics.median(w for w, _ in whole), statistics.median(c for _, c in whole)
    fig_wall, fig_cpu = (
        statistics.median(w for w, _ in figure_rounds),
        statistics.median(c for _, c in figure_rounds),
    )
    table.add_row("whole page", f"{whole_wall:.2f}", f"{whole_cpu:.2f}")
    table.add_row("plots (drawn to SVG)", f"{fig_wall:.2f}", f"{fig_cpu:.2f}")
    table.add_row("the rest (diagnosis, tables, template)", _rest(whole_wall, fig_wall), _rest(whole_cpu, fig_cpu))
    console.print(table)
    console.print(
        f"size: {size:,} bytes ({size / 2**10:,.1f} KiB), of which plots {plots[-1]:,} bytes; "
        f"goal < 2 MB: {'met' if size < 2 * 10**6 else 'MISSED'}"
    )


def _build_and_render(run_dir: Path, build_page, render_page):
    page = build_page(run_dir)
    return page, render_page(page)


def _draw_only(run_dir: Path, kind: str, capture) -> None:
    """The plots alone, as the page draws them."""
    import json

    document = json.loads((run_dir / "summary.json").read_text())
    with capture():
        if kind == "sweep":
            from kvbench.report.sweep_report import write_plots
            from kvbench.results.sweep_summary import SweepSummary

            sweep = SweepSummary.from_json(document)
            write_plots(run_dir, sweep.meta, sweep.points)
        elif kind == "waste":
            from kvbench.report.waste_report import waste_plot
            from kvbench.results.waste_study import WasteStudy

            waste_plot(WasteStudy.from_json(document), run_dir / "waste.png")


if __name__ == "__main__":
    main()
