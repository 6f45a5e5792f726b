"""``kvbench waste``: where KV memory goes under each strategy, analytic and measured."""

from __future__ import annotations

from pathlib import Path

import typer

from kvbench.commands._deployment_options import DEPLOYMENT, Deployment, deployment_fields
from kvbench.commands._options import (
    choice,
    choice_list,
    int_list,
    json_option,
    make_console,
    name_list,
    out_option,
    run_directory,
    seed_option,
)
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
    max_len: int = typer.Option(2048, "--max-len", min=2, help="Model context limit; contiguous-max reserves this."),
    mean_len: int = typer.Option(500, "--mean-len", help="Mean total length (prompt + output) in tokens."),
    distribution: str = typer.Option(
        "lognormal", "--distribution", help="Length distribution.", **choice(DISTRIBUTIONS, "length distribution")
    ),
    prompt_ratio: float = typer.Option(0.5, "--prompt-ratio", help="Share of each request's length that is prompt."),
    trace: Path | None = typer.Option(
        None, "--trace", help="CSV/JSONL of prompt_len,output_len instead of a distribution."
    ),
    dataset: str | None = typer.Option(
        None,
        "--dataset",
        help="ShareGPT JSON or {prompt, output_len} JSONL (or 'real-chat'): real prompts and answer lengths, "
        "tokenized with --model's tokenizer when it has one.",
    ),
    stop: str = typer.Option(
        "length",
        "--stop",
        help="length: reserve knowing each length (as before); eos: answers end at their length but reservations "
        "plan for max-len - prompt (the oracle becomes a hindsight bound).",
        **choice(STOP_MODES),
    ),
    requests: int | None = typer.Option(
        None,
        "--requests",
        min=1,
        help=f"Requests to simulate per strategy (default {DEFAULT_REQUESTS}; a --trace sets its own).",
    ),
    concurrency: int = typer.Option(
        256, "--concurrency", min=1, help="Requests in flight (closed loop) and batch cap."
    ),
    block_sizes: str = typer.Option("16", "--block-size", help="Paged block size(s), e.g. 16 or 8,16,32."),
    strategies: str = typer.Option(
        ",".join(STRATEGY_NAMES),
        "--strategies",
        help="Comma-separated strategies.",
        **choice_list(STRATEGY_NAMES, "strategies"),
    ),
    seed: int = seed_option("Seed of the length sampler."),
    out: str | None = out_option("Run directory (default reports/waste-<time>)."),
    as_json: bool = json_option("Print the summary as JSON on stdout instead of tables."),
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
        document = run_waste_study(settings, workload, status.update)
    write_study(
        "waste",
        out_dir,
        document,
        as_json,
        plot=waste_plot,
        plot_file="waste.png",
        markdown=waste_markdown,
        tables=lambda run_dir: print_waste(console, document, run_dir),
    )


def register(app: typer.Typer) -> None:
    app.command("waste")(waste)
