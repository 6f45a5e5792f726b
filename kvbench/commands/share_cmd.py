"""``kvbench share``: KV memory with and without block sharing, for parallel sampling and beam search."""

from __future__ import annotations

import math

import typer

from kvbench.commands._flags import (
    BLOCK_SIZE,
    DATASET,
    DEVICE,
    JSON,
    MAX_LEN,
    MODEL,
    OUT,
    OUTPUT_LEN,
    REQUESTS,
    RESERVE,
    SEED,
    STOP,
    THREADS,
)
from kvbench.commands._options import make_console, run_directory, thread_count
from kvbench.commands._run import write_study
from kvbench.errors import KvbenchError
from kvbench.kv.policies import RESERVATION_POLICIES, check_choice
from kvbench.report.share_report import print_share, share_markdown, share_plot
from kvbench.studies.run_requests import STOP_MODES
from kvbench.studies.share import ShareSettings, run_share_study


def share(
    n: int | None = typer.Option(None, "--n", min=1, help="Parallel sampling: samples per prompt."),
    beam: int | None = typer.Option(None, "--beam", min=1, help="Beam search: beam width."),
    prompts: int = REQUESTS(8, "Prompts, each a request of --n samples or --beam beams."),
    prompt_len: int = typer.Option(64, "--prompt-len", min=1, help="Mean prompt length (uniform +-50%)."),
    output_len: int = OUTPUT_LEN(64, "Tokens generated per sample / beam."),
    block_size: int = BLOCK_SIZE(16),
    reserve: str = RESERVE("oracle", "What a contiguous copy reserves."),
    max_len: int = MAX_LEN(2048),
    num_blocks: int = typer.Option(4096, "--num-blocks", min=1, help="KV pool size in blocks."),
    length_penalty: float = typer.Option(1.0, "--length-penalty", help="Beam search length penalty."),
    model: str = MODEL("tiny", "Preset (random weights) or local checkpoint dir."),
    device: str = DEVICE("auto"),
    seed: int = SEED(0, "Seed of prompts, weights and samplers."),
    threads: str = THREADS("auto"),
    dataset: str | None = DATASET(
        None, "Prompts from a ShareGPT JSON or {prompt} JSONL file (or 'real-chat') instead of random token ids."
    ),
    stop: str | None = STOP(
        None,
        "eos: samples end at the model's EOS, at most --output-len tokens (default for --n on a real model with a "
        "tokenizer); length: every sample runs --output-len tokens.",
    ),
    out: str | None = OUT(None, "Run directory (default reports/share-<time>)."),
    as_json: bool = JSON(False, "Print the summary as JSON on stdout."),
) -> None:
    """KV memory with and without block sharing, for parallel sampling and beam search.

    KV blocks with sharing vs without, peak and step-averaged, and the memory saved by sharing.

    --n N: parallel sampling (the paged engine forks the prompt's blocks; copy-on-write on the first write
    into a shared block); --beam K: beam search (beams fork and free block tables). Compared with the same
    work done by private copies (paged) and by per-copy reservations (contiguous).
    """
    width = n if n is not None else beam
    if width is None or (n is not None and beam is not None):
        raise KvbenchError("give exactly one of --n (parallel sampling) or --beam (beam search)")
    if not math.isfinite(length_penalty):
        raise KvbenchError(f"--length-penalty must be a finite number, got {length_penalty}")
    out_dir = run_directory(out)
    settings = ShareSettings(
        kind="parallel" if n is not None else "beam",
        width=width,
        prompts=prompts,
        prompt_len=prompt_len,
        output_len=output_len,
        block_size=block_size,
        reserve=check_choice(reserve, RESERVATION_POLICIES, "--reserve"),
        max_len=max_len,
        num_blocks=num_blocks,
        length_penalty=length_penalty,
        model=model,
        device=device,
        seed=seed,
        threads=thread_count(threads),
        dataset=dataset,
        stop=check_choice(stop, STOP_MODES, "--stop") if stop else None,
    )
    console = make_console(stderr=as_json)
    with console.status("loading the model...") as status:
        result = run_share_study(settings, status.update)
    write_study(
        "share",
        out_dir,
        result,
        as_json,
        plot=share_plot,
        plot_file="share.png",
        markdown=share_markdown,
        tables=lambda run_dir: print_share(console, result, run_dir),
        flat_rows=False,
    )


def register(app: typer.Typer) -> None:
    app.command("share")(share)
