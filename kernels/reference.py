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

# Work on the batch in chunks whose gathered K (as float32) stays under this many bytes: large temporaries
# are slow to allocate (page faults) and fall out of cache.
_CHUNK_BYTES = 4 << 20
# Prefill pads a chunk of requests to its longest query and context only while that at most multiplies
# the real work by this factor (plus a little slack); otherwise the chunk is cut.
_PREFILL_MAX_WASTE = 2.0
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


def gather_padded(
    cache: torch.Tensor, block_tables: torch.Tensor, context_lens: torch.Tensor, max_len: int
) -> torch.Tensor:
    """Every request's token states padded to ``max_len`` (rounded up to whole blocks): ``[B, L, Hkv, D]``.

    Block-table entries beyond a request's last needed block are never dereferenced (block 0 is read
    instead), so they may hold garbage; the caller masks positions ``>= context_lens[b]``.
    """
    num_blocks, block_size, num_kv_heads, head_dim = cache.shape
    batch = block_tables.shape[0]
    width = max((max_len + block_size - 1) // block_size, 1)
    table = block_tables[:, :width].long()
    needed = (context_lens.long() + block_size - 1) // block_size
    valid = torch.arange(width, device=table.device)[None, :] < needed[:, None]
    table = torch.where(valid, table, torch.zeros_like(table))
    return cache[table].view(batch, width * block_size, num_kv_heads, head_dim)


def _attend(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, causal_offset: int | None):
    """query ``[Q, Hq, D]``, keys/values ``[K, Hkv, D]``; query i sees keys ``<= causal_offset + i``."""
    num_heads, num_kv_heads = query.shape[1], keys.shape[1]
    group = num_heads // num_kv_heads
    keys = keys.repeat_interleave(group, dim=1).float()
    values = values.repeat_interleave(group, dim=1).float()
    scores = torch.einsum("qhd,khd->hqk", query.float(), keys) * scale
    if causal_offset is not None:
        q_pos = torch.arange(query.shape[0], device=query.device)[:, None] + causal_offset
        k_pos = torch.arange(keys.shape[0], device=query.device)[None, :]
        scores = scores.masked_fill(k_pos > q_pos, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.einsum("hqk,khd->qhd", probs, values).to(query.dtype)


def _masked_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor, scale: float):
    """Batched grouped attention in float32.

    ``q [B, Hkv, M, D]`` (``M`` = query rows of one KV head), ``keys``/``values [B, L, Hkv, D]``,
    ``visible`` broadcastable to ``[B, 1, M, L]``; every row must see at least one key. Returns ``[B, Hkv, M, D]``.
    """
    k = keys.float().transpose(1, 2)  # [B, Hkv, L, D]
    v = values.float().transpose(1, 2)
    scores = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
    scores.masked_fill_(~visible, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    return torch.matmul(probs, v)


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
    if batch == 0:
        return result
    lens = context_lens.to(query.device).long()
    max_len = int(lens.max())
    keys = gather_padded(k_cache, block_tables, lens, max_len)
    values = gather_padded(v_cache, block_tables, lens, max_len)
    q = query.float().view(batch, num_kv_heads, num_heads // num_kv_heads, head_dim)
    positions = torch.arange(keys.shape[1], device=query.device)
    visible = (positions[None, :] < lens.clamp(min=1)[:, None])[:, None, None, :]  # [B, 1, 1, L]
    attended = _masked_attention(q, keys, values, visible, scale).view(batch, num_heads, head_dim)
    if max_len == 0 or bool((lens == 0).any()):
        attended = attended.masked_fill((lens == 0)[:, None, None], 0.0)
    result.copy_(attended)
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

    Requests are attended all at once, padded to the longest query and context, unless the padding would
    cost much more than the real work; then one request at a time.
    """
    result = out if out is not None else torch.empty_like(query)
    starts = query_start_loc.tolist()
    lens = context_lens.tolist()
    q_lens = [starts[b + 1] - starts[b] for b in range(len(lens))]
    if not lens or sum(q_lens) == 0:
        return result
    num_heads = query.shape[1]
    padded = len(lens) * max(q_lens) * max(lens)
    real = sum(q * n for q, n in zip(q_lens, lens, strict=True))
    if padded * num_heads <= _PREFILL_PADDED_MAX_SCORES and padded <= _PREFILL_PADDED_MAX_WASTE * real + 4096:
        _prefill_padded(query, k_cache, v_cache, block_tables, starts, q_lens, lens, scale, result)
        return result
    for b, length in enumerate(lens):
        q = query[starts[b] : starts[b + 1]]
        if q.shape[0] == 0:
            continue
        keys = gather_context(k_cache, block_tables[b], length)
        values = gather_context(v_cache, block_tables[b], length)
        result[starts[b] : starts[b + 1]] = _attend(q, keys, values, scale, causal_offset=length - q.shape[0])
    return result


def _prefill_padded(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    starts: list[int],
    q_lens: list[int],
    lens: list[int],
    scale: float,
    result: torch.Tensor,
) -> None:
    """Prefill of all requests in one padded batch ``[B, Qmax]`` x ``[B, Lmax]`` with a causal/length mask."""
    device = query.device
    batch, max_q, max_len = len(lens), max(q_lens), max(lens)
    _, num_heads, head_dim = query.shape
    num_kv_heads = k_cache.shape[2]
    group = num_heads // num_kv_heads
    lens_t = torch.tensor(lens, device=device)
    q_lens_t = torch.tensor(q_lens, device=device)
    row = torch.arange(max_q, device=device)
    q_valid = row[None, :] < q_lens_t[:, None]  # [B, Qmax]
    q_index = torch.tensor(starts[:-1], device=device)[:, None] + row[None, :]
    q_index = torch.where(q_valid, q_index, torch.zeros_like(q_index))
    q = query[q_index].float()  # [B, Qmax, Hq, D]
    q = q.view(batch, max_q, num_kv_heads, group, head_dim).permute(0, 2, 1, 3, 4)
    q = q.reshape(batch, num_kv_heads, max_q * group, head_dim)  # rows ordered (token, group member)
    keys = gather_padded(k_cache, block_tables, lens_t, max_len)
    values = gather_padded(v_cache, block_tables, lens_t, max_len)
    q_pos = (lens_t - q_lens_t)[:, None] + row[None, :]  # [B, Qmax]
    k_pos = torch.arange(keys.shape[1], device=device)
    visible = k_pos[None, None, :] <= q_pos[:, :, None]  # [B, Qmax, L]; padding rows see keys too (no NaN)
    visible = visible.repeat_interleave(group, dim=1)[:, None]  # [B, 1, Qmax*G, L]
    attended = _masked_attention(q, keys, values, visible, scale)
    attended = attended.view(batch, num_kv_heads, max_q, group, head_dim).permute(0, 2, 1, 3, 4)
    attended = attended.reshape(batch, max_q, num_heads, head_dim)
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
