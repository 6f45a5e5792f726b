"""Plain torch reference implementations of the KV ops. They run on any device and define the contract.

Cache layout (one layer): ``k_cache`` and ``v_cache`` are ``[num_blocks, block_size, num_kv_heads, head_dim]``.
A token's *slot* is ``block_id * block_size + offset``. A request's *block table* row lists its block ids in
order; unused entries may hold any value (they are never read for positions ``>= context_len``).

Query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)`` (grouped-query attention). Scores, softmax
and the weighted sum are computed in float32 and cast back to the query's dtype. A request with context
length 0 gets a zero output.

The attention ops are vectorised over the batch (they are the CPU engine's hot path): the blocks of every
request are gathered into one tensor padded to the longest context, and padding is masked out of the softmax.
What that gather and mask need depends only on the block tables and lengths, which every layer of a step
shares: :func:`plan_decode` / :func:`plan_prefill` build it once per step and each layer's call reuses it.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

# Work on the batch in chunks whose gathered K (as float32) stays under this many bytes: large temporaries
# are slow to allocate (page faults) and fall out of cache.
_CHUNK_BYTES = 4 << 20
# Prefill pads a chunk of requests to its longest query and context only while that at most multiplies
# the real work by this factor (plus a little slack); otherwise the chunk is cut.
_PREFILL_MAX_WASTE = 1.25
_PREFILL_WASTE_SLACK = 1 << 14
# Decode likewise: requests of very different context lengths are attended in length buckets, each gathered only
# as wide as its longest, so the work follows the sum of the contexts (plus at most a quarter and a little slack).
_DECODE_MAX_WASTE = 1.25
_DECODE_WASTE_SLACK = 256


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    padded: bool = True,
) -> None:
    """Scatter ``key``/``value`` ``[T, Hkv, D]`` into the caches at ``slot_mapping[T]``; slot ``-1`` is skipped.

    ``padded=False`` promises that no slot is ``-1``, which saves filtering them out.
    """
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    k_flat = k_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    v_flat = v_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    slots = slot_mapping.long()
    if padded:
        keep = slots >= 0
        slots, key, value = slots[keep], key[keep], value[keep]
    k_flat.index_copy_(0, slots, key.to(k_cache.dtype))
    v_flat.index_copy_(0, slots, value.to(v_cache.dtype))


def gather_context(cache: torch.Tensor, block_table_row: torch.Tensor, context_len: int) -> torch.Tensor:
    """The first ``context_len`` token states of one request, ``[context_len, Hkv, D]``."""
    block_size = cache.shape[1]
    num_blocks = (context_len + block_size - 1) // block_size
    blocks = cache[block_table_row[:num_blocks].long()]
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:context_len]


def _block_index(block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, max_len: int) -> torch.Tensor:
    """Flat block ids ``[B * W]`` of each request's first ``W = ceil(max_len / block_size)`` table entries.

    Entries past a request's last needed block may hold garbage: block 0 is read there instead, and the
    caller masks positions ``>= context_lens[b]``.
    """
    width = max((max_len + block_size - 1) // block_size, 1)
    needed = torch.arange(width, device=block_tables.device)[None, :] * block_size < context_lens[:, None]
    return block_tables[:, :width].long().masked_fill_(~needed, 0).view(-1)


def _gather(cache: torch.Tensor, index: torch.Tensor, batch: int) -> torch.Tensor:
    """Blocks ``index`` of ``cache`` as ``[batch, L, Hkv, D]`` (index_select: far faster than ``cache[index]``)."""
    return torch.index_select(cache, 0, index).view(batch, -1, cache.shape[2], cache.shape[3])


def _attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, scale: float):
    """Fused attention in float32 over gathered blocks, without copying them into head-major order.

    ``q [B, Hq, M, D]``, ``keys``/``values [B, L, Hkv, D]``, ``visible`` a boolean mask or an additive float
    bias, broadcastable to ``[B, Hq, M, L]``; every row must see at least one key. Returns ``[B, Hq, M, D]``
    float32.
    """
    q = q.float()
    k = keys.transpose(1, 2).float()  # [B, Hkv, L, D]: a view when the cache is float32
    v = values.transpose(1, 2).float()
    batch, num_heads, rows, head_dim = q.shape
    group = num_heads // k.shape[1]
    if group == 1:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)
    if rows == 1:  # decode: a KV head's query heads become its rows, so each K/V head is read once
        grouped = q.reshape(batch, k.shape[1], group, head_dim)
        out = F.scaled_dot_product_attention(grouped, k, v, attn_mask=visible, scale=scale)
        return out.view(batch, num_heads, 1, head_dim)
    try:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale, enable_gqa=True)
    except TypeError:  # torch < 2.5 has no enable_gqa
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)


@dataclass(frozen=True)
class DecodeChunk:
    """Some requests of a decode step: which blocks to gather, and the softmax bias over them.

    The requests are rows ``start:end`` of the batch, or, when ``rows`` is given, those rows (a length bucket:
    requests of similar context length, gathered only as wide as their longest).
    """

    start: int
    end: int
    block_index: torch.Tensor  # [n * W] block ids (int32 or int64)
    bias: torch.Tensor  # [n, 1, 1, W * block_size] float32: 0 where visible, -inf on padding
    empty: torch.Tensor | None  # [n] bool, requests with no context (zero output); None if there are none
    rows: torch.Tensor | None = None  # [n] int64 batch rows of a bucket; None: rows start:end


@dataclass(frozen=True)
class DecodePlan:
    """The batch of one decode step cut into chunks whose gathered K stays small (see ``_CHUNK_BYTES``) and,
    when lengths differ, into buckets of similar length, so the work follows the sum of the contexts rather
    than the batch size times the longest one."""

    batch: int
    chunks: tuple[DecodeChunk, ...]


def decode_chunk_rows(max_len: int, kv_row: int) -> int:
    """Requests per decode chunk when the longest context is ``max_len`` (gathered K under ``_CHUNK_BYTES``)."""
    return max(1, _CHUNK_BYTES // (max(max_len, 1) * kv_row * 4))


def decode_padding_is_small(lens: list[int], block_size: int) -> bool:
    """Whether padding every request to the longest wastes little (one bucket is then the right plan)."""
    if not lens:
        return True
    width = -(-max(lens) // block_size) * block_size
    return len(lens) * width <= _DECODE_MAX_WASTE * sum(lens) + _DECODE_WASTE_SLACK


def _decode_buckets(lens: list[int], block_size: int, kv_row: int) -> list[list[int]]:
    """Rows grouped longest first: a bucket closes when padding to its longest would waste too much or its
    gathered K would pass ``_CHUNK_BYTES``. When padding to the longest wastes little, rows keep their order
    and are only cut by bytes (contiguous runs: no row index needed)."""
    if decode_padding_is_small(lens, block_size):
        step = decode_chunk_rows(max(lens, default=0), kv_row)
        return [list(range(start, min(start + step, len(lens)))) for start in range(0, len(lens), step)]
    order = sorted(range(len(lens)), key=lambda b: -lens[b])
    buckets: list[list[int]] = []
    current: list[int] = []
    width = real = 0
    for b in order:
        if not current:
            width = max(-(-lens[b] // block_size) * block_size, block_size)
        padded, grown_real = (len(current) + 1) * width, real + lens[b]
        fits = (len(current) + 1) * width * kv_row * 4 <= _CHUNK_BYTES and (
            padded <= _DECODE_MAX_WASTE * grown_real + _DECODE_WASTE_SLACK
        )
        if current and not fits:
            buckets.append(current)
            current, width, grown_real = [], max(-(-lens[b] // block_size) * block_size, block_size), lens[b]
        current.append(b)
        real = grown_real
    if current:
        buckets.append(current)
    return buckets


def plan_decode(
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    kv_row: int,
    valid_tables: bool = False,
) -> DecodePlan:
    """The gathers and masks of a decode step; ``kv_row`` is ``num_kv_heads * head_dim`` of the cache.

    ``valid_tables=True`` promises that every entry of ``block_tables`` is a real block id (padding included,
    as the model runner pads with block 0): the unused entries are then gathered and masked out instead of
    being replaced first, which saves most of the planning ops (each tiny op costs microseconds on a CPU).
    """
    lens_list = context_lens.tolist()
    batch = len(lens_list)
    chunks = []
    for bucket in _decode_buckets(lens_list, block_size, kv_row):
        contiguous = bucket == list(range(bucket[0], bucket[0] + len(bucket)))
        rows = None if contiguous else torch.tensor(bucket, device=context_lens.device)
        chunk_lens = context_lens[bucket[0] : bucket[0] + len(bucket)] if contiguous else context_lens[rows]
        chunk_tables = block_tables[bucket[0] : bucket[0] + len(bucket)] if contiguous else block_tables[rows]
        chunk_lens_list = [lens_list[b] for b in bucket]
        chunk_max, empty = max(chunk_lens_list), min(chunk_lens_list) == 0
        width = max((chunk_max + block_size - 1) // block_size, 1)
        if valid_tables:
            index = chunk_tables[:, :width].reshape(-1)
        else:
            index = _block_index(chunk_tables, chunk_lens.long(), block_size, chunk_max)
        positions = torch.arange(width * block_size, device=chunk_lens.device)
        visible = positions[None, :] < (chunk_lens.clamp(min=1) if empty else chunk_lens)[:, None]
        bias = torch.where(visible, 0.0, -torch.inf)  # float32: an additive mask is cheaper in SDPA than a boolean
        start = bucket[0] if contiguous else 0
        chunks.append(
            DecodeChunk(
                start, start + len(bucket), index, bias[:, None, None, :], chunk_lens == 0 if empty else None, rows
            )
        )
    return DecodePlan(batch, tuple(chunks))


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    plan: DecodePlan | None = None,
) -> torch.Tensor:
    """One query token per request: ``query [B, Hq, D]`` over its ``context_lens[b]`` cached tokens.

    Returns ``out`` (a new ``[B, Hq, D]`` tensor unless one is passed). ``plan`` is :func:`plan_decode` of
    the same tables and lengths (built here when not given).
    """
    if plan is None:
        plan = plan_decode(block_tables, context_lens, k_cache.shape[1], k_cache.shape[2] * k_cache.shape[3])
    if plan.batch != query.shape[0]:
        raise ValueError(f"the plan covers {plan.batch} requests, the query {query.shape[0]}")
    result = out if out is not None else torch.empty_like(query)
    for chunk in plan.chunks:
        count = chunk.end - chunk.start
        keys = _gather(k_cache, chunk.block_index, count)
        values = _gather(v_cache, chunk.block_index, count)
        rows = query[chunk.start : chunk.end] if chunk.rows is None else query[chunk.rows]
        attended = _attention(rows[:, :, None, :], keys, values, chunk.bias, scale)[:, :, 0]
        if chunk.empty is not None:  # an empty context attends to nothing: zeros
            attended.masked_fill_(chunk.empty[:, None, None], 0.0)
        if chunk.rows is None:
            result[chunk.start : chunk.end] = attended
        else:
            result[chunk.rows] = attended.to(result.dtype)
    return result


@dataclass(frozen=True)
class PrefillChunk:
    """Requests of a prefill step padded together to ``[n, Qmax]`` queries over ``[n, L]`` gathered keys."""

    count: int
    max_query_len: int
    query_index: torch.Tensor  # [n * Qmax] int64, row of each padded query (padding reads row 0)
    query_valid: torch.Tensor  # [n, Qmax] bool
    output_index: torch.Tensor  # [real queries] int64, rows the valid queries are written to
    block_index: torch.Tensor  # [n * W] int64
    visible: torch.Tensor  # [n, 1, Qmax, L] bool, causal over cached context plus the chunk itself


@dataclass(frozen=True)
class PrefillPlan:
    num_tokens: int
    chunks: tuple[PrefillChunk, ...]


def plan_prefill(
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    block_size: int,
    kv_row: int,
    num_heads: int,
) -> PrefillPlan:
    """The gathers and masks of a prefill step (see :func:`paged_prefill_attention` for the arguments)."""
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    q_lens = [starts[b + 1] - starts[b] for b in range(len(lens))]
    device = context_lens.device
    chunks = []
    for first, last in _prefill_chunks(q_lens, lens, num_heads, kv_row):
        if sum(q_lens[first:last]) == 0:
            continue
        max_q, max_len = max(q_lens[first:last]), max(lens[first:last])
        lens_t = torch.tensor(lens[first:last], device=device)
        q_lens_t = torch.tensor(q_lens[first:last], device=device)
        row = torch.arange(max_q, device=device)
        q_valid = row[None, :] < q_lens_t[:, None]  # [n, Qmax]
        q_index = (torch.tensor(starts[first:last], device=device)[:, None] + row[None, :]).masked_fill_(~q_valid, 0)
        index = _block_index(block_tables[first:last], lens_t, block_size, max_len)
        width = index.shape[0] // (last - first) * block_size
        q_pos = (lens_t - q_lens_t)[:, None] + row[None, :]  # padding rows see every key: no NaN
        visible = torch.arange(width, device=device)[None, None, :] <= q_pos[:, :, None]  # [n, Qmax, L]
        chunks.append(
            PrefillChunk(last - first, max_q, q_index.view(-1), q_valid, q_index[q_valid], index, visible[:, None])
        )
    return PrefillPlan(starts[-1] if starts else 0, tuple(chunks))


def paged_prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    plan: PrefillPlan | None = None,
) -> torch.Tensor:
    """Causal attention of new tokens over the cached context plus themselves.

    ``query [T, Hq, D]`` packs the new tokens of B requests; request b owns rows
    ``query_start_loc[b]:query_start_loc[b+1]``. ``context_lens[b]`` is its total length *including* the new
    tokens, whose K/V must already be in the cache (``write_kv`` first). New token i of request b sits at
    position ``context_lens[b] - q_len_b + i`` and attends to every position up to and including its own.

    Returns ``out`` (a new ``[T, Hq, D]`` tensor unless one is passed). Requests are attended in chunks,
    each padded to its longest query and context; a chunk is cut where padding would waste much work.
    ``plan`` is :func:`plan_prefill` of the same step (built here when not given).
    """
    if plan is None:
        plan = plan_prefill(
            block_tables,
            query_start_loc,
            context_lens,
            k_cache.shape[1],
            k_cache.shape[2] * k_cache.shape[3],
            query.shape[1],
        )
    if plan.num_tokens != query.shape[0]:
        raise ValueError(f"the plan covers {plan.num_tokens} tokens, the query {query.shape[0]}")
    result = out if out is not None else torch.empty_like(query)
    for chunk in plan.chunks:
        q = query[chunk.query_index].view(chunk.count, chunk.max_query_len, *query.shape[1:]).transpose(1, 2)
        keys = _gather(k_cache, chunk.block_index, chunk.count)
        values = _gather(v_cache, chunk.block_index, chunk.count)
        attended = _attention(q, keys, values, chunk.visible, scale).transpose(1, 2)  # [n, Qmax, Hq, D]
        result[chunk.output_index] = attended[chunk.query_valid].to(result.dtype)
    return result


def _prefill_chunks(q_lens: list[int], lens: list[int], num_heads: int, kv_row: int) -> list[tuple[int, int]]:
    """Group consecutive requests whose padded scores and gathered K stay small and mostly real work."""
    runs, first, max_q, max_len, real = [], 0, 0, 0, 0
    for b, (q_len, length) in enumerate(zip(q_lens, lens, strict=True)):
        grown_q, grown_len, grown_real = max(max_q, q_len), max(max_len, length), real + q_len * length
        padded = (b + 1 - first) * grown_q * grown_len
        fits = (
            padded * num_heads * 4 <= _CHUNK_BYTES
            and (b + 1 - first) * grown_len * kv_row * 4 <= _CHUNK_BYTES
            and padded <= _PREFILL_MAX_WASTE * grown_real + _PREFILL_WASTE_SLACK
        )
        if b > first and not fits:
            runs.append((first, b))
            first, grown_q, grown_len, grown_real = b, q_len, length, q_len * length
        max_q, max_len, real = grown_q, grown_len, grown_real
    if first < len(lens):
        runs.append((first, len(lens)))
    return runs


def copy_blocks(
    k_caches: list[torch.Tensor],
    v_caches: list[torch.Tensor],
    src_blocks: torch.Tensor,
    dst_blocks: torch.Tensor,
) -> None:
    """Copy block ``src_blocks[i]`` onto ``dst_blocks[i]`` in every layer's K and V cache (copy-on-write).

    All sources are read before any destination is written.
    """
    src = src_blocks.long()
    dst = dst_blocks.long()
    for k_cache, v_cache in zip(k_caches, v_caches, strict=True):
        k_cache[dst] = k_cache[src]
        v_cache[dst] = v_cache[src]
