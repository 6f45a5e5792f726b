"""Plain torch reference implementations of the KV ops. They run on any device and define the contract.

Cache layout (one layer): ``k_cache`` and ``v_cache`` are ``[num_blocks, block_size, num_kv_heads, head_dim]``.
A token's *slot* is ``block_id * block_size + offset``. A request's *block table* row lists its block ids in
order; unused entries may hold any value (they are never read for positions ``>= context_len``).

Query head ``h`` reads KV head ``h // (num_heads // num_kv_heads)`` (grouped-query attention). Scores, softmax
and the weighted sum are computed in float32 and cast back to the query's dtype. A request with context
length 0 gets a zero output.

The attention ops are vectorised over the batch (they are the CPU engine's hot path): the blocks of every
request are gathered into one tensor padded to the longest context, and padding is masked out of the softmax.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Work on the batch in chunks whose gathered K (as float32) stays under this many bytes: large temporaries
# are slow to allocate (page faults) and fall out of cache.
_CHUNK_BYTES = 4 << 20
# Prefill pads a chunk of requests to its longest query and context only while that at most multiplies
# the real work by this factor (plus a little slack); otherwise the chunk is cut.
_PREFILL_MAX_WASTE = 1.25
_PREFILL_WASTE_SLACK = 1 << 14


def write_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Scatter ``key``/``value`` ``[T, Hkv, D]`` into the caches at ``slot_mapping[T]``; slot ``-1`` is skipped."""
    num_blocks, block_size, num_kv_heads, head_dim = k_cache.shape
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_flat = k_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    v_flat = v_cache.view(num_blocks * block_size, num_kv_heads, head_dim)
    k_flat[slots] = key[keep].to(k_cache.dtype)
    v_flat[slots] = value[keep].to(v_cache.dtype)


def gather_context(cache: torch.Tensor, block_table_row: torch.Tensor, context_len: int) -> torch.Tensor:
    """The first ``context_len`` token states of one request, ``[context_len, Hkv, D]``."""
    block_size = cache.shape[1]
    num_blocks = (context_len + block_size - 1) // block_size
    blocks = cache[block_table_row[:num_blocks].long()]
    return blocks.reshape(-1, cache.shape[2], cache.shape[3])[:context_len]


def _block_index(
    block_tables: torch.Tensor, context_lens: torch.Tensor, block_size: int, max_len: int
) -> torch.Tensor:
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

    ``q [B, Hq, M, D]``, ``keys``/``values [B, L, Hkv, D]``, ``visible`` boolean, broadcastable to
    ``[B, Hq, M, L]``; every row must see at least one key. Returns ``[B, Hq, M, D]`` float32.
    """
    q = q.float()
    k = keys.transpose(1, 2).float()  # [B, Hkv, L, D]: a view when the cache is float32
    v = values.transpose(1, 2).float()
    if q.shape[1] == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)
    try:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale, enable_gqa=True)
    except TypeError:  # torch < 2.5 has no enable_gqa
        group = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, scale=scale)


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per request: ``query [B, Hq, D]`` over its ``context_lens[b]`` cached tokens.

    Returns ``out`` (a new ``[B, Hq, D]`` tensor unless one is passed).
    """
    batch, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    result = out if out is not None else torch.empty_like(query)
    lens = context_lens.to(device=query.device, dtype=torch.long)
    lens_list = lens.tolist()
    max_len = max(lens_list, default=0)
    step = max(1, _CHUNK_BYTES // (max(max_len, 1) * num_kv_heads * head_dim * 4))
    for start in range(0, batch, step):
        end = min(start + step, batch)
        chunk_lens = lens[start:end]
        index = _block_index(block_tables[start:end], chunk_lens, k_cache.shape[1], max(lens_list[start:end]))
        keys = _gather(k_cache, index, end - start)
        values = _gather(v_cache, index, end - start)
        visible = torch.arange(keys.shape[1], device=query.device)[None, :] < chunk_lens.clamp(min=1)[:, None]
        attended = _attention(query[start:end, :, None, :], keys, values, visible[:, None, None, :], scale)[:, :, 0]
        if min(lens_list[start:end]) == 0:  # an empty context attends to nothing: zeros
            attended.masked_fill_((chunk_lens == 0)[:, None, None], 0.0)
        result[start:end] = attended
    return result


def paged_prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal attention of new tokens over the cached context plus themselves.

    ``query [T, Hq, D]`` packs the new tokens of B requests; request b owns rows
    ``query_start_loc[b]:query_start_loc[b+1]``. ``context_lens[b]`` is its total length *including* the new
    tokens, whose K/V must already be in the cache (``write_kv`` first). New token i of request b sits at
    position ``context_lens[b] - q_len_b + i`` and attends to every position up to and including its own.

    Returns ``out`` (a new ``[T, Hq, D]`` tensor unless one is passed). Requests are attended in chunks,
    each padded to its longest query and context; a chunk is cut where padding would waste much work.
    """
    result = out if out is not None else torch.empty_like(query)
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    q_lens = [starts[b + 1] - starts[b] for b in range(len(lens))]
    for first, last in _prefill_chunks(q_lens, lens, query.shape[1], k_cache.shape[2] * k_cache.shape[3]):
        if sum(q_lens[first:last]) > 0:
            _prefill_chunk(query, k_cache, v_cache, block_tables, starts, q_lens, lens, first, last, scale, result)
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


def _prefill_chunk(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    starts: list[int],
    q_lens: list[int],
    lens: list[int],
    first: int,
    last: int,
    scale: float,
    result: torch.Tensor,
) -> None:
    """Prefill of requests ``first:last`` padded to ``[n, Qmax]`` x ``[n, Lmax]`` under a causal mask."""
    device = query.device
    count, max_q, max_len = last - first, max(q_lens[first:last]), max(lens[first:last])
    lens_t = torch.tensor(lens[first:last], device=device)
    q_lens_t = torch.tensor(q_lens[first:last], device=device)
    row = torch.arange(max_q, device=device)
    q_valid = row[None, :] < q_lens_t[:, None]  # [n, Qmax]
    q_index = torch.tensor(starts[first:last], device=device)[:, None] + row[None, :]
    q_index = q_index.masked_fill_(~q_valid, 0)
    q = query[q_index.view(-1)].view(count, max_q, *query.shape[1:]).transpose(1, 2)  # [n, Hq, Qmax, D]
    index = _block_index(block_tables[first:last], lens_t, k_cache.shape[1], max_len)
    keys = _gather(k_cache, index, count)
    values = _gather(v_cache, index, count)
    q_pos = (lens_t - q_lens_t)[:, None] + row[None, :]  # padding rows see every key: no NaN
    visible = torch.arange(keys.shape[1], device=device)[None, None, :] <= q_pos[:, :, None]  # [n, Qmax, L]
    attended = _attention(q, keys, values, visible[:, None], scale).transpose(1, 2)  # [n, Qmax, Hq, D]
    result[q_index[q_valid]] = attended[q_valid].to(result.dtype)


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
