"""``kvbench capacity``: weights, KV budget and how many requests each strategy can hold at once, per deployment."""

from __future__ import annotations

import typer

from kvbench.commands._options import (
    COMPUTE_DTYPES,
    choice,
    gpu_memory_utilization_option,
    gpu_option,
    int_list,
    json_option,
    make_console,
    parse_size,
)
from kvbench.errors import KvbenchError
from kvbench.fileio import json_text
from kvbench.models.gpus import CUSTOM
from kvbench.report.capacity_report import print_capacity
from kvbench.studies.capacity import KV_CACHE_DTYPES, CapacitySettings, run_capacity_study

DEFAULT_GPU = "a100-80g"


def capacity(
    model: str = typer.Option(
        "llama-2-13b",
        "--model",
        help="Preset, local checkpoint dir / config.json / GGUF file, or a Hugging Face id (owner/name; "
        "HF_HUB_OFFLINE=1: the local cache only).",
    ),
    gpu: str | None = gpu_option(
        None, f"GPU preset (default {DEFAULT_GPU}, or with --gpu-memory alone a GPU of that memory)."
    ),
    gpu_memory: str | None = typer.Option(
        None,
        "--gpu-memory",
        help="Memory of one GPU, e.g. 141GiB: a GPU not listed, or what nvidia-smi shows for --gpu.",
    ),
    utilization: float = gpu_memory_utilization_option(0.9, "Share of GPU memory the engine may use, in [0.01, 1]."),
    kv_cache_memory: str | None = typer.Option(
        None,
        "--kv-cache-memory",
        help="KV cache per GPU set directly (vLLM's --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE), e.g. 1GiB.",
    ),
    dtype: str = typer.Option(
        "auto",
        "--dtype",
        help="The model's dtype (auto: the checkpoint's).",
        **choice(("auto", *COMPUTE_DTYPES), "dtype"),
    ),
    kv_cache_dtype: str = typer.Option(
        "auto",
        "--kv-cache-dtype",
        help="The KV cache's dtype (auto: the model's).",
        **choice(KV_CACHE_DTYPES, "KV cache dtype"),
    ),
    tensor_parallel: int = typer.Option(
        1, "--tensor-parallel-size", "-tp", min=1, help="GPUs each layer is split across."
    ),
    pipeline_parallel: int = typer.Option(
        1, "--pipeline-parallel-size", "-pp", min=1, help="Pipeline stages (runs of layers)."
    ),
    max_len: int = typer.Option(
        2048, "--max-len", "--max-model-len", min=1, help="Context limit (contiguous-max reserves this)."
    ),
    mean_len: int = typer.Option(500, "--mean-len", min=1, help="Final length of a typical request, in tokens."),
    block_sizes: str = typer.Option("16", "--block-size", help="Paged block size(s), e.g. 16 or 8,16,32."),
    max_num_seqs: int | None = typer.Option(
        None, "--max-num-seqs", min=1, help="The scheduler's cap on running requests (default: KV memory alone)."
    ),
    concurrency: int = typer.Option(1, "--concurrency", min=1, help="Requests at once for the longest-context column."),
    as_json: bool = json_option("Print JSON on stdout."),
) -> None:
    """Weights, KV budget and the requests each KV strategy holds, per GPU.

    Weights and KV budget per GPU, and the concurrent requests (at the mean length and at max-len) and longest
    context each strategy holds; exit 1 with the reasons in numbers when the model does not fit."""
    if mean_len > max_len:
        raise KvbenchError(f"--mean-len ({mean_len}) exceeds --max-len ({max_len})")
    settings = CapacitySettings(
        model=model,
        gpu=gpu if gpu is not None else (CUSTOM if gpu_memory is not None else DEFAULT_GPU),  # "" is an unknown GPU
        utilization=utilization,
        dtype=dtype,
        kv_cache_dtype=kv_cache_dtype,
        gpu_memory=parse_size(gpu_memory, "--gpu-memory") if gpu_memory is not None else None,
        kv_cache_memory=parse_size(kv_cache_memory, "--kv-cache-memory") if kv_cache_memory is not None else None,
        tensor_parallel=tensor_parallel,
        pipeline_parallel=pipeline_parallel,
        max_len=max_len,
        mean_len=mean_len,
        block_sizes=tuple(int_list(block_sizes, "--block-size")),
        max_num_seqs=max_num_seqs,
        concurrency=concurrency,
    )
    result = run_capacity_study(settings)
    if result.reasons:
        result.document["suggestions"] = _suggestions(result.reasons[0], settings)
    if as_json:
        typer.echo(json_text(result.document))
    else:
        console = make_console()
        print_capacity(console, result.document)
        for line in result.document.get("suggestions", []):
            console.print(f"  try {line}")
    if not result.fits:
        raise typer.Exit(code=1)


def _suggestions(reason: dict, settings: CapacitySettings) -> list[str]:
    """What to change, in this command's options, from the numbers of the first reason."""
    lines = []
    tensor = reason.get("smallest_fitting_tensor_parallel_size")
    if tensor:
        lines.append(f"--tensor-parallel-size {tensor}")
    if reason["kind"] == "max_len":
        if reason["longest_context"]:
            lines.append(f"--max-model-len {reason['longest_context']}")
        if settings.kv_cache_dtype == "auto":
            lines.append("--kv-cache-dtype fp8 (halves a 16-bit KV cache)")
    lines.append(f"a GPU with at least {reason['gpu_memory_needed_bytes'] / 1024**3:,.1f} GiB (--gpu-memory)")
    return lines


def register(app: typer.Typer) -> None:
    app.command("capacity")(capacity)
