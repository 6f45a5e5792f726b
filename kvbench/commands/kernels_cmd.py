"""``kvbench kernels``: time paged decode attention against contiguous SDPA of the same shapes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer
from rich.console import Console
from rich.table import Table

from kvbench import units
from kvbench.commands._flags import BLOCK_SIZE, DEVICE, DTYPE, JSON, MODEL, OUT, REPEAT, SEED
from kvbench.commands._options import choice, int_list, output_file
from kvbench.errors import KvbenchError, RunFailed
from kvbench.fileio import json_text, write_text_atomic
from kvbench.results.decode_benchmark import DecodeBenchmark, DecodePoint

if TYPE_CHECKING:
    import torch

CPU_BATCHES, CPU_CONTEXTS = "1,8", "512,1024"
GPU_BATCHES, GPU_CONTEXTS = "1,8,64", "512,2048,4096"


def _device(name: str) -> torch.device:
    import torch  # loaded only when the command runs: keeps `kvbench --help` fast

    name = name.lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise KvbenchError(f"--device {name}: no CUDA device is available")
    if name.startswith("cuda:") and int(name[5:]) >= torch.cuda.device_count():
        raise KvbenchError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return torch.device(name)


def _dtype(name: str, device: torch.device) -> tuple[str, torch.dtype]:
    from kvbench.studies.kernel_bench import DTYPES  # torch loads only when run

    name = name.lower()
    if name == "auto":
        name = "fp16" if device.type == "cuda" else "fp32"
    if name not in DTYPES:
        raise KvbenchError(f"--dtype: unknown dtype {name!r}; choose auto, fp32, fp16 or bf16")
    return name, DTYPES[name]


def _backend(name: str, device: torch.device) -> str:
    from kvbench.kernels import cpu_native, resolve_backend  # torch loads only when run

    if name == "auto":
        return resolve_backend(device, None)
    if name not in ("torch", "triton", "native"):
        raise KvbenchError(f"--backend: unknown backend {name!r}; choose auto, torch, triton or native")
    if name == "triton" and device.type != "cuda":
        raise KvbenchError("--backend triton needs --device cuda (on CPU Triton only runs interpreted, in tests)")
    if name == "native" and (device.type != "cpu" or not cpu_native.available()):
        why = "it runs on the CPU" if device.type != "cpu" else cpu_native.unavailable_reason()
        raise KvbenchError(f"--backend native is not available: {why}")
    return name


def _native_build() -> str:
    from kvbench.kernels import cpu_native

    return cpu_native.build_description()


def _heads(model: str, heads: int | None, kv_heads: int | None, head_dim: int | None) -> tuple[int, int, int]:
    from kvbench.studies.kernel_bench import HEAD_SHAPES  # torch loads only when run

    if model not in HEAD_SHAPES:
        raise KvbenchError(f"--model: unknown model {model!r}; choose {', '.join(HEAD_SHAPES)} or give --heads")
    preset = HEAD_SHAPES[model]
    num_heads = heads if heads is not None else preset[0]
    num_kv_heads = kv_heads if kv_heads is not None else (num_heads if heads is not None else preset[1])
    dim = head_dim if head_dim is not None else preset[2]
    if min(num_heads, num_kv_heads, dim) < 1:
        raise KvbenchError("--heads, --kv-heads and --head-dim must be at least 1")
    if num_heads % num_kv_heads:
        raise KvbenchError(f"--heads {num_heads} is not a multiple of --kv-heads {num_kv_heads}")
    return num_heads, num_kv_heads, dim


def _splits(text: str) -> int | None:
    if text == "auto":
        return None
    if not text.isdigit() or int(text) < 1:
        raise KvbenchError(f"--splits: expected auto or a positive integer, got {text!r}")
    return int(text)


def _render(result: DecodeBenchmark, console: Console) -> None:
    copy = result.copy_bandwidth_gbps
    on_cpu = result.on_cpu
    share = "% read" if on_cpu else "% copy"
    title = (
        f"decode attention: {result.model} ({result.num_heads} q / {result.num_kv_heads} kv heads, "
        f"d={result.head_dim}), {result.dtype}, block {result.block_size}, "
        f"{result.backend} on {result.device_name}"
    )
    table = Table(title=title)
    for name in ("batch", "ctx", "paged ms", "SDPA ms", "ratio", "paged GB/s", "SDPA GB/s", share, "splits"):
        table.add_column(name, justify="right")
    for point in result.points:
        if not point.ok:
            table.add_row(str(point.batch), str(point.context), point.status, *[""] * 6)
            continue
        figures = (
            (point.paged_ms, 3), (point.contiguous_ms, 3), (point.paged_over_contiguous, 2),
            (point.paged_gbps, 1), (point.contiguous_gbps, 1),
            (point.pct_of_read_bandwidth if on_cpu else point.pct_of_copy_bandwidth, 1),
        )  # fmt: skip
        table.add_row(
            str(point.batch), str(point.context), *(units.num(v, digits, missing="-") for v, digits in figures),
            "-" if point.num_splits is None else str(point.num_splits),
        )  # fmt: skip
    console.print(table)
    if result.native_build:
        console.print(result.native_build)
    console.print("ratio = paged time / contiguous SDPA time")
    if on_cpu:
        console.print(
            "% read = paged GB/s / GB/s of torch reading the same bytes, timed the same way (on a CPU the "
            "K/V of a point stay partly in cache between calls: a large copy is no reference)"
        )
    else:
        console.print(f"% copy = paged GB/s / measured copy bandwidth ({copy:.1f} GB/s, read + write)")


def kernels(
    device_name: str = DEVICE("auto"),
    dtype_name: str = DTYPE("auto", "The dtype of the inputs (auto: fp16 on CUDA, fp32 on a CPU)."),
    model: str = MODEL("llama-2-13b", "Head shapes of a preset: llama-2-13b, llama-2-7b, llama-3-8b, tiny."),
    heads: int | None = typer.Option(None, "--heads", help="Query heads (overrides --model)."),
    kv_heads: int | None = typer.Option(None, "--kv-heads", help="KV heads (default: --heads, or the model's)."),
    head_dim: int | None = typer.Option(None, "--head-dim", help="Head dimension (overrides --model)."),
    batches: str | None = typer.Option(
        None, "--batch", help=f"Batch sizes (default cuda {GPU_BATCHES}, cpu {CPU_BATCHES})."
    ),
    contexts: str | None = typer.Option(
        None, "--context", help=f"Context lengths (default cuda {GPU_CONTEXTS}, cpu {CPU_CONTEXTS})."
    ),
    block_size: int = BLOCK_SIZE(16),
    backend_name: str = typer.Option(
        "auto",
        "--backend",
        help="auto: triton on cuda; on a CPU native, the C kernel, where it builds, else torch.",
        **choice(("auto", "torch", "triton", "native"), "backend"),
    ),
    splits: str = typer.Option("auto", "--splits", help="Split-KV partitions for Triton: auto or a number (1 = off)."),
    warmup: int = typer.Option(3, "--warmup", min=0, help="Untimed calls before timing."),
    reps: int = REPEAT(10, "Timed calls; the median is reported."),
    seed: int = SEED(0, "Seed of the random inputs."),
    as_json: bool = JSON(False, "Print the result as JSON on stdout instead of a table."),
    out: str | None = OUT(None, "Also write the JSON result to this file."),
) -> None:
    """Time paged decode attention: GB/s achieved and ratio to contiguous SDPA.

    Bytes counted: K and V read once, plus the query and the output.

    CPU: times the C kernel where it builds, else the torch reference (small default shapes, fp32), next to torch
    reading the same bytes (% read).

    CUDA: times the Triton kernel after an L2 flush with CUDA events, next to the measured copy bandwidth.
    """
    device = _device(device_name)
    dtype_label, dtype = _dtype(dtype_name, device)
    backend = _backend(backend_name, device)
    num_heads, num_kv_heads, dim = _heads(model, heads, kv_heads, head_dim)
    on_gpu = device.type == "cuda"
    batch_list = int_list(batches if batches is not None else (GPU_BATCHES if on_gpu else CPU_BATCHES), "--batch")
    context_list = int_list(
        contexts if contexts is not None else (GPU_CONTEXTS if on_gpu else CPU_CONTEXTS), "--context"
    )
    num_splits = _splits(splits)
    out_path = output_file(out, "--out")  # empty or unwritable: refused before the benchmark, not after it
    measured = _measure(
        device,
        dtype,
        backend,
        [(batch, context) for batch in batch_list for context in context_list],
        (num_heads, num_kv_heads, dim, block_size),
        num_splits,
        warmup,
        reps,
        seed,
    )
    result = DecodeBenchmark(
        device=device.type,
        device_name=measured.device_name,
        backend=backend,
        dtype=dtype_label,
        model=model if heads is None and head_dim is None else "custom",
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=dim,
        block_size=block_size,
        copy_bandwidth_gbps=measured.copy_bandwidth_gbps,
        native_build=_native_build() if backend == "native" else None,
        torch_version=measured.torch_version,
        points=measured.points,
    )
    if out_path is not None:
        write_text_atomic(out_path, json_text(result.to_json()) + "\n")
    if as_json:
        typer.echo(json_text(result.to_json()))
    else:
        _render(result, Console())
    if not any(point.ok for point in result.points):
        raise RunFailed("every point was skipped: nothing was measured (see each point's status)")


@dataclass(frozen=True)
class Measured:
    """What the benchmark measured on the device, before the run's settings join it."""

    device_name: str  # the GPU's name, or cpu
    copy_bandwidth_gbps: float | None  # CUDA only
    torch_version: str
    points: list[DecodePoint]


def _measure(
    device: torch.device,
    dtype: torch.dtype,
    backend: str,
    sizes: list[tuple[int, int]],
    heads: tuple[int, int, int, int],
    num_splits: int | None,
    warmup: int,
    reps: int,
    seed: int,
) -> Measured:
    """The decode points at each (batch, context), next to the device's copy bandwidth."""
    import torch  # loaded only when the command runs: keeps `kvbench --help` fast

    from kvbench.studies.kernel_bench import (  # torch loads only when run
        DecodeShape,
        copy_bandwidth_gbps,
        run_decode_point,
    )

    copy_gbps = copy_bandwidth_gbps(device) if device.type == "cuda" else None  # a CPU point has its own reference
    points = [
        run_decode_point(
            DecodeShape(batch, context, *heads),
            dtype,
            device,
            backend,
            warmup=warmup,
            reps=reps,
            copy_gbps=copy_gbps,
            num_splits=num_splits,
            seed=seed,
        )
        for batch, context in sizes
    ]
    return Measured(
        torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        copy_gbps,
        torch.__version__,
        points,
    )


def register(app: typer.Typer) -> None:
    app.command("kernels")(kernels)
