"""Triton kernels for the KV ops; same contracts as :mod:`kvbench.kernels.reference`.

They run on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1`` (how the tests check them).
Whether a kernel is interpreted is fixed when this module is imported.

Design:
- Attention walks a request's context in tiles of ``BLOCK_N`` tokens, whatever the cache block size: each
  token's block id comes from the block table, so any block size works and contexts need not end on a block
  boundary. All query heads that share a KV head are handled by one program, so K/V are read once per
  group (grouped-query attention); the group is padded to 16 rows for ``tl.dot``.
- Online softmax in base 2, float32 accumulators; fp32 inputs use IEEE (not TF32) matrix products.
- Split-KV decode (flash-decoding): each program covers one partition of the context and writes a partial
  output plus its log-sum-exp; a second kernel combines the partitions. Chosen automatically when the batch
  gives too few programs to fill the GPU and the contexts are long; forced with ``num_splits``.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl

INTERPRETED = os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")  # fixed at import

LOG2E = 1.4426950408889634
DECODE_BLOCK_N = 64  # context tokens per tile in decode
PREFILL_BLOCK_M = 32  # (query token, group member) rows per prefill program
PREFILL_BLOCK_N = 32  # context tokens per tile in prefill
MIN_PARTITION = 256  # fewest context tokens a split-KV program covers when splits are chosen automatically
MAX_SPLITS = 64
COPY_CHUNK = 2048  # elements per copy_blocks program
WRITE_KV_ELEMENTS = 2048  # elements of one token's K (and as many of V) per write_kv program


def _pow2(n: int, minimum: int = 1) -> int:
    return max(minimum, triton.next_power_of_2(max(int(n), 1)))


def _precision(dtype: torch.dtype) -> str:
    """Exact fp32 products for fp32 inputs; native tensor-core precision otherwise."""
    return "ieee" if dtype == torch.float32 else "tf32"


# ----------------------------------------------------------------------------------------------- write_kv


@triton.jit
def _write_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_cb, stride_cs, stride_ch, stride_cd,
    stride_ub, stride_us, stride_uh, stride_ud,
    block_size, num_kv_heads, head_dim,
    HEADS: tl.constexpr, DIM: tl.constexpr,
):  # fmt: skip
    """Program (token, tile of HEADS KV heads): copy its K and V rows into the token's slot, unless -1."""
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    h = tl.program_id(1).to(tl.int64) * HEADS + tl.arange(0, HEADS).to(tl.int64)[:, None]
    d = tl.arange(0, DIM).to(tl.int64)[None, :]
    mask = (h < num_kv_heads) & (d < head_dim) & (slot + tl.zeros([HEADS, DIM], tl.int64) >= 0)
    block = slot // block_size
    offset = slot % block_size
    k = tl.load(key_ptr + token * stride_kt + h * stride_kh + d * stride_kd, mask=mask)
    v = tl.load(value_ptr + token * stride_vt + h * stride_vh + d * stride_vd, mask=mask)
    k_dst = k_cache_ptr + block * stride_cb + offset * stride_cs + h * stride_ch + d * stride_cd
    v_dst = v_cache_ptr + block * stride_ub + offset * stride_us + h * stride_uh + d * stride_ud
    tl.store(k_dst, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
    tl.store(v_dst, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter ``key``/``value`` ``[T, Hkv, D]`` into the caches at ``slot_mapping[T]``; slot ``-1`` is skipped."""
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    dim = _pow2(head_dim)
    heads = min(_pow2(num_kv_heads), max(1, WRITE_KV_ELEMENTS // dim))  # KV heads per program
    _write_kv_kernel[(num_tokens, triton.cdiv(num_kv_heads, heads))](
        key, value, k_cache, v_cache, slot_mapping,
        *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(),
        k_cache.shape[1], num_kv_heads, head_dim,
        HEADS=heads, DIM=dim,
    )  # fmt: skip


# --------------------------------------------------------------------------------------------- attention


@triton.jit
def _attend_tiles(
    q, m_i, l_i, acc, lo, hi, q_pos,
    k_cache_ptr, v_cache_ptr, table_ptr, block_size, kv_head,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    qk_scale, head_dim,
    BLOCK_N: tl.constexpr, DIM: tl.constexpr, CAUSAL: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Online softmax of ``q [M, DIM]`` over context tokens ``lo:hi`` read through a block-table row."""
    q = q.to(k_cache_ptr.dtype.element_ty)
    d = tl.arange(0, DIM).to(tl.int64)  # int64 index math: no overflow, and no overflow checks when interpreted
    d_mask = d < head_dim
    for start in range(lo, hi, BLOCK_N):
        tokens = tl.arange(0, BLOCK_N).to(tl.int64) + start
        t_mask = tokens < hi
        blocks = tl.load(table_ptr + tokens // block_size, mask=t_mask, other=0).to(tl.int64)
        offsets = tokens % block_size
        kv_mask = t_mask[:, None] & d_mask[None, :]
        k_rows = blocks * stride_kb + offsets * stride_ks + kv_head * stride_kh
        k = tl.load(k_cache_ptr + k_rows[:, None] + d[None, :] * stride_kd, mask=kv_mask, other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * qk_scale
        visible = t_mask[None, :]
        if CAUSAL:
            visible = visible & (tokens[None, :] <= q_pos[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(scores - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v_rows = blocks * stride_vb + offsets * stride_vs + kv_head * stride_vh
        v = tl.load(v_cache_ptr + v_rows[:, None] + d[None, :] * stride_vd, mask=kv_mask, other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, lens_ptr, out_ptr, lse_ptr,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_tb,
    stride_ob, stride_oh, stride_os, stride_od,
    stride_lb, stride_lh, stride_ls,
    block_size, head_dim, partition, qk_scale,
    GROUP: tl.constexpr, GROUP_PAD: tl.constexpr, DIM: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    """Program (request, KV head, partition). Without SPLIT it writes the final output (partition covers all);
    with SPLIT, a normalised partial output ``[B, Hq, S, D]`` and its base-2 log-sum-exp ``[B, Hq, S]``."""
    seq = tl.program_id(0).to(tl.int64)
    kv_head = tl.program_id(1).to(tl.int64)
    split = tl.program_id(2).to(tl.int64)
    context_len = tl.load(lens_ptr + seq).to(tl.int64)
    lo = split * partition
    hi = tl.minimum(context_len, lo + partition)
    g = tl.arange(0, GROUP_PAD).to(tl.int64)
    d = tl.arange(0, DIM).to(tl.int64)
    heads = kv_head * GROUP + g
    row_mask = (g < GROUP)[:, None] & (d < head_dim)[None, :]
    q = tl.load(q_ptr + seq * stride_qb + heads[:, None] * stride_qh + d[None, :] * stride_qd, mask=row_mask, other=0.0)
    m_i = tl.full([GROUP_PAD], float("-inf"), tl.float32)
    l_i = tl.zeros([GROUP_PAD], tl.float32)
    acc = tl.zeros([GROUP_PAD, DIM], tl.float32)
    m_i, l_i, acc = _attend_tiles(
        q, m_i, l_i, acc, lo, hi, g,
        k_cache_ptr, v_cache_ptr, tables_ptr + seq * stride_tb, block_size, kv_head,
        stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
        qk_scale, head_dim, BLOCK_N=BLOCK_N, DIM=DIM, CAUSAL=False, PRECISION=PRECISION,
    )  # fmt: skip
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]  # an empty range gives zeros
    o_ptrs = out_ptr + seq * stride_ob + heads[:, None] * stride_oh + split * stride_os + d[None, :] * stride_od
    tl.store(o_ptrs, out.to(out_ptr.dtype.element_ty), mask=row_mask)
    if SPLIT:
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.where(l_i > 0, l_i, 1.0)), float("-inf"))
        tl.store(lse_ptr + seq * stride_lb + heads * stride_lh + split * stride_ls, lse, mask=g < GROUP)


@triton.jit
def _combine_splits_kernel(
    partial_ptr, lse_ptr, out_ptr, num_splits, head_dim,
    stride_pb, stride_ph, stride_ps, stride_pd,
    stride_lb, stride_lh, stride_ls,
    stride_ob, stride_oh, stride_od,
    SPLITS: tl.constexpr, DIM: tl.constexpr,
):  # fmt: skip
    """Program (request, query head): weight each partition's output by its share of the softmax mass."""
    seq = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1).to(tl.int64)
    s = tl.arange(0, SPLITS).to(tl.int64)
    d = tl.arange(0, DIM).to(tl.int64)
    s_mask = s < num_splits
    d_mask = d < head_dim
    lse = tl.load(lse_ptr + seq * stride_lb + head * stride_lh + s * stride_ls, mask=s_mask, other=float("-inf"))
    top = tl.max(lse, 0)
    top = tl.where(top == float("-inf"), 0.0, top)
    weights = tl.exp2(lse - top)
    parts_ptrs = partial_ptr + seq * stride_pb + head * stride_ph + s[:, None] * stride_ps + d[None, :] * stride_pd
    parts = tl.load(parts_ptrs, mask=s_mask[:, None] & d_mask[None, :], other=0.0)
    total = tl.sum(weights, 0)
    out = tl.sum(parts * weights[:, None], 0) / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + seq * stride_ob + head * stride_oh + d * stride_od, out.to(out_ptr.dtype.element_ty), mask=d_mask
    )


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 132  # interpreter: pretend to be a large GPU so the heuristic behaves as it would there


def _fills_gpu(batch: int, num_kv_heads: int, device: torch.device) -> bool:
    return batch * num_kv_heads >= 2 * _multiprocessors(device)


def choose_num_splits(batch: int, num_kv_heads: int, max_context_len: int, device: torch.device) -> int:
    """How many partitions split-KV decode should use: 1 when ``batch x num_kv_heads`` programs already fill
    the GPU twice over or the contexts are short; else enough partitions (of at least ``MIN_PARTITION``
    tokens) to reach that."""
    by_length = max_context_len // MIN_PARTITION
    if _fills_gpu(batch, num_kv_heads, device) or by_length < 2:
        return 1
    target = 2 * _multiprocessors(device)
    return max(1, min(math.ceil(target / max(batch * num_kv_heads, 1)), by_length, MAX_SPLITS))


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    num_splits: int | None = None,
    max_context_len: int | None = None,
    block_n: int = DECODE_BLOCK_N,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """One query token per request: ``query [B, Hq, D]`` over its ``context_lens[b]`` cached tokens.

    ``num_splits``: ``None`` chooses (see :func:`choose_num_splits`), 1 forbids split-KV, ``n > 1`` forces
    ``n`` partitions. ``max_context_len`` saves a device sync when splits are chosen automatically.
    ``block_n``, ``num_warps`` and ``num_stages`` tune the kernel. Returns ``out`` (new unless passed).
    """
    batch, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    _check_heads(num_heads, num_kv_heads, head_dim, k_cache)
    result = out if out is not None else torch.empty_like(query)
    if batch == 0:
        return result
    if num_splits is None and _fills_gpu(batch, num_kv_heads, query.device):
        num_splits = 1  # decided without reading the context lengths (no device sync)
    if num_splits is None or num_splits > 1:
        longest = max_context_len if max_context_len is not None else int(context_lens.max())
        if num_splits is None:
            num_splits = choose_num_splits(batch, num_kv_heads, longest, query.device)
        partition = block_n * max(1, math.ceil(longest / (num_splits * block_n)))
        num_splits = max(1, math.ceil(longest / partition))
    group = num_heads // num_kv_heads
    constants = dict(
        GROUP=group, GROUP_PAD=_pow2(group, 16), DIM=_pow2(head_dim, 16), BLOCK_N=block_n,
        PRECISION=_precision(k_cache.dtype),
    )  # fmt: skip
    launch = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
    common = (
        *query.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0),
    )  # fmt: skip
    if num_splits == 1:
        _decode_kernel[(batch, num_kv_heads, 1)](
            query, k_cache, v_cache, block_tables, context_lens, result, result,
            *common, result.stride(0), result.stride(1), 0, result.stride(2), 0, 0, 0,
            k_cache.shape[1], head_dim, 2**31 - 1, scale * LOG2E, SPLIT=False, **constants, **launch,
        )  # fmt: skip
        return result
    partial = torch.empty(batch, num_heads, num_splits, head_dim, device=query.device, dtype=torch.float32)
    lse = torch.empty(batch, num_heads, num_splits, device=query.device, dtype=torch.float32)
    _decode_kernel[(batch, num_kv_heads, num_splits)](
        query, k_cache, v_cache, block_tables, context_lens, partial, lse,
        *common, *partial.stride(), *lse.stride(),
        k_cache.shape[1], head_dim, partition, scale * LOG2E, SPLIT=True, **constants, **launch,
    )  # fmt: skip
    _combine_splits_kernel[(batch, num_heads)](
        partial, lse, result, num_splits, head_dim,
        *partial.stride(), *lse.stride(), *result.stride(),
        SPLITS=_pow2(num_splits), DIM=_pow2(head_dim),
    )  # fmt: skip
    return result


@triton.jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, tables_ptr, starts_ptr, lens_ptr, out_ptr,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_tb,
    stride_ot, stride_oh, stride_od,
    block_size, head_dim, qk_scale,
    GROUP: tl.constexpr, DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):  # fmt: skip
    """Program (row tile, request, KV head). Rows are (new token, query head of the group) pairs, so the
    group's heads share each K/V tile."""
    tile = tl.program_id(0).to(tl.int64)
    seq = tl.program_id(1).to(tl.int64)
    kv_head = tl.program_id(2).to(tl.int64)
    q_start = tl.load(starts_ptr + seq).to(tl.int64)
    q_len = tl.load(starts_ptr + seq + 1).to(tl.int64) - q_start
    context_len = tl.load(lens_ptr + seq).to(tl.int64)
    rows = tile * BLOCK_M + tl.arange(0, BLOCK_M).to(tl.int64)
    token = rows // GROUP
    heads = kv_head * GROUP + rows % GROUP
    d = tl.arange(0, DIM).to(tl.int64)
    row_valid = token < q_len
    mask = row_valid[:, None] & (d < head_dim)[None, :]
    q_rows = (q_start + token) * stride_qt + heads * stride_qh
    q = tl.load(q_ptr + q_rows[:, None] + d[None, :] * stride_qd, mask=mask, other=0.0)
    q_pos = context_len - q_len + token
    last = tl.minimum((tile * BLOCK_M + BLOCK_M - 1) // GROUP, q_len - 1)
    hi = tl.where(tile * BLOCK_M < q_len * GROUP, context_len - q_len + last + 1, 0)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, DIM], tl.float32)
    m_i, l_i, acc = _attend_tiles(
        q, m_i, l_i, acc, 0, hi, q_pos,
        k_cache_ptr, v_cache_ptr, tables_ptr + seq * stride_tb, block_size, kv_head,
        stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd,
        qk_scale, head_dim, BLOCK_N=BLOCK_N, DIM=DIM, CAUSAL=True, PRECISION=PRECISION,
    )  # fmt: skip
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    o_rows = (q_start + token) * stride_ot + heads * stride_oh
    tl.store(out_ptr + o_rows[:, None] + d[None, :] * stride_od, out.to(out_ptr.dtype.element_ty), mask=mask)


def paged_prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    *,
    max_query_len: int | None = None,
    block_m: int = PREFILL_BLOCK_M,
    block_n: int = PREFILL_BLOCK_N,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor:
    """Causal attention of the new tokens ``query [T, Hq, D]`` over cached context plus themselves.

    ``max_query_len`` saves a device sync. Returns ``out`` (new unless passed).
    """
    _, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    _check_heads(num_heads, num_kv_heads, head_dim, k_cache)
    result = out if out is not None else torch.empty_like(query)
    batch = context_lens.shape[0]
    if batch == 0 or query.shape[0] == 0:
        return result
    if max_query_len is None:
        max_query_len = int((query_start_loc[1:] - query_start_loc[:-1]).max())
    group = num_heads // num_kv_heads
    launch = {k: v for k, v in (("num_warps", num_warps), ("num_stages", num_stages)) if v is not None}
    grid = (triton.cdiv(max(max_query_len, 1) * group, block_m), batch, num_kv_heads)
    _prefill_kernel[grid](
        query, k_cache, v_cache, block_tables, query_start_loc, context_lens, result,
        *query.stride(), *k_cache.stride(), *v_cache.stride(), block_tables.stride(0), *result.stride(),
        k_cache.shape[1], head_dim, scale * LOG2E,
        GROUP=group, DIM=_pow2(head_dim, 16), BLOCK_M=block_m, BLOCK_N=block_n,
        PRECISION=_precision(k_cache.dtype), **launch,
    )  # fmt: skip
    return result


def _check_heads(num_heads: int, num_kv_heads: int, head_dim: int, k_cache: torch.Tensor) -> None:
    if num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads do not divide into {num_kv_heads} KV heads")
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"query head_dim {head_dim} != cache head_dim {k_cache.shape[3]}")


# -------------------------------------------------------------------------------------------- copy_blocks


@triton.jit
def _copy_blocks_kernel(
    cache_ptrs, src_ptr, dst_ptr, block_numel,
    ELEMENT_BYTES: tl.constexpr, CHUNK: tl.constexpr,
):  # fmt: skip
    """Program (pair, cache, chunk): the caches' base addresses come from a table, so every layer's K and V
    is served by one launch. Elements are moved as same-size integers (any dtype)."""
    pair = tl.program_id(0)
    cache = tl.program_id(1)
    chunk = tl.program_id(2).to(tl.int64)
    address = tl.load(cache_ptrs + cache)
    if ELEMENT_BYTES == 1:
        base = address.to(tl.pointer_type(tl.int8))
    elif ELEMENT_BYTES == 2:
        base = address.to(tl.pointer_type(tl.int16))
    elif ELEMENT_BYTES == 4:
        base = address.to(tl.pointer_type(tl.int32))
    else:
        base = address.to(tl.pointer_type(tl.int64))
    src = tl.load(src_ptr + pair).to(tl.int64)
    dst = tl.load(dst_ptr + pair).to(tl.int64)
    offsets = chunk * CHUNK + tl.arange(0, CHUNK)
    mask = offsets < block_numel
    values = tl.load(base + src * block_numel + offsets, mask=mask)
    tl.store(base + dst * block_numel + offsets, values, mask=mask)


def copy_blocks(
    k_caches: list[torch.Tensor],
    v_caches: list[torch.Tensor],
    src_blocks: torch.Tensor,
    dst_blocks: torch.Tensor,
) -> None:
    """Copy block ``src_blocks[i]`` onto ``dst_blocks[i]`` in every layer's K and V cache, in one launch.

    All caches must be contiguous with one shape and dtype. No destination may also be a source (true of
    copy-on-write, whose destinations are fresh blocks): programs run in no particular order.
    """
    caches = [cache for pair in zip(k_caches, v_caches, strict=True) for cache in pair]
    num_pairs = src_blocks.numel()
    if not caches or num_pairs == 0:
        return
    first = caches[0]
    for cache in caches:
        if cache.shape != first.shape or cache.dtype != first.dtype or not cache.is_contiguous():
            raise ValueError("copy_blocks needs contiguous caches of one shape and dtype")
    if dst_blocks.numel() != num_pairs:
        raise ValueError("src_blocks and dst_blocks differ in length")
    if first.element_size() not in (1, 2, 4, 8):
        raise ValueError(f"copy_blocks cannot move {first.dtype} elements")
    block_numel = first[0].numel()
    table = torch.tensor([cache.data_ptr() for cache in caches], dtype=torch.int64, device=first.device)
    grid = (num_pairs, len(caches), triton.cdiv(block_numel, COPY_CHUNK))
    _copy_blocks_kernel[grid](
        table, src_blocks, dst_blocks, block_numel,
        ELEMENT_BYTES=first.element_size(), CHUNK=COPY_CHUNK,
    )  # fmt: skip
