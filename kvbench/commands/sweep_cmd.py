"""``kvbench sweep``: both engines side by side under a concurrency sweep."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvbench.commands._options import (
    int_list,
    make_console,
    name_list,
    parse_size,
    run_directory,
    writable_file,
)
from kvbench.engine.request import Request
from kvbench.errors import KvbenchError, RunFailed
from kvbench.fileio import DirectoryLock, content_sha256, json_text
from kvbench.kv.policies import MANAGERS
from kvbench.report.rundir import new_run_dir, run_meta
from kvbench.report.sweep_report import article_rows, article_table, detail_table, write_outputs
from kvbench.studies.sweep import PointFailed, SweepPlan, pin_run_config, recover_results, run_sweep
from kvbench.workload.admissible import within_max_len
from kvbench.workload.scenario import load_scenario


class _Progress:
    """Rich progress: one bar per point, requests done and live output tokens/s."""

    def __init__(self, progress: Progress, metrics=None) -> None:
        self.progress = progress
        self.task = None
        self.metrics = metrics  # KvMetrics fed on every step too, or None

    def skip(self, engine: str, concurrency: int) -> None:
        self.progress.console.print(f"[dim]skipping {engine} C={concurrency}: already in results.jsonl[/dim]")

    def step_callback(self, engine: str, concurrency: int, repeat: int, total: int):
        label = f"{engine} C={concurrency}" + (f" #{repeat + 1}" if repeat else "")
        if self.task is not None:
            self.progress.remove_task(self.task)
        self.task = self.progress.add_task(label, total=total, tps="")
        import time

        start = time.perf_counter()
        tokens = {"n": 0}

        def on_step(_engine, scheduler, finished: int) -> None:
            tokens["n"] += len(scheduler.running) if scheduler is not None else 0
            elapsed = time.perf_counter() - start
            tps = f"{tokens['n'] / elapsed:,.0f} tok/s" if elapsed > 0 and scheduler is not None else ""
            self.progress.update(self.task, completed=finished, tps=tps)

        if self.metrics is None:
            return on_step
        self.metrics.begin_run(engine)

        def on_step_with_metrics(engine_name, scheduler, finished: int) -> None:
            on_step(engine_name, scheduler, finished)
            self.metrics.observe(engine_name, scheduler)

        return on_step_with_metrics

    def point_done(self, engine: str, concurrency: int, point: dict) -> None:
        if self.metrics is not None:
            point["metrics"] = self.metrics.end_run(engine)
        self.progress.console.print(
            f"{engine:>10} C={concurrency:<4} {point['status']:<4} {point['output_throughput']:9.1f} output tok/s, "
            f"{point['completed']} done, {point['rejected']} rejected, {point['preemptions']} preemptions"
        )


def sweep(
    concurrency: str | None = typer.Option(None, "--concurrency", help="Comma-separated concurrency levels (default: the scenario's)."),
    engines: str = typer.Option("paged,contiguous", "--engines", help="paged, contiguous or both."),
    scenario: str = typer.Option("article", "--scenario", help="Built-in scenario name (see `kvbench scenarios`) or a TOML file."),
    model: str = typer.Option("tiny", "--model", help="Preset or local checkpoint dir (tensor engine); with --simulate the shape to simulate."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda."),
    dtype: str | None = typer.Option(None, "--dtype", help="fp32 | fp16 | bf16 (default: fp32 on CPU, fp16 on CUDA)."),
    kv_memory: str | None = typer.Option(None, "--kv-memory", help="KV pool size, e.g. 64MiB (default: the scenario's budget)."),
    utilization: float | None = typer.Option(None, "--gpu-memory-utilization", help="On CUDA: size the pool like vLLM from real free memory."),
    block_size: int | None = typer.Option(None, "--block-size", help="Tokens per KV block (default: the scenario's)."),
    reserve: str | None = typer.Option(None, "--reserve", help="Contiguous reservation: max | pow2 | oracle."),
    admission: str | None = typer.Option(None, "--admission", help="Contiguous when memory is short: queue | reject (OOM)."),
    requests: int | None = typer.Option(None, "--requests", help="Requests per point (default: the scenario's)."),
    requests_file: Path | None = typer.Option(None, "--requests-file", help="JSONL of {prompt_token_ids, output_len} to replay exactly instead of the scenario's lengths."),
    repeat: int = typer.Option(1, "--repeat", help="Run each point K times: mean, std and 95% CI."),
    seed: int | None = typer.Option(None, "--seed", min=0, help="Seed of lengths, prompts and weights (default: the scenario's, else 0)."),
    out: str | None = typer.Option(None, "--out", help="Run directory (default reports/sweep-<time>)."),
    resume: bool = typer.Option(False, "--resume", help="Continue --out, skipping finished points."),
    continue_on_error: bool = typer.Option(False, "--continue-on-error", help="Record a failed point and go on."),
    simulate: bool = typer.Option(False, "--simulate", help="Tensor-free simulator with a GPU preset and roofline step times."),
    gpu: str = typer.Option("a100-80g", "--gpu", help="GPU preset for --simulate."),
    as_json: bool = typer.Option(False, "--json", help="Print summary.json on stdout."),
    metrics_port: int | None = typer.Option(None, "--metrics-port", help="Serve live Prometheus metrics on this port (0: any free one)."),
    metrics_host: str = typer.Option("127.0.0.1", "--metrics-host", help="Address the metrics endpoint binds to."),
    metrics_file: Path | None = typer.Option(None, "--metrics-file", help="Write the Prometheus exposition text here at the end."),
    metrics_optional: bool = typer.Option(False, "--metrics-optional", help="If the metrics port is taken, run without the endpoint."),
    waterfall: bool = typer.Option(False, "--waterfall", help="Print the memory waterfall table of every point."),
) -> None:
    """Run the paged and the contiguous engine side by side at each concurrency; TPS, latency, memory.

    Closed loop: exactly C requests in flight; every point serves the same seeded request list after an
    uncounted warm-up. Writes results.jsonl (point by point), summary.json/csv/md and PNG plots.
    """
    spec = load_scenario(scenario)
    seed = spec.seed if seed is None else seed
    levels = int_list(concurrency, "--concurrency") if concurrency is not None else list(spec.concurrency)
    chosen = name_list(engines, "engines", MANAGERS)
    if utilization is not None and not 0 < utilization <= 1:
        raise KvbenchError(f"--gpu-memory-utilization must be in (0, 1], got {utilization}")
    if repeat < 1:
        raise KvbenchError(f"--repeat must be at least 1, got {repeat}")
    num_requests = requests if requests is not None else spec.requests
    if num_requests < 1:
        raise KvbenchError(f"--requests must be at least 1, got {num_requests}")
    bs = block_size if block_size is not None else spec.block_size
    if bs < 1:
        raise KvbenchError(f"--block-size must be at least 1, got {bs}")
    replay, skipped = None, None
    out = run_directory(out)
    metrics_file = writable_file(metrics_file, "--metrics-file")
    if requests_file is not None:  # replay exact prompts (token ids) and output lengths
        from kvbench.workload.requests_file import load_requests_jsonl

        replay = load_requests_jsonl(requests_file)
        kept, skipped = within_max_len([(len(ids), output) for ids, output in replay], spec.lengths.max_len,
                                       f"records of {requests_file}")
        replay = [replay[index] for index in kept]
        num_requests = len(replay)
        pairs = [(len(ids), output) for ids, output in replay]
    else:
        pairs = spec.lengths.sample(num_requests, seed)
    warm_pairs = [(min(p, 8), min(o, 4)) for p, o in spec.lengths.sample(max(spec.warmup, 0), seed + 1)] if spec.warmup else []
    slots, budget_source = spec.budget_slots()
    max_num_seqs = max(256, *levels)  # the batch cap must not silently lower the concurrency asked for
    console = make_console(stderr=as_json)

    if simulate:
        backend, shape_name, device_name, vocab, budget_source = _simulated_backend(
            model, gpu, dtype, bs, spec, reserve, admission, kv_memory, utilization, max_num_seqs)
    else:
        backend, shape_name, device_name, vocab, budget_source = _tensor_backend(
            model, device, dtype, seed, slots, bs, spec, reserve, admission, kv_memory, utilization, budget_source, console,
            max_num_seqs)

    def make(pairs_list):
        if simulate:
            return lambda: [Request(i, p, o) for i, (p, o) in enumerate(pairs_list)]
        from kvbench.studies.backends import token_requests

        return lambda: token_requests(pairs_list, vocab, seed)

    make_requests = make(pairs)
    if replay is not None and not simulate:
        from kvbench.engine.request import make_request
        from kvbench.engine.sampling import SamplingParams

        if any(token >= vocab for ids, _ in replay for token in ids):
            raise KvbenchError(f"{requests_file}: a prompt token id is outside the model's vocabulary of {vocab}")
        make_requests = lambda: [make_request(i, ids, SamplingParams(max_tokens=out, ignore_eos=True))  # noqa: E731
                                 for i, (ids, out) in enumerate(replay)]
    if spec.samples > 1 and simulate:
        raise KvbenchError(f"scenario {spec.name} samples {spec.samples} per request: parallel sampling runs on the "
                           "tensor engine only (drop --simulate)")
    plan = SweepPlan(chosen, levels, spec.name, make_requests, make(warm_pairs), repeat, continue_on_error,
                     spec.samples)
    if resume and out is None:
        raise KvbenchError("--resume continues a run directory: give it with --out")
    run_dir = new_run_dir("sweep", out)
    lock = DirectoryLock(run_dir, "kvbench sweep")  # held until the process ends: one writer per directory
    if resume:
        torn = recover_results(run_dir / "results.jsonl")
        if torn is not None:
            console.print(f"[yellow]warning: the last line of {run_dir}/results.jsonl was cut short (a crash while "
                          f"writing); set aside in results.jsonl.torn and its point will run again[/yellow]")
    pin_run_config(run_dir, {
        "scenario": spec.name, "model": shape_name, "simulated": simulate, "requests": num_requests, "seed": seed,
        "block_size": bs, "kv_pool_slots": backend.base.num_blocks * bs, "reserve": backend.base.reserve,
        "admission": backend.base.admission, "max_len": spec.lengths.max_len, "repeat": repeat,
        "requests_file": str(requests_file) if requests_file else None, "samples": spec.samples,
        "dtype": str(getattr(backend, "loaded", None) and backend.loaded.dtype),
        # contents, not names: an edited scenario or requests file must not mix with earlier points
        "scenario_sha256": content_sha256(Path(spec.source)) if spec.source else None,
        "requests_file_sha256": content_sha256(requests_file) if requests_file else None,
        "model_config_sha256": _model_config_hash(model),
        "gpu": gpu if simulate else None,
    }, resume)
    meta = run_meta(
        scenario=spec.name, scenario_description=spec.description, scenario_source=spec.source,
        model_name=shape_name, device=device_name, simulated=simulate, seed=seed, requests=num_requests,
        concurrency=levels, engines=chosen, block_size=bs, kv_pool_slots=backend.base.num_blocks * bs,
        budget_source=budget_source, reserve=backend.base.reserve, admission=backend.base.admission,
        max_len=spec.lengths.max_len, repeat=repeat,
        skipped_requests=skipped.as_dict() if skipped else None,
    )
    metrics = _start_metrics(backend, chosen, simulate, metrics_port, metrics_host, metrics_file, metrics_optional,
                             console)  # before any note: a port in use is an error line, alone
    if skipped is not None:
        console.print(f"[yellow]warning: {skipped.sentence(f'records of {requests_file}')}[/yellow]")
    if simulate:
        console.print("[bold yellow]SIMULATED[/bold yellow]: tensor-free simulator, roofline step times of "
                      f"{gpu}; no model runs.")
    console.print(f"KV pool: {budget_source}; block size {bs}; {num_requests} requests per point")
    failed = None
    points: list[dict] = []
    try:
        with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[tps]}"),
                      TimeElapsedColumn(), console=console, transient=True) as progress:
            points = run_sweep(plan, backend, run_dir, resume, _Progress(progress, metrics))
    except PointFailed as err:
        failed = err
        points = err.points
    except KeyboardInterrupt:
        console.print(f"[yellow]interrupted: finished points are kept in {run_dir}/results.jsonl; "
                      "rerun with --resume[/yellow]")
        raise typer.Exit(code=130) from None
    finally:
        _stop_metrics(metrics, metrics_file, console)
    document = write_outputs(run_dir, meta, points)
    lock.release()
    if as_json:
        typer.echo(json_text(document))
    else:
        console.print(article_table(article_rows(points), simulate))
        console.print(detail_table(points))
        if waterfall:
            from kvbench.report.waterfall import waterfall_table

            for point in points:
                if point.get("waterfall"):
                    console.print(waterfall_table(point))
        console.print(f"wrote {run_dir}/ (summary.json, summary.csv, summary.md, results.jsonl, *.png)")
    if failed is not None:
        raise RunFailed(f"point {failed.point['engine']} C={failed.point['concurrency']} failed: "
                        f"{failed.point['error']} (recorded; --continue-on-error goes on past failures)")
    errors = [p for p in points if p["status"] == "error"]
    if errors:
        first = errors[0]
        raise RunFailed(f"{len(errors)} of {len(points)} points failed (recorded in {run_dir}/results.jsonl), e.g. "
                        f"{first['engine']} C={first['concurrency']}: {first.get('error', 'no reason')}")


def _model_config_hash(model: str) -> str | None:
    """The content hash of a local model's config.json (a preset's shape is fixed by its name)."""
    path = Path(model)
    config = path / "config.json" if path.is_dir() else path
    return content_sha256(config) if config.is_file() else None


def _start_metrics(backend, engines, simulate, port, host, path, optional, console):
    """A KvMetrics exporter fed by the tensor engines (None when no metrics were asked for)."""
    if port is None and path is None:
        return None
    if simulate:
        raise KvbenchError("--metrics-port/--metrics-file need the tensor engine: the simulator jumps over steps, "
                           "so there is no live state to export")
    from kvbench.measure.metrics import KvMetrics

    metrics = KvMetrics(device=str(backend.loaded.device))
    for name in engines:  # time every block allocation of the measured runs
        backend.engine(name).alloc_observer = metrics.alloc_observer(name)
    if port is not None:
        try:
            metrics.serve(host, port)
        except KvbenchError as err:
            if not optional:
                raise
            console.print(f"[yellow]warning: {err}; running without the metrics endpoint (--metrics-optional)[/yellow]")
        else:
            console.print(f"Prometheus metrics: {metrics.url}")
    return metrics


def _stop_metrics(metrics, path, console) -> None:
    if metrics is None:
        return
    metrics.close()
    if path is not None:
        metrics.write_textfile(path)
        console.print(f"wrote Prometheus metrics to {path}")


def _engine_config(spec, bs, num_blocks, reserve, admission, max_num_seqs):
    from kvbench.engine.config import EngineConfig

    return EngineConfig(block_size=bs, num_blocks=num_blocks, reserve=reserve or spec.reserve,
                        admission=admission or spec.admission, max_num_seqs=max_num_seqs, max_len=spec.lengths.max_len)


def _simulated_backend(model, gpu, dtype, bs, spec, reserve, admission, kv_memory, utilization, max_num_seqs):
    """The simulator's pool is the GPU preset's KV budget (vLLM's rule) unless --kv-memory sets it."""
    from kvbench.models.gpus import kv_budget, resolve_gpu
    from kvbench.models.shapes import resolve_model
    from kvbench.studies.backends import SimulatedBackend

    name = "llama-2-13b" if model == "tiny" else model  # tiny is for real runs on CPU; simulate the article's model
    shape = resolve_model(name, dtype or "fp16")
    device = resolve_gpu(gpu)
    share = 0.9 if utilization is None else utilization
    budget = kv_budget(shape, device, share)
    if kv_memory:
        kv_bytes, source = parse_size(kv_memory, "--kv-memory"), f"--kv-memory {kv_memory}"
    else:
        kv_bytes = budget.kv_bytes
        source = f"{shape.name} {shape.dtype} on {device.name} at {share} utilization"
    if kv_bytes <= 0:
        raise KvbenchError(f"{shape.name} does not fit on {device.name} at {share} utilization")
    num_blocks = kv_bytes // (shape.bytes_per_token * bs)
    if num_blocks < 1:
        raise KvbenchError("the KV budget holds no block; raise --kv-memory")
    source = f"{num_blocks * bs:,} token slots = {source}" + (" (--model tiny simulates llama-2-13b)" if model == "tiny" else "")
    config = _engine_config(spec, bs, num_blocks, reserve, admission, max_num_seqs)
    return SimulatedBackend(shape, device, config), shape.name, f"{device.name} (simulated)", shape.vocab_size, source


def _tensor_backend(model, device, dtype, seed, slots, bs, spec, reserve, admission, kv_memory, utilization,
                    budget_source, console, max_num_seqs):
    from kvbench.engine.build import blocks_for_budget, cuda_kv_budget, load_model
    from kvbench.studies.backends import TensorBackend

    with console.status(f"building model {model}..."):
        loaded = load_model(model, device, dtype, seed)
    if kv_memory:
        num_blocks = blocks_for_budget(parse_size(kv_memory, "--kv-memory"), loaded.shape, bs)
        budget_source = f"--kv-memory {kv_memory}"
    elif utilization is not None:
        if loaded.device.type != "cuda":
            raise KvbenchError("--gpu-memory-utilization sizes the pool from GPU memory; on CPU use --kv-memory")
        num_blocks = blocks_for_budget(cuda_kv_budget(loaded, utilization), loaded.shape, bs)
        budget_source = f"{utilization} x GPU memory - used - activations"
    else:
        num_blocks = slots // bs
    if num_blocks < 1:
        raise KvbenchError("the KV budget holds no block; raise --kv-memory")
    config = _engine_config(spec, bs, num_blocks, reserve, admission, max_num_seqs)
    device_name = str(loaded.device)
    if loaded.device.type == "cuda":
        import torch

        device_name = torch.cuda.get_device_name(loaded.device)
    return TensorBackend(loaded, config), loaded.shape.name, device_name, loaded.shape.vocab_size, budget_source


def scenarios() -> None:
    """List the built-in scenarios with a one-line description."""
    from rich.table import Table

    from kvbench.workload.scenario import builtin_scenarios

    table = Table(title="Built-in scenarios (kvbench sweep --scenario NAME, or a TOML file of your own)")
    table.add_column("name")
    table.add_column("description")
    for name in sorted(builtin_scenarios()):
        table.add_row(name, load_scenario(name).description)
    make_console().print(table)


def register(app: typer.Typer) -> None:
    app.command("sweep")(sweep)
    app.command("scenarios")(scenarios)
