"""The capacity study on the terminal: the model, what each GPU holds, and the strategies' table."""

from __future__ import annotations

from rich.table import Table

from kvbench.results.capacity_result import CapacityResult
from kvbench.units import human_bytes


def model_line(result: CapacityResult) -> str:
    model = result.model.facts
    parts = [f"[bold]{model.name}[/bold] {model.dtype}"]
    if model.num_parameters is not None:
        parts[0] += f": {model.num_parameters / 1e9:.2f} B parameters"
    if model.active_parameters is not None:
        parts[0] += f" ({model.active_parameters / 1e9:.2f} B active)"
    weights = f"weights {human_bytes(result.weight_bytes)}"
    if model.weight_format is not None:
        weights += f" ({model.weight_format})"
    parts.append(weights)
    kv = f"KV {result.bytes_per_token:,} B per token ({result.kv_dtype_bytes} B values"
    if model.latent_values is not None:
        kv += f", latent attention: {model.latent_values} per layer"
    kv += ")"
    if model.sliding_window:
        kv += f"; {model.sliding_layers} of {model.num_layers} layers keep a window of {model.sliding_window:,} tokens"
    parts.append(kv)
    return "; ".join(parts)


def deployment_line(result: CapacityResult) -> str:
    gpus = result.gpus
    shape = f"{gpus} x " if gpus > 1 else ""
    split = []
    if result.tensor_parallel_size > 1:
        split.append(f"tensor parallel {result.tensor_parallel_size}")
    if result.pipeline_parallel_size > 1:
        split.append(f"pipeline parallel {result.pipeline_parallel_size}")
    head = f"[bold]{shape}{result.gpu}[/bold]" + (f" ({', '.join(split)})" if split else "")
    if result.kv_cache_memory_bytes:
        budget = f"KV cache set to {human_bytes(result.kv_cache_memory_bytes)} per GPU"
    else:
        budget = (
            f"{human_bytes(result.gpu_memory_bytes)} x {result.gpu_memory_utilization} = "
            f"{human_bytes(result.usable_bytes)} usable - weights "
            f"{human_bytes(result.weight_bytes_per_gpu)} - activations "
            f"{human_bytes(result.activation_reserve_bytes)} = KV budget "
            f"{human_bytes(result.kv_budget_bytes)} per GPU"
        )
    return f"{head}: {budget}"


def kv_heads_line(result: CapacityResult) -> str | None:
    """A note when tensor parallelism replicates KV heads or latent attention copies the cache."""
    copies = result.kv_head_replication
    if copies <= 1:
        return None
    if result.model.facts.latent_values is not None:
        return (
            f"latent attention: each of the {result.tensor_parallel_size} GPUs of a stage keeps the whole "
            "latent cache (it is shared by all heads, so tensor parallelism does not split it)"
        )
    return (
        f"tensor parallelism {result.tensor_parallel_size} exceeds the {result.model.facts.num_kv_heads} "
        f"KV heads: each GPU keeps {result.kv_heads_per_gpu} head, so every KV head is stored {copies} times"
    )


def print_capacity(console, result: CapacityResult) -> None:
    console.print(model_line(result))
    console.print(deployment_line(result))
    note = kv_heads_line(result)
    if note:
        console.print(f"[yellow]{note}[/yellow]")
    if len(result.stages) > 1:
        console.print(
            "pipeline stages: "
            + "; ".join(
                f"layers {s.layers[0]}-{s.layers[1] - 1}: weights {human_bytes(s.weight_bytes)}, "
                f"KV budget {human_bytes(max(s.kv_budget_bytes, 0))}"
                for s in result.stages
            )
        )
    if result.strategies:
        growing = (
            " if every layer grew (the windowed ones stop at their window)" if result.model.facts.sliding_window else ""
        )
        slots = result.kv_token_slots
        console.print(
            f"KV budget holds {slots:,} token slots per GPU{growing} "
            f"({result.kv_bytes_per_token_per_gpu:,} B per token on a GPU)"
        )
        console.print(strategy_table(result))
    for reason in result.reasons:
        console.print(f"[bold red]does not fit:[/bold red] {reason.message}")


def strategy_table(result: CapacityResult) -> Table:
    concurrency, max_len = result.concurrency, result.max_len
    cap = result.max_num_seqs
    title = (
        f"Concurrent requests of {result.mean_len:,} tokens and of max-len {max_len:,}; "
        f"longest context at concurrency {concurrency}" + (f" (capped at max-num-seqs {cap})" if cap else "")
    )
    table = Table(
        title=title,
        caption=f"concurrent at {max_len:,}: whole requests of max-len; in brackets vLLM's \"maximum "
        'concurrency" figure for the same pool (KV token slots / max-len, unrounded, as vLLM logs it at start-up); '
        "longest context: the longest request each of that many concurrent requests can have",
    )
    columns = (
        "strategy",
        "slots / request",
        "max concurrent",
        "token states at capacity",
        f"concurrent at {max_len:,} (vLLM)",
        f"longest context x{concurrency}",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for row in result.strategies:
        ratio = f" ({row.concurrency_ratio_at_max_len:.2f}x)"  # vLLM's "maximum concurrency" figure, unrounded
        longest = f"{row.longest_context:,}" + (" (model)" if row.longest_context_limited_by == "model" else "")
        table.add_row(
            row.strategy,
            f"{row.slots_per_request:,}",
            f"{row.max_concurrency:,}",
            f"{row.token_state_pct_at_capacity:.1f}%",
            f"{row.max_concurrency_at_max_len:,}{ratio}",
            longest,
        )
    return table
