"""``kvbench sweep``: both engines side by side under a concurrency sweep."""

from __future__ import annotations

from pathlib import Path

import typer

from kvbench.commands._options import (
    int_list,
    make_console,
    name_list,
    output_file,
    parse_size,
    positive_fraction,
    run_directory,
    thread_count,
)
from kvbench.errors import KvbenchError, RunFailed
from kvbench.fileio import DirectoryLock, json_text
from kvbench.kv.policies import ADMISSION_MODES, MANAGERS, RESERVATION_POLICIES, check_choice
from kvbench.report.progress import SweepProgress, sweep_progress_bars
from kvbench.report.rundir import new_run_dir
from kvbench.report.sweep_report import print_sweep, write_outputs
from kvbench.studies.sweep import PointFailed, load_finished, pin_run_config, recover_results, run_sweep
from kvbench.studies.sweep_setup import SweepOptions, SweepSetup
from kvbench.studies.vllm_backend import EXTERNAL_ENGINES, REFERENCE_NOTE, VLLM_ENGINE, own_engines
from kvbench.studies.workload import STOP_MODES


def sweep(
    concurrency: str | None = typer.Option(None, "--concurrency", help="Comma-separated concurrency levels (default: the scenario's)."),
    engines: str = typer.Option("paged,contiguous", "--engines", help="paged, contiguous or both; add vllm for vLLM's offline engine as a reference column (needs vLLM installed and --model DIR)."),
    scenario: str = typer.Option("article", "--scenario", help="Built-in scenario name (see `kvbench scenarios`) or a TOML file."),
    model: str = typer.Option("tiny", "--model", help="Preset or local checkpoint dir (tensor engine); with --simulate the shape to simulate."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda."),
    dtype: str | None = typer.Option(None, "--dtype", help="fp32 | fp16 | bf16 (default: fp32 on CPU, fp16 on CUDA)."),
    kv_memory: str | None = typer.Option(None, "--kv-memory", help="KV pool size, e.g. 64MiB (default: the scenario's budget)."),
    utilization: float | None = typer.Option(None, "--gpu-memory-utilization", max=1.0, callback=positive_fraction, help="On CUDA: size the pools like vLLM from real free memory."),
    block_size: int | None = typer.Option(None, "--block-size", min=1, help="Tokens per KV block (default: the scenario's)."),
    reserve: str | None = typer.Option(None, "--reserve", help="Contiguous reservation: max | pow2 | oracle."),
    admission: str | None = typer.Option(None, "--admission", help="Contiguous when memory is short: queue | reject (OOM)."),
    requests: int | None = typer.Option(None, "--requests", min=1, help="Requests per point (default: the scenario's)."),
    requests_file: Path | None = typer.Option(None, "--requests-file", help="JSONL of {prompt_token_ids, output_len} to replay exactly instead of the scenario's lengths."),
    dataset: str | None = typer.Option(None, "--dataset", help="Prompts from a ShareGPT JSON or {prompt, output_len} JSONL file (or 'real-chat', shipped), tokenized with the model's tokenizer."),
    stop: str | None = typer.Option(None, "--stop", help="eos: answers end where the model emits EOS (default for a real model with a tokenizer); length: run to the drawn/reference length, EOS ignored."),
    repeat: int = typer.Option(1, "--repeat", min=1, help="Run each point K times: mean, std and 95% CI."),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Seed of lengths, prompts and weights (default: the scenario's, else 0)."),
    threads: str = typer.Option("auto", "--threads", help="CPU threads for the model's matmuls: a number, or auto (measured at start)."),
    out: str | None = typer.Option(None, "--out", help="Run directory (default reports/sweep-<time>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue --out, skipping finished points."),
    continue_on_error: bool = typer.Option(False, "--continue-on-error", help="Record a failed point and go on (the run still exits 1)."),
    simulate: bool = typer.Option(False, "--simulate", help="Tensor-free simulator with a GPU preset and roofline step times."),
    gpu: str = typer.Option("a100-80g", "--gpu", help="GPU preset for --simulate."),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json on stdout."),
    metrics_port: int | None = typer.Option(None, "--metrics-port", min=0, max=65535, help="Serve live Prometheus metrics on this port (0: any free one)."),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", help="Address the metrics endpoint binds to."),
    metrics_file: str | None = typer.Option(None, "--metrics-file", help="Write the Prometheus exposition text here at the end."),
    metrics_optional: bool = typer.Option(False, "--metrics-optional", help="If the metrics port is taken, run without the endpoint."),
    waterfall: bool = typer.Option(False, "--waterfall", help="Print the memory waterfall table of every point."),
    wide: bool = typer.Option(False, "--wide", help="Print every column of the per-point table (summary.md always has them)."),
    on_ray: bool = typer.Option(False, "--ray", help="Fan the points out to Ray workers (one per GPU; on CPU one unless --ray-workers)."),
    ray_workers: int | None = typer.Option(None, "--ray-workers", min=1, help="With --ray: how many workers."),
    ray_address: str | None = typer.Option(None, "--ray-address", help="With --ray: join this cluster (HOST:PORT) instead of a local one."),
) -> None:
    """Run the paged and the contiguous engine side by side at each concurrency; TPS, latency, memory.

    Closed loop: exactly C requests in flight; every point serves the same seeded request list after an
    uncounted warm-up. Writes results.jsonl (point by point), summary.json/csv/md and PNG plots.
    """
    options = SweepOptions(
        scenario=scenario, concurrency=tuple(int_list(concurrency, "--concurrency")) if concurrency is not None else None,
        engines=tuple(name_list(engines, "engines", (*MANAGERS, *EXTERNAL_ENGINES))), model=model, device=device, dtype=dtype,
        kv_memory_bytes=parse_size(kv_memory, "--kv-memory") if kv_memory else None, kv_memory_text=kv_memory,
        utilization=utilization, block_size=block_size, requests=requests, requests_file=requests_file,
        dataset=dataset, stop=check_choice(stop, STOP_MODES, "--stop") if stop else None,
        reserve=check_choice(reserve, RESERVATION_POLICIES, "--reserve") if reserve else None,
        admission=check_choice(admission, ADMISSION_MODES, "--admission") if admission else None,
        repeat=repeat, seed=seed, simulate=simulate, gpu=gpu, threads=thread_count(threads))
    out_dir = run_directory(out)
    _check_run_options(out_dir, resume, simulate, on_ray, ray_workers, ray_address,
                       metrics_port is not None or metrics_file is not None)
    metrics_path = output_file(metrics_file, "--metrics-file")
    console = make_console(stderr=as_json)
    with console.status("preparing the sweep...") as status:
        setup = SweepSetup.resolve(options, status.update)
    run_dir, metrics, failed, points = None, None, None, []
    try:  # from here on the backend holds processes (vLLM) and the metrics a port: both are let go at the end
        run_dir = new_run_dir("sweep", out_dir)
        lock = DirectoryLock(run_dir, "kvbench sweep")  # one writer per run directory
        notes = _prepare_results(run_dir, resume)  # printed once the setup has succeeded: an error comes alone
        pin_run_config(run_dir, setup.pinned_config(), resume)
        metrics = _start_metrics(setup, metrics_port, metrics_host, metrics_path, metrics_optional, notes)
        for note in notes:
            console.print(note)
        _print_intro(console, setup)
        if on_ray:
            from kvbench.studies.sweep_ray import run_sweep_on_ray

            with console.status(f"running {len(setup.plan(continue_on_error).keys())} points on Ray..."):
                points = run_sweep_on_ray(setup, continue_on_error, run_dir, resume, ray_workers, ray_address,
                                          on_point=lambda p: console.print(f"{p['engine']:>10} C={p['concurrency']:<4} "
                                                                           f"{p['status']:<4} done"))
        else:
            with sweep_progress_bars(console) as bars:
                points = run_sweep(setup.plan(continue_on_error), setup.backend, run_dir, resume,
                                   SweepProgress(bars, metrics))
    except PointFailed as err:
        failed, points = err, err.points
    except KeyboardInterrupt:
        if run_dir is not None:
            console.print(f"[yellow]interrupted: finished points are kept in {run_dir}/results.jsonl; "
                          "rerun with --resume[/yellow]")
        raise typer.Exit(code=130) from None
    finally:
        _stop_metrics(metrics, metrics_path, console)
        getattr(setup.backend, "close", lambda: None)()  # an external engine's processes (vLLM)
    document = write_outputs(run_dir, setup.meta(), points)
    lock.release()
    if as_json:
        typer.echo(json_text(document))
    else:
        print_sweep(console, points, simulate, waterfall, run_dir, document["meta"], wide)
    _fail_on_errors(failed, points, run_dir)


def _check_run_options(out_dir, resume: bool, simulate: bool, on_ray: bool, ray_workers, ray_address,
                       metrics: bool) -> None:
    """Combinations of options that cannot run, refused before the model loads or anything is written."""
    if resume and out_dir is None:
        raise KvbenchError("--resume continues a run directory: give it with --out")
    if (ray_workers is not None or ray_address is not None) and not on_ray:
        raise KvbenchError("--ray-workers and --ray-address go with --ray")
    if simulate and metrics:
        raise KvbenchError("--metrics-port/--metrics-file need the tensor engine: the simulator jumps over steps, "
                           "so there is no live state to export")
    if on_ray and metrics:
        raise KvbenchError("--metrics-port/--metrics-file watch engines in this process; with --ray they run in workers")
    if on_ray:
        from kvbench.studies.fleet.ray_runtime import import_ray

        import_ray()  # installed, or one line saying how, before any work


def _prepare_results(run_dir, resume: bool) -> list[str]:
    """Check what ``run_dir`` already holds against ``resume``; the notes to print once the setup succeeds."""
    if not resume and (run_dir / "results.jsonl").exists():
        raise KvbenchError(f"{run_dir} already holds results; pass --resume to continue it or choose another --out")
    notes: list[str] = []
    if resume:
        if recover_results(run_dir / "results.jsonl") is not None:
            notes.append(f"[yellow]warning: the last line of {run_dir}/results.jsonl was cut short (a crash "
                         "while writing); set aside in results.jsonl.torn, its point runs again[/yellow]")
        load_finished(run_dir / "results.jsonl")  # a line damaged before the last one is refused now
    return notes


def _print_intro(console, setup: SweepSetup) -> None:
    if setup.skipped is not None:
        console.print(f"[yellow]warning: {setup.skipped.sentence(f'records of {setup.options.requests_file}')}[/yellow]")
    if setup.options.simulate:
        console.print("[bold yellow]SIMULATED[/bold yellow]: tensor-free simulator, roofline step times of "
                      f"{setup.options.gpu}; no model runs.")
    counts = sorted(set(setup.counts.values()))
    per_point = (f"{counts[0]} requests per point" if len(counts) == 1 else "requests per point: " +
                 ", ".join(f"{n} at C={c}" for c, n in setup.counts.items()))
    console.print(f"KV pool: {setup.budget_source}; block size {setup.config.block_size}; {per_point}")
    console.print(f"stop: {setup.stop_text}")
    if setup.workload.dataset is not None:
        console.print(f"dataset: {setup.workload.dataset.note()}")
    threads = getattr(setup.backend, "threads", None)
    if threads:
        console.print(f"CPU threads: {threads['threads']} ({threads['reason']})")
    if VLLM_ENGINE in setup.options.engines:
        console.print(f"[dim]{REFERENCE_NOTE}; same requests, closed loop, warm-up and KV budget, prefix caching "
                      "off[/dim]")


def _fail_on_errors(failed: PointFailed | None, points: list[dict], run_dir: Path) -> None:
    if failed is not None:
        raise RunFailed(f"point {failed.point['engine']} C={failed.point['concurrency']} failed: "
                        f"{failed.point['error']} (recorded; --continue-on-error goes on past failures)")
    errors = [p for p in points if p["status"] == "error"]
    if errors:
        first = errors[0]
        raise RunFailed(f"{len(errors)} of {len(points)} points failed (recorded in {run_dir}/results.jsonl), e.g. "
                        f"{first['engine']} C={first['concurrency']}: {first.get('error', 'no reason')}")
    if points and not any(p.get("completed") for p in points):  # an OOM beside completed points is a result
        rejected = sum(p.get("rejected") or 0 for p in points)
        raise RunFailed(f"no point completed a single request ({len(points)} point(s), {rejected:,} request(s) "
                        f"rejected, recorded in {run_dir}): the sweep measured nothing; give the KV pool more "
                        "memory (--kv-memory) or lower the concurrency")


def _start_metrics(setup: SweepSetup, port, host, path, optional, notes: list[str]):
    """A KvMetrics exporter fed by the tensor engines (None when no metrics were asked for); its lines for the
    user go to ``notes``."""
    if port is None and path is None:
        return None
    from kvbench.measure.metrics import KvMetrics

    backend = setup.backend
    metrics = KvMetrics(device=str(backend.loaded.device))
    for name in own_engines(setup.options.engines):  # time every block allocation of the measured runs
        backend.engine(name).alloc_observer = metrics.alloc_observer(name)
    if port is not None:
        try:
            metrics.serve(host, port)
        except KvbenchError as err:
            if not optional:
                raise KvbenchError(f"{err}; choose another --metrics-port (0 picks a free one) or pass "
                                   "--metrics-optional to run without the endpoint") from None
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


def scenarios() -> None:
    """List the built-in scenarios with a one-line description."""
    from kvbench.report.sweep_report import scenarios_table
    from kvbench.workload.scenario import builtin_scenarios, load_scenario

    make_console().print(scenarios_table({name: load_scenario(name) for name in sorted(builtin_scenarios())}))


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
    app.command("scenarios")(scenarios)
