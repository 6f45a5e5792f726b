"""Live progress of a sweep on the terminal: one bar per point, requests done and output tokens/s."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from kvbench.results.point import Point, oom_text, shows_figures


def sweep_progress_bars(console) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[tps]}"),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )


class SweepProgress:
    """The sweep's progress hooks; also feeds live metrics (a ``KvMetrics``) on every step when given."""

    def __init__(self, progress: Progress, metrics=None) -> None:
        self.progress = progress
        self.task: TaskID | None = None
        self.metrics = metrics

    def skip(self, engine: str, concurrency: int) -> None:
        self.progress.console.print(f"[dim]skipping {engine} C={concurrency}: already in results.jsonl[/dim]")

    def step_callback(
        self, engine: str, concurrency: int, repeat: int, total: int, engines: list[str] | None = None
    ) -> Callable[..., None]:
        """The ``on_step`` of a point's run: one bar for ``total`` requests. Several ``engines`` run interleaved
        share the bar (labelled ``engine``), their finished requests added up."""
        label = f"{engine} C={concurrency}" + (f" #{repeat + 1}" if repeat else "")
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(label, total=total, tps="")
        start = time.perf_counter()
        tokens = {"n": 0}
        finished_by: dict[str, int] = {}
        metrics = self.metrics
        if metrics is not None:
            for name in engines or [engine]:
                metrics.begin_run(name)

        def on_step(engine_name: str, scheduler: Any, finished: int) -> None:
            tokens["n"] += len(scheduler.running) if scheduler is not None else 0
            finished_by[engine_name] = finished
            elapsed = time.perf_counter() - start
            tps = f"{tokens['n'] / elapsed:,.0f} tok/s" if elapsed > 0 and scheduler is not None else ""
            assert self.task is not None  # added above, before this callback can run
            self.progress.update(self.task, completed=sum(finished_by.values()), tps=tps)
            if metrics is not None:
                metrics.observe(engine_name, scheduler)

        return on_step

    def point_done(self, engine: str, concurrency: int, point: Point) -> None:
        if self.metrics is not None:
            point.extra["metrics"] = self.metrics.end_run(engine)
        self.progress.console.print(point_line(point))


def point_line(point: Point) -> str:
    """A finished point in one console line; an OOM point is marked, with no throughput figure (see
    :func:`kvbench.results.point.shows_figures`)."""
    data = point.to_json()
    head = f"{point.engine:>10} C={point.concurrency:<4} {point.status:<4}"
    counts = f"{point.completed} done, {point.rejected} rejected, {point.preemptions} preemptions"
    if not shows_figures(data):
        return f"{head} {oom_text(data) if point.status == 'oom' else 'no figures'} ({counts})"
    if point.steady_output_throughput is None:
        steady = "no steady window"
    else:
        steady = f"steady {point.steady_output_throughput:,.1f} over {point.steady_window_pct:.0f}% of the run"
    return f"{head} {point.output_throughput:9,.1f} output tok/s ({steady}), {counts}"
