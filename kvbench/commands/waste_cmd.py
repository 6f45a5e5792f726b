"""``kvbench waste``: where KV memory goes under each strategy, analytic and measured."""

from __future__ import annotations

from pathlib import Path

import typer

from kvbench.commands._deployment_options import DEPLOYMENT, Deployment, deployment_fields
from kvbench.commands._flags import (
    BLOCK_SIZE,
    CONCURRENCY,
    DATASET,
    JSON,
    MAX_LEN,
    MEAN_LEN,
    OUT,
    REQUESTS,
    SEED,
    STOP,
    TRACE,
)
from kvbench.commands._options import choice, choice_list, int_list, make_console, name_list, run_directory
from kvbench.commands._run import write_study
from kvbench.errors import KvbenchError
from kvbench.kv.policies import check_choice
from kvbench.report.waste_report import print_waste, waste_markdown, waste_plot
from kvbench.studies.run_requests import STOP_MODES
from kvbench.studies.waste import (
    STRATEGY_NAMES,
    WasteSettings,
    parse_strategies,
    run_waste_study,
    waste_budget,
    waste_workload,
)
from kvbench.workload.lengths import DISTRIBUTIONS

DEFAULT_REQUESTS = 2000


@DEPLOYMENT.add(
    settings=WasteSettings,
    without=("kv_cache_memory",),
    helps={"gpu": "GPU preset whose memory sets the KV budget."},
)
def waste(
    max_len: int = MAX_LEN(2048),
    mean_len: int = MEAN_LEN(500),
    distribution: str = typer.Option(
        "lognormal", "--distribution", help="Length distribution.", **choice(DISTRIBUTIONS, "length distribution")
    ),
    prompt_ratio: float = typer.Option(0.5, "--prompt-ratio", help="Share of each request's length that is prompt."),
    trace: Path | None = TRACE(None),
    dataset: str | None = DATASET(
        None,
        "Real prompts and answer lengths from a ShareGPT JSON or {prompt, output_len} JSONL file (or "
        "'real-chat'), tokenized with --model's tokenizer when it has one.",
    ),
    stop: str = STOP(
        "length",
        "length: reserve knowing each length; eos: answers end at their length but reservations plan for "
        "max-len - prompt (the oracle becomes a hindsight bound).",
    ),
    requests: int | None = REQUESTS(
        None, f"Requests to simulate per strategy (default {DEFAULT_REQUESTS}; a --trace sets its own)."
    ),
    concurrency: int = CONCURRENCY(256, "Requests in flight (closed loop) and the batch cap."),
    block_sizes: str = BLOCK_SIZE("16", "Tokens per KV block; a list compares several, e.g. 8,16,32."),
    strategies: str = typer.Option(
        ",".join(STRATEGY_NAMES),
        "--strategies",
        help="Comma-separated strategies.",
        **choice_list(STRATEGY_NAMES, "strategies"),
    ),
    seed: int = SEED(0, "Seed of the length sampler."),
    out: str | None = OUT(None, "Run directory (default reports/waste-<time>)."),
    as_json: bool = JSON(False, "Print the summary as JSON on stdout instead of tables."),
    *,
    deployment: Deployment,
) -> None:
    """Where KV memory goes per strategy: token states, reservation and fragmentation.

    Runs the same seeded workload through the tensor-free simulator once per strategy, on a KV budget
    from the model and GPU, and prints the article's analytic estimate next to the measured shares.
    """
    out_dir = run_directory(out)
    if dataset is not None and trace is not None:
        raise KvbenchError("--dataset and --trace both give the requests: choose one")
    check_choice(stop, STOP_MODES, "--stop")
    chosen = parse_strategies(
        name_list(strategies, "strategies", STRATEGY_NAMES), int_list(block_sizes, "--block-size")
    )
    settings = WasteSettings(
        **deployment_fields(deployment, WasteSettings),
        max_len=max_len,
        mean_len=mean_len,
        distribution=distribution,
        prompt_ratio=prompt_ratio,
        trace=trace,
        requests=requests or DEFAULT_REQUESTS,
        concurrency=concurrency,
        strategies=tuple(chosen),
        seed=seed,
        dataset=dataset,
        stop=stop,
        requests_given=requests is not None,
    )
    console = make_console(stderr=as_json)
    checked = waste_budget(settings)  # the model, the GPU and a pool every strategy can simulate: before any work
    if checked.shape.sliding_layers:
        console.print(
            f"[yellow]note: {len(checked.shape.sliding_layers)} of {checked.shape.num_layers} layers keep "
            f"a window of {checked.shape.sliding_window:,} tokens; the simulated pool counts every layer "
            "growing, so its slots are a lower bound (kvbench capacity costs each layer)[/yellow]"
        )
    workload = waste_workload(settings)
    if workload.skipped is not None:
        console.print(
            f"[yellow]warning: {workload.skipped.sentence('trace requests')}; left out of the shares "
            "and of the analytic estimate[/yellow]"
        )
    if workload.dataset is not None:
        console.print(f"dataset: {workload.dataset.note()}")
    if trace is not None and requests is not None:
        console.print("[yellow]warning: --requests is ignored with --trace (the trace sets the requests)[/yellow]")
    with console.status("simulating...") as status:
        study = run_waste_study(settings, workload, status.update)
    write_study(
        "waste",
        out_dir,
        study,
        as_json,
        plot=waste_plot,
        plot_file="waste.png",
        markdown=waste_markdown,
        tables=lambda run_dir: print_waste(console, study, run_dir),
    )


def register(app: typer.Typer) -> None:
    app.command("waste")(waste)
