"""What to change, said in the words of the engine being diagnosed.

A rule names its remedies by key (``more_kv_memory``, ``smaller_blocks`` ...); :func:`render` phrases them for
one engine family, with the settings the engine reported (``now 128``). kvbench's own runs are told which flags
of the command that made them to change (``command`` in the context: a waste run has no ``--engines``); a
kvbench server, like a vLLM or SGLang one, is told which of its launch options to change. A remedy a family
has no phrasing for is left out, never replaced by another engine's or another command's flag.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

Context = Mapping[str, Any]
Phrase = Callable[[Context], str | None]  # None: no such knob where the context says


def _now(context: Context, key: str, unit: str = "") -> str:
    value = context.get(key)
    return f" (now {value}{unit})" if value not in (None, "", "None", "?") else ""


SERVER = "serve"  # the command whose flags a live kvbench server's remedies name: how it was started


def _command(context: Context) -> str:
    """The kvbench command whose flags a suggestion names: the one that made the run, else the server's."""
    return str(context.get("command") or SERVER)


def _kvbench_more_memory(context: Context) -> str | None:
    command = _command(context)
    if command in ("sweep", "fleet"):
        return "give the KV cache more memory (a larger --kv-memory or --gpu-memory-utilization)"
    if command == "waste":
        return "give the KV cache more memory (a larger --gpu-memory-utilization, or a larger --gpu-memory)"
    if command == SERVER:
        return "give the KV cache more memory (start kvbench serve with a larger --kv-memory)"
    return None


def _kvbench_layout(context: Context) -> str | None:
    reserve, max_len, command = context.get("reserve") or "max", _now(context, "max_len"), _command(context)
    if command == "sweep":
        return (
            f"use the paged engine (--engines paged) instead of contiguous slabs; or reserve less than "
            f"--reserve {reserve} (pow2 or oracle); or a scenario with a lower max_len{max_len}"
        )
    if command == "waste":
        return f"compare the paged strategies in the same table; or a lower --max-len{max_len}"
    if command == "fleet":
        return (
            f"use the paged engine (--engine paged) instead of contiguous slabs; or reserve less than "
            f"--reserve {reserve} (pow2 or oracle)"
        )
    if command == "share":
        return f"reserve less than --reserve {reserve} (pow2 or oracle); or a lower --max-len{max_len}"
    return (
        f"start kvbench serve with the paged engine (--engine paged), or reserving less than --reserve {reserve} "
        f"(pow2 or oracle), or a lower --max-len{max_len}"
    )


def _kvbench_smaller_blocks(context: Context) -> str:
    size = context.get("block_size")
    now = f"now {size}; " if size not in (None, "", "?") else ""
    where = "start kvbench serve with " if _command(context) == SERVER else "use "
    return f"{where}a smaller --block-size ({now}16-32 work best)"


def _kvbench_larger_blocks(context: Context) -> str:
    where = "start kvbench serve with " if _command(context) == SERVER else "use "
    return f"{where}a larger --block-size (fewer allocations)"


# remedy key -> engine family -> phrasing
REMEDIES: dict[str, dict[str, Phrase]] = {
    "more_kv_memory": {
        "kvbench": _kvbench_more_memory,
        "vllm": lambda c: (
            "give the KV cache more memory: raise --gpu-memory-utilization"
            f"{_now(c, 'gpu_memory_utilization')} or set --kv-cache-memory-bytes"
            f"{_now(c, 'kv_cache_memory_bytes', ' B')}, or free memory with a lower --max-model-len"
        ),
        "sglang": lambda c: (
            "give the KV cache more memory: raise --mem-fraction-static, or free memory with a lower --context-length"
        ),
    },
    "lower_concurrency": {
        "kvbench": lambda c: "lower the concurrency so running requests can grow without evicting each other",
        "vllm": lambda c: "lower --max-num-seqs so running requests can grow without evicting each other",
        "sglang": lambda c: "lower --max-running-requests so running requests can grow without being retracted",
    },
    "raise_batch_cap": {
        "vllm": lambda c: (
            "raise --max-num-seqs (and --max-num-batched-tokens if long prompts queue): the KV "
            "cache has room, the scheduler's cap keeps requests waiting"
        ),
        "sglang": lambda c: (
            "raise --max-running-requests (and --chunked-prefill-size if long prompts queue): "
            "the KV cache has room, the scheduler's cap keeps requests waiting"
        ),
    },
    "route_to_free": {
        "kvbench": lambda c: (
            "route new requests to the instance with the most free KV blocks"
            if _command(c) in ("fleet", SERVER)
            else None  # one engine: there is no other instance
        ),
        **{
            family: (lambda c: "route new requests to the instance with the most free KV blocks")
            for family in ("vllm", "sglang")
        },
    },
    "add_instance": {
        "kvbench": lambda c: "add capacity (kvbench fleet --autoscale adds an instance above --scale-up usage)",
        **{family: (lambda c: "add an instance behind the router") for family in ("vllm", "sglang")},
    },
    "route_by_free_blocks": {
        "kvbench": lambda c: (
            "route by free KV blocks (kvbench fleet --policies most-free-blocks) so no instance "
            "fills while another idles"
        ),
        **{
            family: (
                lambda c: (
                    "route new requests to the instance with the most free KV blocks, so no instance "
                    "fills while another idles"
                )
            )
            for family in ("vllm", "sglang")
        },
    },
    "layout": {
        "kvbench": _kvbench_layout,
    },
    "smaller_blocks": {
        "kvbench": _kvbench_smaller_blocks,
        "vllm": lambda c: f"use a smaller --block-size{_now(c, 'block_size')}",
        "sglang": lambda c: f"use a smaller --page-size{_now(c, 'block_size')}",
    },
    "larger_blocks": {
        "kvbench": _kvbench_larger_blocks,
    },
    "check_host": {
        "kvbench": lambda c: (
            "keep the pool off a contended host (CPU oversubscription stalls the allocator); "
            "check the host for CPU contention"
        ),
    },
    "prefix_at_least_one_block": {
        "kvbench": lambda c: (
            "make the shared part of prompts at least one block long, or start kvbench serve with a smaller "
            f"--block-size{_now(c, 'block_size')}"
        ),
        "vllm": lambda c: (
            "make the shared part of prompts at least one block long, or start vLLM with a smaller --block-size"
            f"{_now(c, 'block_size')}"
        ),
        "sglang": lambda c: (
            f"make the shared part of prompts at least one page long, or lower --page-size{_now(c, 'block_size')}"
        ),
    },
    "enable_prefix_caching": {
        "kvbench": lambda c: "start kvbench serve with --prefix-caching (its default) if prompts share a prefix",
        "vllm": lambda c: (
            "start vLLM with --enable-prefix-caching if prompts share a prefix (system prompt, "
            "few-shot examples, multi-turn chat)"
        ),
        "sglang": lambda c: "drop --disable-radix-cache if prompts share a prefix",
    },
    "shareable_prefixes": {
        family: (
            lambda c: (
                "put the shared part of prompts first and keep it byte-identical (system prompt, "
                "few-shot examples); send requests with the same prefix to the same instance"
            )
        )
        for family in ("vllm", "sglang")
    },
    "scale_compute": {
        "vllm": lambda c: (
            "the batch is compute- or bandwidth-bound: a faster device, tensor parallelism "
            "(--tensor-parallel-size) or another replica behind the router"
        ),
        "sglang": lambda c: "the batch is compute- or bandwidth-bound: a faster device, --tp-size or another replica",
        "kvbench": lambda c: "the batch is compute-bound: a faster device, or another instance (kvbench fleet)",
    },
    "prefill_queue": {
        "vllm": lambda c: (
            "raise --max-num-batched-tokens (or enable chunked prefill) so waiting prompts are prefilled sooner"
        ),
        "sglang": lambda c: (
            "raise --chunked-prefill-size / --max-prefill-tokens so waiting prompts are prefilled sooner"
        ),
        "kvbench": lambda c: "prompts queue for prefill: shorter prompts, or more prefill tokens per step",
    },
    "check_failed_requests": {
        family: (
            lambda c: (
                "read the point's failed_by_kind and failure_examples in results.jsonl: timeouts, 429s "
                "and 503s under load are the server refusing work (lower the load or add capacity); "
                "400s are requests it cannot serve"
            )
        )
        for family in ("kvbench", "vllm", "sglang")
    },
    "rerun_failed_point": {
        "kvbench": lambda c: (
            "look at its traceback in results.jsonl, fix the cause and rerun it "
            "(kvbench sweep --resume reruns failed points)"
        ),
    },
}


def phrase(key: str, family: str, context: Context | None = None) -> str | None:
    """One remedy for one engine family; None when that family has no such knob."""
    by_family = REMEDIES.get(key)
    if by_family is None:
        raise KeyError(f"unknown remedy {key!r}")
    text = by_family.get(family)
    return None if text is None else text(context or {})


def render(keys: Iterable[str], family: str, context: Context | None = None) -> str:
    """The remedies a family has, joined into one suggestion ("; or ...")."""
    parts = [text for key in keys if (text := phrase(key, family, context))]
    return "; or ".join(parts)
