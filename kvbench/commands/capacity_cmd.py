"""``kvbench capacity``: weights, KV budget and how many requests each strategy can hold at once."""

from __future__ import annotations

import typer
from rich.table import Table

from kvbench.commands._options import int_list, make_console, positive_fraction
from kvbench.errors import KvbenchError
from kvbench.fileio import json_text
from kvbench.kv.block_pool import blocks_for
from kvbench.kv.contiguous import next_pow2
from kvbench.models.gpus import kv_budget, resolve_gpu
from kvbench.models.resolve import resolve_model
from kvbench.preflight import check_context_length
from kvbench.values import human_bytes


def capacity_table(pool_slots: int, max_len: int, mean_len: int, block_sizes: list[int]) -> list[dict]:
    """Concurrent requests of ``mean_len`` tokens each strategy fits in ``pool_slots`` token slots."""
    kv_len = mean_len  # slots a request of this length holds at its end
    rows = [
        ("contiguous-max", max_len),
        ("contiguous-pow2", min(next_pow2(kv_len), max_len)),
        ("contiguous-oracle", kv_len),
    ]
    rows += [(f"paged-{bs}", blocks_for(kv_len, bs) * bs) for bs in block_sizes]
    return [
        {"strategy": name, "slots_per_request": slots, "max_concurrency": pool_slots // slots,
         "token_state_pct_at_capacity": 100.0 * (pool_slots // slots) * kv_len / pool_slots if pool_slots else 0.0}
        for name, slots in rows
    ]


def capacity(
    model: str = typer.Option("llama-2-13b", "--model", help="Preset name or a local config.json / checkpoint dir."),
    gpu: str = typer.Option("a100-80g", "--gpu", help="GPU preset."),
    utilization: float = typer.Option(0.9, "--gpu-memory-utilization", callback=positive_fraction, help="Share of GPU memory kvbench may use, in (0, 1]."),
    dtype: str = typer.Option("fp16", "--dtype", help="fp32 | fp16 | bf16."),
    max_len: int = typer.Option(2048, "--max-len", min=1, help="Context limit (contiguous-max reserves this)."),
    mean_len: int = typer.Option(500, "--mean-len", min=1, help="Final length of a typical request, in tokens."),
    block_sizes: str = typer.Option("16", "--block-size", help="Paged block size(s), e.g. 16 or 8,16,32."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON on stdout."),
) -> None:
    """Weights, KV budget and the maximum number of concurrent requests per strategy (at their final length)."""
    if mean_len > max_len:
        raise KvbenchError(f"--mean-len ({mean_len}) exceeds --max-len ({max_len})")
    sizes = int_list(block_sizes, "--block-size")
    shape = resolve_model(model, dtype)
    check_context_length(shape, max_len)
    device = resolve_gpu(gpu)
    budget = kv_budget(shape, device, utilization)
    result = {
        "model": shape.to_dict(),
        "gpu": device.name,
        "gpu_memory_bytes": device.memory_bytes,
        "gpu_memory_utilization": utilization,
        "usable_bytes": budget.usable_bytes,
        "weight_bytes": shape.weight_bytes,
        "activation_reserve_bytes": budget.activation_bytes,
        "kv_budget_bytes": max(budget.kv_bytes, 0),
        "fits": budget.fits,
        "bytes_per_token": shape.bytes_per_token,
        "max_len": max_len,
        "mean_len": mean_len,
        "strategies": [],
    }
    if budget.fits:
        pool_slots = budget.kv_bytes // shape.bytes_per_token
        result["kv_token_slots"] = pool_slots
        result["strategies"] = capacity_table(pool_slots, max_len, mean_len, sizes)
        result["fits_one_max_len_request"] = pool_slots >= max_len
    else:
        result["verdict"] = (
            f"{shape.name} in {dtype} does not fit on {device.name}: weights {human_bytes(shape.weight_bytes)} "
            f"+ activations {human_bytes(budget.activation_bytes)} exceed the usable "
            f"{human_bytes(budget.usable_bytes)} ({utilization:.0%} of {human_bytes(device.memory_bytes)})"
        )
    if as_json:
        typer.echo(json_text(result))
    else:
        _print(result)
    if not budget.fits:
        raise typer.Exit(code=1)


def _print(result: dict) -> None:
    console = make_console()
    model = result["model"]
    console.print(
        f"[bold]{model['name']}[/bold] {model['dtype']}: {model['num_parameters'] / 1e9:.2f} B parameters, weights "
        f"{human_bytes(result['weight_bytes'])}; {result['bytes_per_token']:,} B of KV per token "
        f"({human_bytes(result['bytes_per_token'])})"
    )
    console.print(
        f"[bold]{result['gpu']}[/bold]: {human_bytes(result['gpu_memory_bytes'])} x {result['gpu_memory_utilization']} "
        f"= {human_bytes(result['usable_bytes'])} usable - weights - activations "
        f"{human_bytes(result['activation_reserve_bytes'])} = KV budget {human_bytes(result['kv_budget_bytes'])}"
    )
    if not result["fits"]:
        console.print(f"[bold red]does not fit:[/bold red] {result['verdict']}")
        return
    console.print(f"KV budget holds {result['kv_token_slots']:,} token slots")
    table = Table(title=f"Concurrent requests of {result['mean_len']} tokens (max-len {result['max_len']})")
    for column in ("strategy", "slots / request", "max concurrent", "token states at capacity"):
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for row in result["strategies"]:
        table.add_row(row["strategy"], f"{row['slots_per_request']:,}", f"{row['max_concurrency']:,}",
                      f"{row['token_state_pct_at_capacity']:.1f}%")
    console.print(table)
    if not result["fits_one_max_len_request"]:
        console.print("[yellow]the KV budget cannot hold even one max-len request[/yellow]")


def register(app: typer.Typer) -> None:
    app.command("capacity")(capacity)
