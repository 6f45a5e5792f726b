"""Pre-flight checks: refuse a run that cannot work before it allocates anything large.

A run needs its weights, its KV pool and activations in device memory, and its request list in host memory;
its counts (requests, prompts, samples, block size, pool blocks) must be numbers a sensible run uses. The
``check_*`` functions take plain numbers and raise :class:`KvbenchError` with one line that says what to
change; the ``*_for_*`` and ``available_*`` helpers read the machine (free memory) for them.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError
from kvbench.models.gpus import activation_reserve_bytes
from kvbench.models.shapes import ModelShape
from kvbench.units import human_bytes

GIB = 1024**3
# Share of the free memory a run may plan to use: the rest absorbs what is not estimated (allocator
# rounding, kernels' workspaces, the interpreter, other processes growing meanwhile).
MEMORY_FRACTION = 0.9

# Host bytes of a request list, measured with tracemalloc on CPython 3.11 and rounded up: a request object
# with its sampling parameters takes ~0.7 KiB, doubled for what a run adds per request (generator, results);
# a token id in a Python list ~40 B (pointer + int object); an output token also keeps its timestamp.
REQUEST_BYTES = 2048
PROMPT_TOKEN_BYTES = 40
OUTPUT_TOKEN_BYTES = 80

# Upper limits no sensible run reaches; past them a typo (an extra zero or three) is more likely than intent.
LIMITS = {
    # A simulated sweep point of 10,000 requests takes seconds; ten million take hours and GiBs of bookkeeping.
    "requests": 10_000_000,
    # Prompts of `kvbench share` run on the tensor engine: a million is already far past a useful measurement.
    "prompts": 1_000_000,
    # Parallel samples / beams per prompt: serving APIs cap n at about a hundred; 1024 leaves ample room.
    "samples": 1024,
    # Serving engines use blocks of 8-256 tokens; a block longer than most contexts only wastes its tail.
    "block_size": 4096,
    # Block tables are int32 tensors (the attention kernels' block ids): no pool can have more blocks.
    "num_blocks": 2**31 - 1,
}
_NAMES = {
    "requests": "requests",
    "prompts": "prompts",
    "samples": "samples (or beams) per prompt",
    "block_size": "block size",
    "num_blocks": "KV pool blocks",
}


# ---------------------------------------------------------------------------------------------- counts


def check_count(name: str, value: int, limit: int | None = None, option: str | None = None) -> None:
    """``value`` is an integer in [1, limit] (``limit`` defaults to :data:`LIMITS`)."""
    option = option or _NAMES.get(name, name)
    limit = LIMITS[name] if limit is None else limit
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise KvbenchError(f"{option} must be a positive integer, got {value!r}")
    if value > limit:
        raise KvbenchError(f"{option} {value:,} is above kvbench's limit of {limit:,}; no sensible run needs more")


def check_run_counts(
    *,
    requests: int | None = None,
    prompts: int | None = None,
    samples: int | None = None,
    block_size: int | None = None,
    num_blocks: int | None = None,
) -> None:
    """Every count given is in [1, its limit]; prompts x samples (the sequences a run holds) too."""
    given = {
        "requests": requests,
        "prompts": prompts,
        "samples": samples,
        "block_size": block_size,
        "num_blocks": num_blocks,
    }
    for name, value in given.items():
        if value is not None:
            check_count(name, value)
    if prompts is not None and samples is not None:
        check_count("requests", prompts * samples, option="prompts x samples per prompt")


def check_concurrency(counts: Mapping[int, int | None]) -> None:
    """Each closed-loop concurrency can be met: within the request limit (no point holds more requests) and,
    where its point's request count is known, no more than that count; else the point would record a
    concurrency it never ran."""
    for concurrency, requests in sorted(counts.items()):
        check_count("requests", concurrency, option="concurrency")
        if requests is not None and concurrency > requests:
            raise KvbenchError(
                f"concurrency {concurrency:,} is more than the {requests:,} requests of its point: at "
                f"most {requests:,} can be in flight, so the point would not measure concurrency "
                f"{concurrency:,}; lower it or send at least {concurrency:,} requests"
            )


# ---------------------------------------------------------------------------------------------- memory


@dataclass(frozen=True)
class MemoryNeed:
    """What a run keeps in one device's memory, in bytes."""

    weights: int = 0
    kv_pool: int = 0
    activations: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_pool + self.activations

    def breakdown(self) -> str:
        parts = [
            (name, value)
            for name, value in (("weights", self.weights), ("KV pool", self.kv_pool), ("activations", self.activations))
            if value
        ]
        return " + ".join(f"{name} {human_bytes(value, 'GiB')}" for name, value in parts) or "nothing"


def kv_pool_bytes(num_blocks: int, block_size: int, bytes_per_token: int) -> int:
    """Bytes of a pool of ``num_blocks`` blocks of ``block_size`` token slots (all layers, K and V)."""
    return num_blocks * block_size * bytes_per_token


def check_memory(
    need: MemoryNeed, available: int, device: str, fraction: float = MEMORY_FRACTION, advice: str | None = None
) -> None:
    """``need`` fits in ``fraction`` of the ``available`` bytes of ``device``, or one line with the breakdown."""
    usable = int(fraction * available)
    if need.total <= usable:
        return
    advice = advice or "use a smaller model, a smaller KV pool (fewer blocks, less KV memory), or another device"
    raise KvbenchError(
        f"the run needs {human_bytes(need.total, 'GiB')} on {device} ({need.breakdown()}) but {device} has "
        f"{human_bytes(available, 'GiB')} free and kvbench plans with at most {fraction:.0%} of it "
        f"({human_bytes(usable, 'GiB')}): {advice}"
    )


def request_list_bytes(num_requests: int, prompt_tokens: int, output_tokens: int = 0) -> int:
    """Host bytes of ``num_requests`` requests holding ``prompt_tokens`` prompt token ids in all."""
    return num_requests * REQUEST_BYTES + prompt_tokens * PROMPT_TOKEN_BYTES + output_tokens * OUTPUT_TOKEN_BYTES


def check_request_memory(
    num_requests: int, prompt_tokens: int, available: int, output_tokens: int = 0, fraction: float = MEMORY_FRACTION
) -> None:
    """The request list (and the output tokens it will collect) fits in host memory."""
    need = request_list_bytes(num_requests, prompt_tokens, output_tokens)
    usable = int(fraction * available)
    if need > usable:
        raise KvbenchError(
            f"{num_requests:,} requests with {prompt_tokens:,} prompt and {output_tokens:,} output tokens need about "
            f"{human_bytes(need, 'GiB')} of host memory for their bookkeeping; {human_bytes(usable, 'GiB')} of the "
            f"{human_bytes(available, 'GiB')} free is usable:"
            " ask for fewer or shorter requests"
        )


def check_context_length(shape: ModelShape, max_len: int) -> None:
    """A run's max-len fits the model's context (``max_position_embeddings``, stretched by rope scaling)."""
    check_count("max_len", max_len, limit=2**31 - 1, option="max-len")
    if max_len > shape.context_length:
        raise KvbenchError(
            f"max-len {max_len:,} exceeds the context length of {shape.name} ({shape.context_length:,} tokens from"
            f" max_position_embeddings {shape.max_position_embeddings:,}): lower max-len or use a longer-context"
            " model"
        )


# ---------------------------------------------------------------------------------------------- the machine


def parse_meminfo(text: str) -> int | None:
    """``MemAvailable`` of a ``/proc/meminfo`` text, in bytes; None when absent (old kernels, other systems)."""
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name.strip() == "MemAvailable":
            fields = rest.split()
            if fields and fields[0].isdigit():
                unit = fields[1].lower() if len(fields) > 1 else "b"
                return int(fields[0]) * (1024 if unit == "kb" else 1)
    return None


def available_host_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """Host memory a new allocation can get: ``MemAvailable`` (counts reclaimable caches), else free pages."""
    try:
        found = parse_meminfo(meminfo.read_text(encoding="ascii", errors="replace"))
    except OSError:
        found = None
    if found is not None:
        return found
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):  # no such sysconf name here: do not refuse what we cannot see
        return 2**62


def available_device_bytes(device: Any) -> int:
    """Free bytes of a torch device (``cuda:N`` from the driver) or of the host for ``cpu``."""
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    if kind == "cuda":
        import torch

        free, _total = torch.cuda.mem_get_info(device)
        return int(free)
    return available_host_bytes()


def device_label(device: Any) -> str:
    kind = getattr(device, "type", None) or str(device).split(":")[0]
    return "this host" if kind == "cpu" else str(device)


def model_memory_need(shape: ModelShape, kv_pool: int = 0) -> MemoryNeed:
    """Weights and activations of ``shape`` in its dtype, and a KV pool of ``kv_pool`` bytes."""
    return MemoryNeed(weights=shape.weight_bytes, kv_pool=kv_pool, activations=activation_reserve_bytes(shape))


def check_model_memory_for_device(
    shape: ModelShape, device: Any, kv_pool: int = 0, available: int | None = None
) -> None:
    """The model's weights and activations (and a pool, if given) fit in what ``device`` has free."""
    free = available_device_bytes(device) if available is None else available
    check_memory(model_memory_need(shape, kv_pool), free, device_label(device))


def check_weights_for_host(shape: ModelShape, available: int | None = None) -> None:
    """A checkpoint is read into host memory before it moves to a GPU, so its weights must fit there too."""
    free = available_host_bytes() if available is None else available
    check_memory(
        MemoryNeed(weights=shape.weight_bytes),
        free,
        "this host",
        advice="the checkpoint is read into host memory before it moves to the GPU: use a smaller model "
        "or a host with more memory",
    )


def check_kv_pool_for_device(
    shape: ModelShape,
    device: Any,
    num_blocks: int,
    block_size: int,
    available: int | None = None,
    pools: int = 1,
    extra_weights: int = 0,
) -> None:
    """``pools`` pools of ``num_blocks`` x ``block_size`` slots fit in what ``device`` has free now (weights loaded).

    ``pools`` counts the pools alive at once when none exists yet (a study that builds its next engine before
    dropping the last holds two); an engine built next to a live one sees that one in the free memory already.
    ``extra_weights`` counts weight copies the engine makes before its pool (the CPU's packed matmul weights).
    """
    check_run_counts(block_size=block_size, num_blocks=num_blocks)
    free = available_device_bytes(device) if available is None else available
    need = MemoryNeed(
        weights=extra_weights, kv_pool=pools * kv_pool_bytes(num_blocks, block_size, shape.bytes_per_token)
    )
    one = kv_pool_bytes(num_blocks, block_size, shape.bytes_per_token)
    alive = f"{pools} pools of {human_bytes(one, 'GiB')} are alive at once; " if pools > 1 else ""
    check_memory(
        need,
        free,
        device_label(device),
        advice=f"{alive}use a smaller KV pool (fewer or smaller blocks, less KV memory), or another device",
    )


def check_requests_for_host(
    num_requests: int, prompt_tokens: int, output_tokens: int = 0, available: int | None = None
) -> None:
    """The request list fits in what the host has free."""
    check_count("requests", num_requests)
    free = available_host_bytes() if available is None else available
    check_request_memory(num_requests, prompt_tokens, free, output_tokens)
