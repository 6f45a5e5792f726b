"""``kvbench sweep``: both engines side by side under a concurrency sweep."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import typer

from kvbench.commands._endpoint_run import check_target_run, sweep_targets
from kvbench.commands._flags import (
    CONCURRENCY,
    JSON,
    METRICS_FILE,
    METRICS_PORT,
    OUT,
    RAY,
    RAY_ADDRESS,
    REPEAT,
    STOP,
    THREADS,
    VERBOSE,
)
from kvbench.commands._options import (
    choice_list,
    help_panels,
    int_list,
    make_console,
    name_list,
    output_file,
    run_directory,
    thread_count,
)
from kvbench.commands._run import Run, show
from kvbench.commands._run_options import RUN_OPTIONS
from kvbench.commands._target_options import TARGETS
from kvbench.cpu import cpu_heap
from kvbench.errors import KvbenchError, RunFailed
from kvbench.kv.policies import check_choice
from kvbench.measure.exporter import KvMetrics
from kvbench.report.progress import SweepProgress, sweep_progress_bars
from kvbench.report.sweep_report import print_sweep, write_outputs
from kvbench.results.point import Point
from kvbench.results.run_meta import RunMeta
from kvbench.studies.backends.base import Offer
from kvbench.studies.backends.registry import engine_names
from kvbench.studies.fleet import ray_runtime
from kvbench.studies.run_options import EndpointOptions, RunOptions, SweepOptions, run_fields
from kvbench.studies.run_requests import STOP_MODES
from kvbench.studies.sweep import PointFailed, load_finished, pin_run_config, recover_results, run_sweep
from kvbench.studies.sweep_ray import run_sweep_on_ray
from kvbench.studies.sweep_setup import SweepSetup


@RUN_OPTIONS.add(
    helps={
        "requests": "Requests per point (default: the scenario's).",
        "dataset": "Prompts from a ShareGPT JSON or {prompt, output_len} JSONL file (or 'real-chat', "
        "shipped), tokenized with the model's tokenizer.",
    }
)
@help_panels(
    {
        "Load": ("concurrency", "engines", "repeat"),
        "Requests": ("stop",),
        "Model and device": ("threads",),
        "Live metrics": ("metrics_port", "metrics_host", "metrics_file", "metrics_optional"),
        "Ray": ("on_ray", "ray_workers", "ray_address"),
    }
)
@TARGETS.add()
def sweep(
    concurrency: str | None = CONCURRENCY(None, "Comma-separated concurrency levels (default: the scenario's)."),
    engines: str = typer.Option(
        "paged,contiguous",
        "--engines",
        help="paged, contiguous or both; add vllm for vLLM's offline engine as a reference column (needs vLLM "
        "installed and --model DIR).",
        **choice_list(engine_names, "engines"),
    ),
    stop: str | None = STOP(
        None,
        "eos: answers end where the model emits EOS (default for a real model with a tokenizer); length: run to the "
        "drawn/reference length, EOS ignored.",
    ),
    repeat: int = REPEAT(1, "Run each point K times: mean, std and 95% CI."),
    threads: str = THREADS("auto"),
    out: str | None = OUT(None, "Run directory (default reports/sweep-<time>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue --out, skipping finished points."),
    continue_on_error: bool = typer.Option(
        False, "--continue-on-error", help="Record a failed point and go on (the run still exits 1)."
    ),
    as_json: bool = JSON(False, "Print summary.json on stdout."),
    metrics_port: int | None = METRICS_PORT(None),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", help="Address the metrics endpoint binds to."),
    metrics_file: str | None = METRICS_FILE(None),
    metrics_optional: bool = typer.Option(
        False, "--metrics-optional", help="If the metrics port is taken, run without the endpoint."
    ),
    verbose: bool = VERBOSE(
        False,
        "Print in full: every column of the per-point table, each point's memory waterfall and the CPU's start-up "
        "measurements (summary.md, summary.json and report.html always have them).",
    ),
    on_ray: bool = RAY(False, "Fan the points out to Ray workers (one per GPU; on CPU one unless --ray-workers)."),
    ray_workers: int | None = typer.Option(None, "--ray-workers", min=1, help="With --ray: how many workers."),
    ray_address: str | None = RAY_ADDRESS(None),
    *,
    run: RunOptions,
    endpoint: EndpointOptions | None,
) -> None:
    """Paged and contiguous engines side by side per concurrency: TPS, latency, memory.

    With --target: servers over HTTP (vLLM, SGLang, kvbench serve) under the same load, their KV cache read from
    /metrics. Closed loop: exactly C requests in flight; every point serves the same seeded request list after an
    uncounted warm-up. Writes results.jsonl (point by point), summary.json/csv/md and PNG plots.
    """
    options = SweepOptions(
        **run_fields(run),
        engines=endpoint.names if endpoint else tuple(name_list(engines, "engines", engine_names())),
        repeat=repeat,
        concurrency=tuple(int_list(concurrency, "--concurrency")) if concurrency is not None else None,
        stop=check_choice(stop, STOP_MODES, "--stop") if stop else None,
        threads=thread_count(threads),
        endpoint=endpoint,
    )
    out_dir = run_directory(out)
    _check_run_options(
        out_dir,
        resume,
        options.simulate,
        on_ray,
        ray_workers,
        ray_address,
        metrics_port is not None or metrics_file is not None,
    )
    if endpoint is not None:
        check_target_run(options, engines, resume, on_ray, metrics_port is not None or metrics_file is not None)
        return sweep_targets(options, out_dir, as_json, verbose)
    metrics = LiveMetrics(metrics_port, metrics_host, output_file(metrics_file, "--metrics-file"), metrics_optional)
    ray = RayFanOut(on_ray, ray_workers, ray_address)
    console = make_console(stderr=as_json)
    with console.status("preparing the sweep...") as status:
        setup = SweepSetup.resolve(options, status.update)
    sweep_run = Run("sweep")
    failed = _measure(sweep_run, setup, out_dir, resume, continue_on_error, metrics, ray, console, verbose)
    run_dir, points = sweep_run.opened.path, sweep_run.points
    meta = RunMeta.from_json(setup.meta())
    document = write_outputs(run_dir, meta, points)
    sweep_run.opened.release()
    show(document, as_json, lambda: print_sweep(console, points, options.simulate, verbose, run_dir, meta, verbose))
    _fail_on_errors(failed, points, run_dir)


@dataclass(frozen=True)
class LiveMetrics:
    """Where the live Prometheus metrics go: a port (None: none), its host, a file written at the end."""

    port: int | None
    host: str
    path: Path | None
    optional: bool  # a port taken: run without the endpoint instead of failing


@dataclass(frozen=True)
class RayFanOut:
    """``--ray``: the points on Ray workers (how many, and a cluster to join)."""

    on: bool
    workers: int | None
    address: str | None


def _measure(
    run: Run,
    setup: SweepSetup,
    out_dir: Path | None,
    resume: bool,
    continue_on_error: bool,
    live: LiveMetrics,
    ray: RayFanOut,
    console,
    verbose: bool = False,
) -> PointFailed | None:
    """Every point into ``run`` (its directory, its points); the point that stopped the sweep, if one did.
    From the first line the backend holds processes (vLLM) and the metrics a port: both are let go at the end."""
    run.hold(setup.backend.close)

    def interrupted() -> None:
        if run.dir is not None:
            console.print(
                f"[yellow]interrupted: finished points are kept in {run.dir.path}/results.jsonl; "
                "rerun with --resume[/yellow]"
            )

    with run.guarded(interrupted):
        run_dir = run.open(out_dir)
        notes = _prepare_results(run_dir, resume)  # printed once the setup has succeeded: an error comes alone
        pin_run_config(run_dir, setup.pinned_config(), resume)
        metrics = _start_metrics(setup, live, notes)
        run.hold(lambda: _stop_metrics(metrics, live.path, console))
        for note in notes:
            console.print(note)
        _print_intro(console, setup, verbose)
        try:
            run.points = _points(setup, run_dir, resume, continue_on_error, metrics, ray, console)
        except PointFailed as err:
            run.points = err.points
            return err
    return None


def _points(
    setup: SweepSetup, run_dir: Path, resume: bool, continue_on_error: bool, metrics, ray: RayFanOut, console
) -> list[dict]:
    if ray.on:
        with console.status(f"running {len(setup.plan(continue_on_error).keys())} points on Ray..."):
            return run_sweep_on_ray(
                setup,
                continue_on_error,
                run_dir,
                resume,
                ray.workers,
                ray.address,
                on_point=lambda p: console.print(_done_line(Point.from_json(p))),
            )
    with sweep_progress_bars(console) as bars:
        return run_sweep(setup.plan(continue_on_error), setup.backend, run_dir, resume, SweepProgress(bars, metrics))


def _done_line(point: Point) -> str:
    """A point a Ray worker finished, as the console lists it."""
    return f"{point.engine:>10} C={point.concurrency:<4} {point.status:<4} done"


def _check_run_options(
    out_dir, resume: bool, simulate: bool, on_ray: bool, ray_workers, ray_address, metrics: bool
) -> None:
    """Combinations of options that cannot run, refused before the model loads or anything is written."""
    if resume and out_dir is None:
        raise KvbenchError("--resume continues a run directory: give it with --out")
    if (ray_workers is not None or ray_address is not None) and not on_ray:
        raise KvbenchError("--ray-workers and --ray-address go with --ray")
    if simulate and metrics:
        raise KvbenchError(
            "--metrics-port/--metrics-file need the tensor engine: the simulator jumps over steps, "
            "so there is no live state to export"
        )
    if on_ray and metrics:
        raise KvbenchError(
            "--metrics-port/--metrics-file watch engines in this process; with --ray they run in workers"
        )
    if on_ray:
        ray_runtime.prepare_ray(
            ray_address
        )  # installed and the cluster answering, or one line saying why, before any work


def _prepare_results(run_dir, resume: bool) -> list[str]:
    """Check what ``run_dir`` already holds against ``resume``; the notes to print once the setup succeeds."""
    if not resume and (run_dir / "results.jsonl").exists():
        raise KvbenchError(f"{run_dir} already holds results; pass --resume to continue it or choose another --out")
    notes: list[str] = []
    if resume:
        if recover_results(run_dir / "results.jsonl") is not None:
            notes.append(
                f"[yellow]warning: the last line of {run_dir}/results.jsonl was cut short (a crash "
                "while writing); set aside in results.jsonl.torn, its point runs again[/yellow]"
            )
        load_finished(run_dir / "results.jsonl")  # a line damaged before the last one is refused now
    return notes


def _cpu_lines(setup: SweepSetup, verbose: bool) -> list[str]:
    """What the CPU's start-up measurements chose: one line, or with ``verbose`` each choice and its timings."""
    threads, heap = setup.backend.threads, cpu_heap.current()
    loaded = setup.backend.loaded
    plan = loaded.matmul_plan if loaded is not None else None
    prefetch = loaded.decode_prefetch if loaded is not None else None
    if verbose:
        lines = [f"CPU threads: {threads.threads} ({threads.reason})"] if threads else []
        lines += [heap.describe()] if heap is not None else []
        lines += plan.lines() if plan is not None else []
        return lines + ([prefetch.line()] if prefetch is not None else [])
    parts = []
    if threads:
        count = threads.threads
        given = " (set by the user)" if threads.reason.startswith("set") else ""
        parts.append(f"{count} thread{'s' if count != 1 else ''}{given}")
    parts += [plan.brief()] if plan is not None else []
    parts += [f"decode prefetch {prefetch.prefetch.describe()}"] if prefetch is not None else []
    parts += ["freed memory kept for the next step"] if heap is not None and heap.kept else []
    if not parts:
        return []
    if plan is None and prefetch is None:  # nothing measured: nothing more to say
        return [f"CPU: {'; '.join(parts)}"]
    cached = plan is not None and plan.source.startswith("cached")
    parts.append("chosen by cached measurements" if cached else "measured at start-up")
    return [f"CPU: {'; '.join(parts)}; --verbose for the timings"]


def _print_intro(console, setup: SweepSetup, verbose: bool = False) -> None:
    if setup.skipped is not None:
        console.print(
            f"[yellow]warning: {setup.skipped.sentence(f'records of {setup.options.requests_file}')}[/yellow]"
        )
    if setup.options.simulate:
        console.print(
            "[bold yellow]SIMULATED[/bold yellow]: tensor-free simulator, roofline step times of "
            f"{setup.options.gpu}; no model runs."
        )
    counts = sorted(set(setup.counts.values()))
    per_point = (
        f"{counts[0]} requests per point"
        if len(counts) == 1
        else "requests per point: " + ", ".join(f"{n} at C={c}" for c, n in setup.counts.items())
    )
    console.print(f"KV pool: {setup.budget_source}; block size {setup.config.block_size}; {per_point}")
    console.print(f"stop: {setup.stop_text}")
    if setup.workload.dataset is not None:
        console.print(f"dataset: {setup.workload.dataset.note()}")
    for line in _cpu_lines(setup, verbose):
        console.print(line, markup=False, highlight=False)
    for note in setup.backends.notes():  # a reference column says what it is
        console.print(f"[dim]{note}[/dim]")


def _fail_on_errors(failed: PointFailed | None, points: list[dict], run_dir: Path) -> None:
    if failed is not None:
        raise RunFailed(
            f"point {failed.point.engine} C={failed.point.concurrency} failed: "
            f"{failed.point.error} (recorded; --continue-on-error goes on past failures)"
        )
    typed = [Point.from_json(p) for p in points]
    errors = [p for p in typed if p.status == "error"]
    if errors:
        first = errors[0]
        raise RunFailed(
            f"{len(errors)} of {len(points)} points failed (recorded in {run_dir}/results.jsonl), e.g. "
            f"{first.engine} C={first.concurrency}: {first.error or 'no reason'}"
        )
    if typed and not any(p.completed for p in typed):  # an OOM beside completed points is a result
        rejected = sum(p.rejected or 0 for p in typed)
        raise RunFailed(
            f"no point completed a single request ({len(points)} point(s), {rejected:,} request(s) "
            f"rejected, recorded in {run_dir}): the sweep measured nothing; give the KV pool more "
            "memory (--kv-memory) or lower the concurrency"
        )


def _start_metrics(setup: SweepSetup, live: LiveMetrics, notes: list[str]):
    """A KvMetrics exporter fed by the engines offering live state (None when no metrics were asked for); its
    lines for the user go to ``notes``."""
    port = live.port
    if port is None and live.path is None:
        return None
    backend = setup.backend
    metrics = KvMetrics(device=backend.device_label)
    for name in setup.backends.engines_offering(Offer.LIVE_KV):  # time every block allocation of the measured runs
        backend.observe_allocations(name, metrics.alloc_observer(name))
    if port is not None:
        try:
            metrics.serve(live.host, port)
        except KvbenchError as err:
            if not live.optional:
                raise KvbenchError(
                    f"{err}; choose another --metrics-port (0 picks a free one) or pass "
                    "--metrics-optional to run without the endpoint"
                ) from None
            notes.append(f"[yellow]warning: {err}; running without the metrics endpoint (--metrics-optional)[/yellow]")
        else:
            notes.append(f"Prometheus metrics: {metrics.url}")
    return metrics


def _stop_metrics(metrics, path, console) -> None:
    if metrics is None:
        return
    metrics.close()
    if path is not None:
        metrics.write_textfile(path)
        console.print(f"wrote Prometheus metrics to {path}")


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
