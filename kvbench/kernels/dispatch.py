"""Choose the implementation of each KV op: Triton on CUDA; on a CPU the C kernels where they build, else the
torch reference.

``backend`` ("torch" | "triton" | "native") overrides the choice per call and ``KVBENCH_KERNEL_BACKEND`` for the
whole process. "native" is the CPU's C decode and prefill attention and K/V write (``cpu_native``) with the torch
reference for the other ops; it applies to float32 and bfloat16 pools (the prefill to head dims that are multiples
of 16) and falls back to the reference elsewhere. The
attention ops take ``out=`` (write into this tensor, and return it); the Triton decode also takes
``num_splits`` (``None`` automatic, 1 never, n forced split-KV) and ``max_context_len`` (saves a device sync),
which the torch reference ignores. The torch reference takes a per-step ``plan`` (the gathers and masks that
every layer of a step shares, from ``plan_decode`` / ``plan_prefill``), which the Triton kernels do not need:
the planners return None for them.
"""

from __future__ import annotations

import torch

from kvbench import env_settings
from kvbench.errors import KvbenchError
from kvbench.kernels import cpu_native, reference

BACKENDS = ("torch", "triton", "native")


def resolve_backend(device: torch.device, backend: str | None = None) -> str:
    chosen = backend or env_settings.read("KVBENCH_KERNEL_BACKEND")
    if chosen is None:
        if device.type == "cuda":
            chosen = "triton"
        else:
            chosen = "native" if device.type == "cpu" and cpu_native.available() else "torch"
    if chosen not in BACKENDS:  # from the user: KVBENCH_KERNEL_BACKEND or an option
        raise KvbenchError(f"unknown kernel backend {chosen!r}; choose one of {', '.join(BACKENDS)}")
    return chosen


def _triton_ops():
    from kvbench.kernels import triton_ops  # imported lazily: triton is optional on CPU

    return triton_ops


def write_kv(key, value, k_cache, v_cache, slot_mapping, backend: str | None = None, *, padded: bool = True) -> None:
    """``padded=False`` promises no slot is -1 (the torch path then skips its filter)."""
    chosen = resolve_backend(key.device, backend)
    if chosen == "triton":
        return _triton_ops().write_kv(key, value, k_cache, v_cache, slot_mapping)
    if chosen == "native" and cpu_native.takes_write(key, value, k_cache, slot_mapping) and cpu_native.available():
        return cpu_native.write_kv(key, value, k_cache, v_cache, slot_mapping)
    return reference.write_kv(key, value, k_cache, v_cache, slot_mapping, padded)


def _native_decode(query, k_cache, backend: str | None) -> bool:
    """Whether the C decode kernel runs this call (the native backend, on tensors it takes)."""
    return (
        resolve_backend(query.device, backend) == "native"
        and cpu_native.supports(query, k_cache)
        and cpu_native.available()
    )


def plan_decode(block_tables, context_lens, k_cache, backend: str | None = None, *, valid_tables: bool = False):
    """What every layer's decode attention of one step shares (None when the backend plans nothing).

    ``valid_tables=True`` promises every table entry, padding included, is a real block id.
    """
    if resolve_backend(k_cache.device, backend) == "triton" or _native_decode(k_cache, k_cache, backend):
        return None
    return reference.plan_decode(
        block_tables, context_lens, k_cache.shape[1], k_cache.shape[2] * k_cache.shape[3], valid_tables
    )


def kept_decode_plan(table_rows, bias, count: int):
    """A one-chunk torch decode plan that views ``table_rows`` (``[count * W]`` block ids, every entry a real
    block) and ``bias`` (``[count, W * block_size]``, 0 visible, -inf not), for a caller that advances them in
    place between steps. Valid while :func:`decode_plan_fits`."""
    return reference.DecodePlan(count, (reference.DecodeChunk(0, count, table_rows, bias[:, None, None, :], None),))


def decode_padding_is_small(context_lens: list[int], block_size: int) -> bool:
    """Whether one bucket (every request padded to the longest) suits these context lengths."""
    return reference.decode_padding_is_small(context_lens, block_size)


def decode_plan_fits(plan, max_context_len: int, kv_row: int) -> bool:
    """Whether a one-chunk plan still suits a step whose longest context is ``max_context_len``."""
    return reference.decode_chunk_rows(max_context_len, kv_row) >= plan.batch


def _native_prefill(query, k_cache, backend: str | None) -> bool:
    """Whether the C prefill kernel runs this call (the native backend, on tensors it takes)."""
    return (
        resolve_backend(k_cache.device, backend) == "native"
        and cpu_native.takes_prefill(k_cache)
        and query.dtype == k_cache.dtype
        and cpu_native.available()
    )


def plan_prefill(block_tables, query_start_loc, context_lens, k_cache, num_heads: int, backend: str | None = None):
    """What every layer's prefill attention of one step shares (None when the backend plans nothing)."""
    if resolve_backend(k_cache.device, backend) == "triton" or _native_prefill(k_cache, k_cache, backend):
        return None
    return reference.plan_prefill(
        block_tables, query_start_loc, context_lens, k_cache.shape[1], k_cache.shape[2] * k_cache.shape[3], num_heads
    )


def paged_decode_attention(
    query,
    k_cache,
    v_cache,
    block_tables,
    context_lens,
    scale,
    backend: str | None = None,
    *,
    out: torch.Tensor | None = None,
    num_splits: int | None = None,
    max_context_len: int | None = None,
    plan=None,
    prefetch: cpu_native.DecodePrefetch = cpu_native.DEFAULT_PREFETCH,
):
    """``prefetch``: how the C kernel prefetches K/V rows (speed only; the other backends do not take it)."""
    if resolve_backend(query.device, backend) == "triton":
        return _triton_ops().paged_decode_attention(
            query, k_cache, v_cache, block_tables, context_lens, scale, out,
            num_splits=num_splits, max_context_len=max_context_len,
        )  # fmt: skip
    if _native_decode(query, k_cache, backend):
        return cpu_native.paged_decode_attention(
            query, k_cache, v_cache, block_tables, context_lens, scale, out, max_context_len, prefetch
        )
    return reference.paged_decode_attention(query, k_cache, v_cache, block_tables, context_lens, scale, out, plan)


def paged_prefill_attention(
    query,
    k_cache,
    v_cache,
    block_tables,
    query_start_loc,
    context_lens,
    scale,
    backend: str | None = None,
    *,
    out: torch.Tensor | None = None,
    max_query_len: int | None = None,
    plan=None,
):
    if resolve_backend(query.device, backend) == "triton":
        return _triton_ops().paged_prefill_attention(
            query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, out,
            max_query_len=max_query_len,
        )  # fmt: skip
    if _native_prefill(query, k_cache, backend):
        return cpu_native.paged_prefill_attention(
            query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, out
        )
    return reference.paged_prefill_attention(
        query, k_cache, v_cache, block_tables, query_start_loc, context_lens, scale, out, plan
    )


def copy_blocks(k_caches, v_caches, src_blocks, dst_blocks, backend: str | None = None) -> None:
    if resolve_backend(src_blocks.device, backend) == "triton":
        return _triton_ops().copy_blocks(k_caches, v_caches, src_blocks, dst_blocks)
    return reference.copy_blocks(k_caches, v_caches, src_blocks, dst_blocks)
