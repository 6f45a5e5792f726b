"""``kvbench share``: KV memory with and without block sharing, for parallel sampling and beam search."""

from __future__ import annotations

import math

import typer
from rich.table import Table

from kvbench.commands._options import human_bytes, make_console, run_directory
from kvbench.errors import KvbenchError
from kvbench.fileio import json_text
from kvbench.report.rundir import markdown_table, new_run_dir, run_meta, summary_document, write_summary

ANCHORS = {
    "parallel": "article: n=5 costs +40% memory instead of +500%; paper: sharing saves 6.1-9.8% (Alpaca), "
                "16.2-30.5% (ShareGPT)",
    "beam": "article: beam width 4 costs 2.1x instead of 4x; paper: sharing saves 37.6-55.2% (Alpaca), "
            "44.3-66.3% (ShareGPT)",
}


def share(
    n: int | None = typer.Option(None, "--n", help="Parallel sampling: samples per prompt."),
    beam: int | None = typer.Option(None, "--beam", help="Beam search: beam width."),
    prompts: int = typer.Option(8, "--prompts", help="Number of prompts."),
    prompt_len: int = typer.Option(64, "--prompt-len", help="Mean prompt length (uniform +-50%)."),
    output_len: int = typer.Option(64, "--output-len", help="Tokens generated per sample / beam."),
    block_size: int = typer.Option(16, "--block-size", help="Tokens per KV block."),
    reserve: str = typer.Option("oracle", "--reserve", help="Contiguous reservation per copy: max | pow2 | oracle."),
    max_len: int = typer.Option(2048, "--max-len", help="Context limit (contiguous max reservation)."),
    num_blocks: int = typer.Option(4096, "--num-blocks", help="KV pool size in blocks."),
    length_penalty: float = typer.Option(1.0, "--length-penalty", help="Beam search length penalty."),
    model: str = typer.Option("tiny", "--model", help="Preset (random weights) or local checkpoint dir."),
    device: str = typer.Option("auto", "--device", help="auto | cpu | cuda."),
    seed: int = typer.Option(0, "--seed", min=0, help="Seed of prompts, weights and samplers."),
    out: str | None = typer.Option(None, "--out", help="Run directory (default reports/share-<time>)."),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON on stdout."),
) -> None:
    """KV blocks with sharing vs without, peak and step-averaged, and the memory saved by sharing.

    --n N: parallel sampling (the paged engine forks the prompt's blocks; copy-on-write on the first write
    into a shared block); --beam K: beam search (beams fork and free block tables). Compared with the same
    work done by private copies (paged) and by per-copy reservations (contiguous).
    """
    if (n is None) == (beam is None):
        raise KvbenchError("give exactly one of --n (parallel sampling) or --beam (beam search)")
    width = n if n is not None else beam
    if width < 1:
        raise KvbenchError(f"{'--n' if n is not None else '--beam'} must be at least 1, got {width}")
    if not math.isfinite(length_penalty):
        raise KvbenchError(f"--length-penalty must be a finite number, got {length_penalty}")
    if output_len < 1 or block_size < 1 or num_blocks < 1:
        raise KvbenchError("--output-len, --block-size and --num-blocks must be at least 1")
    out_dir = run_directory(out)
    from kvbench.engine.build import load_model  # torch loads only when the command runs
    from kvbench.engine.config import EngineConfig
    from kvbench.models.runner import ModelRunner
    from kvbench.studies.share import (
        beam_search,
        check_pool_holds_copies,
        make_prompts,
        parallel_sampling,
        savings,
    )

    loaded = load_model(model, device, None, seed)
    config = EngineConfig(block_size=block_size, num_blocks=num_blocks, reserve=reserve, max_len=max_len)
    texts = make_prompts(prompts, prompt_len, loaded.shape.vocab_size, seed)
    bpt = loaded.shape.bytes_per_token
    console = make_console(stderr=as_json)
    kind = "parallel" if n is not None else "beam"
    check_pool_holds_copies(texts, width, output_len, config, kind)
    with console.status(f"measuring {kind} width {width} and width 1..."):
        if kind == "parallel":
            measured = parallel_sampling(loaded.model, config, texts, width, output_len, seed, bpt)
            singles = (measured if width == 1
                       else parallel_sampling(loaded.model, config, texts, 1, output_len, seed, bpt))
        else:
            runner = ModelRunner(loaded.model, num_blocks, block_size)
            measured = beam_search(runner, config, texts, width, output_len, bpt, length_penalty)
            singles = measured if width == 1 else beam_search(runner, config, texts, 1, output_len, bpt, length_penalty)
    reported = measured if width == 1 else measured + singles  # width 1 is its own baseline: one point per mode
    ratios = savings(measured, singles)
    identical = measured[0].outputs == measured[1].outputs
    points = [{**m.as_dict(), "engine": m.mode, "concurrency": m.width, "scenario": f"share-{kind}", "status": "ok"}
              for m in reported]
    meta = run_meta(kind=kind, width=width, prompts=prompts, prompt_len=prompt_len, output_len=output_len,
                    block_size=block_size, reserve=reserve, model_name=loaded.shape.name, device=str(loaded.device),
                    seed=seed, anchors=ANCHORS[kind], outputs_identical_with_and_without_sharing=identical)
    document = summary_document("share", meta, points, savings=ratios)
    run_dir = new_run_dir("share", out_dir)
    _plot(run_dir, reported, kind, width, loaded.shape.name)
    rows = [[m.mode, m.width, m.mean_blocks, m.peak_blocks, human_bytes(m.as_dict()["mean_bytes"])] for m in reported]
    md = f"# kvbench share ({kind}, width {width})\n\n" + markdown_table(
        ["mode", "width", "mean blocks", "peak blocks", "mean bytes"], rows) + "\n" + json_text(ratios) + "\n"
    write_summary(run_dir, document, points, md)
    if as_json:
        typer.echo(json_text(document))
        return
    table = Table(title=f"KV blocks, {kind} width {width} vs 1 ({prompts} prompts, ~{prompt_len} prompt + {output_len} "
                        f"output tokens, block {block_size}, {loaded.shape.name})")
    for column in ("mode", "width", "mean blocks", "peak blocks", "mean memory", "cost vs width 1"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for m in reported:
        cost = ratios.get(f"{m.mode}_cost_vs_width1_mean") if m.width == width and width != 1 else None
        table.add_row(m.mode, str(m.width), f"{m.mean_blocks:,.1f}", str(m.peak_blocks),
                      human_bytes(m.as_dict()["mean_bytes"]), "-" if cost is None else f"{cost:.2f}x")
    console.print(table)
    console.print(f"memory saved by sharing (paper's definition): {_pct(ratios['saved_by_sharing_pct_mean'])} "
                  f"step-averaged, {_pct(ratios['saved_by_sharing_pct_peak'])} at peak")
    console.print(f"outputs identical with and without sharing: {identical}")
    console.print(f"anchors — {ANCHORS[kind]}")
    console.print(f"wrote {run_dir}/ (summary.json, summary.csv, summary.md, share.png)")


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}%"


def _plot(run_dir, reported, kind, width, model_name) -> None:
    from kvbench.report import plots

    labels = [f"{m.mode}\nwidth {m.width}" for m in reported]
    plots.bars(labels, {"mean blocks": [m.mean_blocks for m in reported],
                        "peak blocks": [m.peak_blocks for m in reported]},
               run_dir / "share.png", f"KV blocks with and without sharing: {kind}, width {width} ({model_name})",
               "KV blocks in use", "lower")


def register(app: typer.Typer) -> None:
    app.command("share")(share)
