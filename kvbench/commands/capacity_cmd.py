"""``kvbench capacity``: weights, KV budget and how many requests each strategy can hold at once, per deployment."""

from __future__ import annotations

from dataclasses import replace

import typer

from kvbench.commands._deployment_options import DEPLOYMENT, Deployment, deployment_fields
from kvbench.commands._flags import BLOCK_SIZE, CONCURRENCY, JSON, MAX_LEN, MAX_NUM_SEQS, MEAN_LEN
from kvbench.commands._options import (
    int_list,
    make_console,
)
from kvbench.errors import KvbenchError
from kvbench.fileio import json_text
from kvbench.models.gpus import CUSTOM
from kvbench.report.capacity_report import print_capacity
from kvbench.results.capacity_result import NotFitting
from kvbench.studies.capacity import CapacitySettings, run_capacity_study

DEFAULT_GPU = "a100-80g"


@DEPLOYMENT.add(
    settings=CapacitySettings,
    defaults={"gpu": None},
    helps={"gpu": f"GPU preset (default {DEFAULT_GPU}, or with --gpu-memory alone a GPU of that memory)."},
)
def capacity(
    max_len: int = MAX_LEN(2048),
    mean_len: int = MEAN_LEN(500),
    block_sizes: str = BLOCK_SIZE("16", "Tokens per KV block; a list compares several, e.g. 8,16,32."),
    max_num_seqs: int | None = MAX_NUM_SEQS(
        None, "The scheduler's cap on running requests (default: KV memory alone)."
    ),
    concurrency: int = CONCURRENCY(1, "Requests at once for the longest-context column."),
    as_json: bool = JSON(False, "Print JSON on stdout."),
    *,
    deployment: Deployment,
) -> None:
    """Weights, KV budget and the requests each KV strategy holds, per GPU.

    Weights and KV budget per GPU, and the concurrent requests (at the mean length and at max-len) and longest
    context each strategy holds; exit 1 with the reasons in numbers when the model does not fit."""
    if mean_len > max_len:
        raise KvbenchError(f"--mean-len ({mean_len}) exceeds --max-len ({max_len})")
    fields = deployment_fields(deployment, CapacitySettings)
    if deployment.gpu is None:  # a GPU of --gpu-memory alone, else the default preset ("" is an unknown GPU)
        fields["gpu"] = CUSTOM if deployment.gpu_memory is not None else DEFAULT_GPU
    settings = CapacitySettings(
        **fields,
        max_len=max_len,
        mean_len=mean_len,
        block_sizes=tuple(int_list(block_sizes, "--block-size")),
        max_num_seqs=max_num_seqs,
        concurrency=concurrency,
    )
    result = run_capacity_study(settings)
    if result.reasons:
        result = replace(result, suggestions=_suggestions(result.reasons[0], settings))
    if as_json:
        typer.echo(json_text(result.to_json()))
    else:
        console = make_console()
        print_capacity(console, result)
        for line in result.suggestions or ():
            console.print(f"  try {line}")
    if not result.fits:
        raise typer.Exit(code=1)


def _suggestions(reason: NotFitting, settings: CapacitySettings) -> list[str]:
    """What to change, in this command's options, from the numbers of the first reason."""
    lines = []
    tensor = reason.smallest_fitting_tensor_parallel_size
    if tensor:
        lines.append(f"--tensor-parallel-size {tensor}")
    if reason.kind == "max_len":
        if reason.longest_context:
            lines.append(f"--max-model-len {reason.longest_context}")
        if settings.kv_cache_dtype == "auto":
            lines.append("--kv-cache-dtype fp8 (halves a 16-bit KV cache)")
    needed = reason.gpu_memory_needed_bytes or 0  # the first reason always says it
    lines.append(f"a GPU with at least {needed / 1024**3:,.1f} GiB (--gpu-memory)")
    return lines


def register(app: typer.Typer) -> None:
    app.command("capacity")(capacity)
