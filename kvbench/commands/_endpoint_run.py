"""``sweep --target``: settings -> the endpoint sweep -> its report (the servers-over-HTTP side of ``sweep``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbench.commands._options import make_console
from kvbench.commands._run import Run, show
from kvbench.errors import KvbenchError, RunFailed
from kvbench.report.endpoint_report import (
    EndpointConsoleProgress,
    print_endpoint_sweep,
    write_endpoint_outputs,
)
from kvbench.studies.endpoint_sweep import EndpointSweep
from kvbench.studies.run_options import SweepOptions
from kvbench.studies.sweep import pin_run_config
from kvbench.studies.sweep_setup import SweepSetup
from kvbench.values import printable

DEFAULT_ENGINES = "paged,contiguous"


def check_target_run(options: SweepOptions, engines: str, resume: bool, on_ray: bool, metrics: bool) -> None:
    """What cannot go with --target, refused before a server is asked anything."""
    if engines != DEFAULT_ENGINES:
        raise KvbenchError("--engines names kvbench's in-process engines; with --target the targets are the columns")
    if options.simulate:
        raise KvbenchError("--target measures real servers: it cannot be simulated")
    if resume:
        raise KvbenchError(
            "--resume does not continue a --target run (a server's state between runs is its own): "
            "start a new run directory"
        )
    if on_ray:
        raise KvbenchError("--ray fans in-process engines out to workers; a --target run loads servers over HTTP")
    if metrics:
        raise KvbenchError(
            "--metrics-port/--metrics-file export kvbench's in-process engines; a server over HTTP "
            "has its own /metrics, which --target reads"
        )
    if options.repeat != 1 and options.endpoint is not None and options.endpoint.find_max:
        raise KvbenchError(
            "--find-max bisects on one measurement per level; --repeat goes with a sweep of fixed levels"
        )
    endpoint = options.endpoint
    sized = endpoint is not None and (endpoint.input_len is not None or endpoint.output_len is not None)
    if sized and (options.requests_file is not None or options.dataset is not None):
        raise KvbenchError("--input-len/--output-len size drawn requests, not --requests-file or --dataset")
    if sized and endpoint is not None and (endpoint.trace is not None or endpoint.prefix_hit_rate is not None):
        raise KvbenchError(
            "--input-len/--output-len size drawn requests; --trace and --prefix-hit-rate shape their own"
        )
    if endpoint is not None and endpoint.output_len is not None and options.stop == "eos":
        raise KvbenchError("--output-len asks each answer for its length: it goes with --stop length")


def sweep_targets(options: SweepOptions, out_dir: Path | None, as_json: bool, wide: bool) -> None:
    console = make_console(stderr=as_json)
    with console.status("preparing the sweep...") as status:
        setup = SweepSetup.resolve(options, status.update)
    run = Run("sweep")
    searches: list[Any] = []
    with run.guarded(lambda: _interrupted(console, run)):
        run_dir = run.open(out_dir)
        pin_run_config(run_dir, setup.pinned_config(), resume=False)
        for note in setup.backends.notes():
            console.print(f"[dim]{note}[/dim]")
        console.print(f"targets: {_targets_text(options, setup)}", markup=False, highlight=False)
        console.print(f"requests: {_requests_text(setup)}; stop: {setup.stop_text}", markup=False, highlight=False)
        sweep = EndpointSweep(setup, run_dir, EndpointConsoleProgress(console))
        stopped: KvbenchError | None = None  # a server that stopped answering after some points
        try:
            sweep.run()
        except KvbenchError as error:
            if not sweep.done.points or isinstance(error, RunFailed):
                raise
            stopped = error  # the points measured before it are summarised below
        run.points, searches = sweep.done.points, sweep.done.searches
    if run.dir is None:
        raise AssertionError("the run directory is opened before any point")
    run_dir = run.dir.path
    document = write_endpoint_outputs(run_dir, setup.meta(), run.points, searches)
    run.dir.release()
    show(document, as_json, lambda: print_endpoint_sweep(console, document, run_dir, wide))
    if stopped is not None:
        raise RunFailed(
            f"the sweep stopped after {len(run.points)} point(s): {stopped}; the points measured before are "
            f"summarised in {run_dir}"
        )
    failed = [p for p in run.points if p["status"] != "ok"]
    if failed:
        first = failed[0]
        raise RunFailed(
            f"{len(failed)} of {len(run.points)} points had failed requests (recorded in "
            f"{run_dir}/results.jsonl), e.g. {first['engine']} {_level(first)}: {first.get('error')}"
        )


def _targets_text(options: SweepOptions, setup: SweepSetup) -> str:
    """The targets and the model(s) they serve (what /v1/models listed and the requests name)."""
    endpoint = options.endpoint
    if endpoint is None:
        return ""
    urls = ", ".join(f"{name} = {target.url}" for name, target in zip(endpoint.names, endpoint.targets, strict=True))
    return f"{urls}; serving {printable(setup.model_name)}"


def _requests_text(setup: SweepSetup) -> str:
    """How long the prompts and answers are: the numbers a reader sizes the run by."""
    pairs = setup.workload.pairs
    prompts, answers = [p for p, _ in pairs], [o for _, o in pairs]
    counts = sorted(set(setup.counts.values()))
    per_point = f"{counts[0]} per point" if len(counts) == 1 else f"{counts[0]}-{counts[-1]} per point"
    return (
        f"{per_point}, prompts {min(prompts):,}-{max(prompts):,} tokens (mean {sum(prompts) / len(prompts):,.0f}), "
        f"answers {min(answers):,}-{max(answers):,} (mean {sum(answers) / len(answers):,.0f}), max-len "
        f"{setup.config.max_len:,}"
    )


def _level(point: dict[str, Any]) -> str:
    rate = point.get("request_rate")
    return f"C={point['concurrency']}" if rate is None else f"{rate:g} req/s"


def _interrupted(console: Any, run: Run) -> None:
    if run.dir is not None:
        console.print(f"[yellow]interrupted: finished points are kept in {run.dir.path}/results.jsonl[/yellow]")
