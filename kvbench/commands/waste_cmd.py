"""``kvbench waste``: where KV memory goes under each strategy, analytic and measured."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from kvbench.commands._options import human_bytes, int_list, make_console, name_list, run_directory
from kvbench.engine.timing import RooflineTiming
from kvbench.errors import KvbenchError
from kvbench.fileio import json_text
from kvbench.models.gpus import kv_budget, resolve_gpu
from kvbench.models.shapes import resolve_model
from kvbench.report.points import point_from_result
from kvbench.report.rundir import (
    flatten,
    markdown_table,
    new_run_dir,
    run_meta,
    summary_document,
    write_summary,
)
from kvbench.studies.waste import CONTIGUOUS_STRATEGIES, parse_strategies, run_strategy
from kvbench.workload.admissible import within_max_len
from kvbench.workload.lengths import DISTRIBUTIONS, LengthSpec, load_trace

STRATEGY_NAMES = (*CONTIGUOUS_STRATEGIES, "paged")


def analytic_waste(mean_len: float, max_len: int) -> float:
    """The seed article's estimate for a max-length reservation: (max_len - actual) / max_len."""
    return (max_len - mean_len) / max_len


def waste(
    max_len: int = typer.Option(2048, "--max-len", help="Model context limit; contiguous-max reserves this."),
    model: str = typer.Option("llama-2-13b", "--model", help="Preset name or a local config.json / checkpoint dir."),
    gpu: str = typer.Option("a100-80g", "--gpu", help="GPU preset whose memory sets the KV budget."),
    utilization: float = typer.Option(0.9, "--gpu-memory-utilization", help="Share of GPU memory kvbench may use."),
    dtype: str = typer.Option("fp16", "--dtype", help="fp32 | fp16 | bf16 (KV and weights)."),
    mean_len: int = typer.Option(500, "--mean-len", help="Mean total length (prompt + output) in tokens."),
    distribution: str = typer.Option("lognormal", "--distribution", help=f"Length distribution: {', '.join(DISTRIBUTIONS)}."),
    prompt_ratio: float = typer.Option(0.5, "--prompt-ratio", help="Share of each request's length that is prompt."),
    trace: Path | None = typer.Option(None, "--trace", help="CSV/JSONL of prompt_len,output_len instead of a distribution."),
    requests: int = typer.Option(2000, "--requests", help="Requests to simulate per strategy."),
    concurrency: int = typer.Option(256, "--concurrency", help="Requests in flight (closed loop) and batch cap."),
    block_sizes: str = typer.Option("16", "--block-size", help="Paged block size(s), e.g. 16 or 8,16,32."),
    strategies: str = typer.Option(",".join(STRATEGY_NAMES), "--strategies", help="Comma-separated strategies."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of the length sampler."),
    out: str | None = typer.Option(None, "--out", help="Run directory (default reports/waste-<time>)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout instead of tables."),
) -> None:
    """Measure token states vs reservation, internal and external waste for each KV strategy.

    Runs the same seeded workload through the tensor-free simulator once per strategy, on a KV budget
    from the model and GPU, and prints the article's analytic estimate next to the measured shares.
    """
    if max_len < 2:
        raise KvbenchError(f"--max-len must be at least 2, got {max_len}")
    if requests < 1:
        raise KvbenchError(f"--requests must be at least 1, got {requests}")
    if concurrency < 1:
        raise KvbenchError(f"--concurrency must be at least 1, got {concurrency}")
    out_dir = run_directory(out)
    sizes = int_list(block_sizes, "--block-size")
    chosen = parse_strategies(name_list(strategies, "strategies", STRATEGY_NAMES), sizes)
    shape = resolve_model(model, dtype)
    device = resolve_gpu(gpu)
    budget = kv_budget(shape, device, utilization)
    if not budget.fits:
        raise KvbenchError(
            f"{shape.name} ({dtype}) does not fit on {device.name} at utilization {utilization}: weights "
            f"{human_bytes(shape.weight_bytes)} + activations {human_bytes(budget.activation_bytes)} > "
            f"{human_bytes(budget.usable_bytes)}"
        )
    console = make_console(stderr=as_json)
    skipped = None
    if trace is not None:
        pairs = load_trace(trace)
        kept, skipped = within_max_len(pairs, max_len, f"requests of trace {trace}")
        pairs = [pairs[index] for index in kept]
        source = f"trace {trace}"
    else:
        pairs = LengthSpec(mean_len, max_len, distribution, prompt_ratio).sample(requests, seed)
        source = f"{distribution} lengths, mean {mean_len}, prompt ratio {prompt_ratio}"
    pool_slots = budget.kv_bytes // shape.bytes_per_token
    timing = RooflineTiming.for_model(shape, device)
    actual_mean = sum(p + o for p, o in pairs) / len(pairs)
    if trace is not None:
        mean_len = round(actual_mean)  # the article's estimate at the trace's own mean (of the runnable requests)
        if skipped is not None:
            console.print(f"[yellow]warning: {skipped.sentence('trace requests')}; left out of the shares and "
                          "of the analytic estimate[/yellow]")
        if requests != 2000:
            console.print("[yellow]warning: --requests is ignored with --trace (the trace sets the requests)[/yellow]")

    for strategy in chosen:  # fail before simulating anything
        strategy.validate(pool_slots)
    points = []
    with console.status("simulating...") as status:
        for strategy in chosen:
            status.update(f"simulating {strategy.name} ({len(pairs)} requests)")
            result = run_strategy(strategy, pairs, pool_slots, max_len, concurrency, timing)
            points.append(_point(strategy.name, result, concurrency, shape.bytes_per_token))

    analytic = {
        "formula": "(max_len - actual_len) / max_len",
        "at_mean_len_pct": 100 * analytic_waste(mean_len, max_len),
        "at_sampled_mean_pct": 100 * analytic_waste(actual_mean, max_len),
        "mean_len": mean_len,
        "sampled_mean_len": actual_mean,
    }
    meta = run_meta(
        model=shape.to_dict(), gpu=device.name, gpu_memory_utilization=utilization, max_len=max_len,
        workload=source, requests=len(pairs), seed=seed, concurrency=concurrency, simulated=True,
        kv_budget_bytes=budget.kv_bytes, pool_slots=pool_slots, scenario="waste",
        skipped_requests=skipped.as_dict() if skipped else None,
    )
    document = summary_document("waste", meta, points, analytic=analytic)
    run_dir = new_run_dir("waste", out_dir)
    title = f"KV pool breakdown: {shape.name} {dtype} on {device.name}, max-len {max_len}"
    subtitle = f"{source}; {len(pairs)} requests, concurrency {concurrency}; simulated"
    from kvbench.report.plots import waste_breakdown  # matplotlib loads only when a plot is drawn

    waste_breakdown([p["engine"] for p in points], [p["waste"] for p in points], run_dir / "waste.png", title, subtitle)
    write_summary(run_dir, document, [flatten(p) for p in points], _markdown(document))

    if as_json:
        typer.echo(json_text(document))
        return
    _print(console, document, run_dir)


def _point(name: str, result, concurrency: int, bytes_per_token: int) -> dict:
    """The sweep's point schema, plus what only a waste study reports."""
    point = point_from_result(result, name, concurrency, "waste", bytes_per_token)
    point.update(
        max_concurrency=result.peak_running,
        bytes_per_token=bytes_per_token,
        simulated_seconds=result.accountant.elapsed_s,
    )
    return point


def _markdown(document: dict) -> str:
    analytic = document["analytic"]
    meta = document["meta"]
    head = (
        f"# kvbench waste\n\nModel {meta['model']['name']} ({meta['model']['dtype']}), GPU {meta['gpu']}, "
        f"max-len {meta['max_len']}, {meta['workload']}, {meta['requests']} requests, "
        f"concurrency {meta['concurrency']} (simulated).\n\n"
        f"Analytic estimate (max-len reservation): {analytic['at_mean_len_pct']:.1f}% wasted at mean length "
        f"{analytic['mean_len']}; {analytic['at_sampled_mean_pct']:.1f}% at the sampled mean "
        f"{analytic['sampled_mean_len']:.0f}.\n\n"
    )
    rows = [[p["engine"], p["waste"]["token_state_pct"], p["waste"]["reservation_pct"], p["waste"]["internal_pct"],
             p["waste"]["external_pct"], p["waste"]["free_pct"], p["effective_usage_pct"], p["mean_running"],
             p["peak_running"], p["output_throughput"]] for p in document["points"]]
    return head + markdown_table(
        ["strategy", "token states %", "reservation %", "internal %", "external %", "free %",
         "effective usage %", "mean running", "peak running", "output tok/s (sim)"], rows)


def _print(console, document: dict, run_dir: Path) -> None:
    analytic = document["analytic"]
    meta = document["meta"]
    console.print(
        f"[bold]Analytic estimate[/bold] (article: reserve max-len for everyone): "
        f"waste = (max_len - actual) / max_len = ({meta['max_len']} - {analytic['mean_len']}) / {meta['max_len']} = "
        f"[bold]{analytic['at_mean_len_pct']:.1f}%[/bold]  (at the sampled mean {analytic['sampled_mean_len']:.0f}: "
        f"{analytic['at_sampled_mean_pct']:.1f}%)"
    )
    table = Table(title=f"Measured KV pool shares, time-averaged — {meta['model']['name']} on {meta['gpu']} "
                  f"(pool {human_bytes(meta['kv_budget_bytes'])}, {meta['pool_slots']:,} token slots, "
                  f"{document['points'][0]['bytes_per_token'] if document['points'] else 0:,} B/token; simulated)")
    for column in ("strategy", "used", "reserv.", "internal", "external", "free", "effective",
                   "running mean/peak", "out tok/s", "preempt"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for p in document["points"]:
        w = p["waste"]
        table.add_row(
            p["engine"], f"{w['token_state_pct']:.1f}%", f"{w['reservation_pct']:.1f}%", f"{w['internal_pct']:.1f}%",
            f"{w['external_pct']:.1f}%", f"{w['free_pct']:.1f}%", f"{p['effective_usage_pct']:.1f}%",
            f"{p['mean_running']:.1f} / {p['peak_running']}", f"{p['output_throughput']:,.0f}", str(p["preemptions"]),
        )
    console.print(table)
    console.print(f"wrote {run_dir}/summary.json, summary.csv, summary.md, waste.png")


def register(app: typer.Typer) -> None:
    app.command("waste")(waste)
