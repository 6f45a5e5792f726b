"""The capacity study on the terminal: the model, what each GPU holds, and the strategies' table."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from kvbench.values import human_bytes


def model_line(document: dict[str, Any]) -> str:
    model = document["model"]
    parts = [f"[bold]{model['name']}[/bold] {model['dtype']}: {model['num_parameters'] / 1e9:.2f} B parameters"]
    if "active_parameters" in model:
        parts[0] += f" ({model['active_parameters'] / 1e9:.2f} B active)"
    weights = f"weights {human_bytes(document['weight_bytes'])}"
    if "weight_format" in model:
        weights += f" ({model['weight_format']['description']})"
    parts.append(weights)
    kv = f"KV {document['bytes_per_token']:,} B per token ({document['kv_dtype_bytes']} B values"
    if "mla" in model:
        kv += f", latent attention: {model['mla']['kv_lora_rank'] + model['mla']['qk_rope_head_dim']} per layer"
    kv += ")"
    if model.get("sliding_window"):
        kv += (
            f"; {len(model['sliding_layers'])} of {model['num_layers']} layers keep a window of "
            f"{model['sliding_window']:,} tokens"
        )
    parts.append(kv)
    return "; ".join(parts)


def deployment_line(document: dict[str, Any]) -> str:
    gpus = document["gpus"]
    shape = f"{gpus} x " if gpus > 1 else ""
    split = []
    if document["tensor_parallel_size"] > 1:
        split.append(f"tensor parallel {document['tensor_parallel_size']}")
    if document["pipeline_parallel_size"] > 1:
        split.append(f"pipeline parallel {document['pipeline_parallel_size']}")
    head = f"[bold]{shape}{document['gpu']}[/bold]" + (f" ({', '.join(split)})" if split else "")
    if document.get("kv_cache_memory_bytes"):
        budget = f"KV cache set to {human_bytes(document['kv_cache_memory_bytes'])} per GPU"
    else:
        budget = (
            f"{human_bytes(document['gpu_memory_bytes'])} x {document['gpu_memory_utilization']} = "
            f"{human_bytes(document['usable_bytes'])} usable - weights "
            f"{human_bytes(document['weight_bytes_per_gpu'])} - activations "
            f"{human_bytes(document['activation_reserve_bytes'])} = KV budget "
            f"{human_bytes(document['kv_budget_bytes'])} per GPU"
        )
    return f"{head}: {budget}"


def kv_heads_line(document: dict[str, Any]) -> str | None:
    """A note when tensor parallelism replicates KV heads or latent attention copies the cache."""
    copies = document["kv_head_replication"]
    if copies <= 1:
        return None
    if "mla" in document["model"]:
        return (
            f"latent attention: each of the {document['tensor_parallel_size']} GPUs of a stage keeps the whole "
            "latent cache (it is shared by all heads, so tensor parallelism does not split it)"
        )
    return (
        f"tensor parallelism {document['tensor_parallel_size']} exceeds the {document['model']['num_kv_heads']} "
        f"KV heads: each GPU keeps {document['kv_heads_per_gpu']} head, so every KV head is stored {copies} times"
    )


def print_capacity(console, document: dict[str, Any]) -> None:
    console.print(model_line(document))
    console.print(deployment_line(document))
    note = kv_heads_line(document)
    if note:
        console.print(f"[yellow]{note}[/yellow]")
    if len(document["stages"]) > 1:
        console.print(
            "pipeline stages: "
            + "; ".join(
                f"layers {s['layers'][0]}-{s['layers'][1] - 1}: weights {human_bytes(s['weight_bytes'])}, "
                f"KV budget {human_bytes(max(s['kv_budget_bytes'], 0))}"
                for s in document["stages"]
            )
        )
    if document["strategies"]:
        growing = (
            " if every layer grew (the windowed ones stop at their window)"
            if document["model"].get("sliding_window")
            else ""
        )
        console.print(
            f"KV budget holds {document['kv_token_slots']:,} token slots per GPU{growing} "
            f"({document['kv_bytes_per_token_per_gpu']:,} B per token on a GPU)"
        )
        console.print(strategy_table(document))
    for reason in document["reasons"]:
        console.print(f"[bold red]does not fit:[/bold red] {reason['message']}")


def strategy_table(document: dict[str, Any]) -> Table:
    concurrency = document["concurrency"]
    cap = document.get("max_num_seqs")
    title = (
        f"Concurrent requests of {document['mean_len']:,} tokens and of max-len {document['max_len']:,}; "
        f"longest context at concurrency {concurrency}" + (f" (capped at max-num-seqs {cap})" if cap else "")
    )
    table = Table(
        title=title,
        caption=f"concurrent at {document['max_len']:,}: whole requests of max-len; in brackets vLLM's \"maximum "
        'concurrency" figure for the same pool (KV token slots / max-len, unrounded, as vLLM logs it at start-up); '
        "longest context: the longest request each of that many concurrent requests can have",
    )
    columns = (
        "strategy",
        "slots / request",
        "max concurrent",
        "token states at capacity",
        f"concurrent at {document['max_len']:,} (vLLM)",
        f"longest context x{concurrency}",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for row in document["strategies"]:
        ratio = f" ({row['concurrency_ratio_at_max_len']:.2f}x)"  # vLLM's "maximum concurrency" figure, unrounded
        longest = f"{row['longest_context']:,}" + (" (model)" if row["longest_context_limited_by"] == "model" else "")
        table.add_row(
            row["strategy"],
            f"{row['slots_per_request']:,}",
            f"{row['max_concurrency']:,}",
            f"{row['token_state_pct_at_capacity']:.1f}%",
            f"{row['max_concurrency_at_max_len']:,}{ratio}",
            longest,
        )
    return table
