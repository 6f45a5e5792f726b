"""Random paged-KV test cases and the contiguous SDPA oracle the kernels are checked against."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

GARBAGE_BLOCK = 1 << 30  # fills unused block-table entries: a kernel that reads one faults or goes wrong


@dataclass
class PagedCase:
    """Caches with every request's tokens scattered over shuffled blocks, and the same tokens contiguous."""

    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, max_blocks] int32, unused entries = GARBAGE_BLOCK
    context_lens: torch.Tensor  # [B] int32
    keys: list[torch.Tensor]  # per request [L_b, Hkv, D]
    values: list[torch.Tensor]

    @property
    def block_size(self) -> int:
        return self.k_cache.shape[1]


def make_case(
    lens: list[int],
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    *,
    seed: int = 0,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    spare_blocks: int = 3,
) -> PagedCase:
    """Fresh random (never zero) caches; blocks handed out in a random order; a few blocks left unused."""
    gen = torch.Generator().manual_seed(seed)
    per_request = [(n + block_size - 1) // block_size for n in lens]
    num_blocks = sum(per_request) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    width = max(max(per_request, default=1), 1) + 1  # one garbage column even for the longest request
    tables = torch.full((len(lens), width), GARBAGE_BLOCK, dtype=torch.int32)
    keys, values = [], []
    for b, (n, count) in enumerate(zip(lens, per_request, strict=True)):
        blocks = [order.pop() for _ in range(count)]
        tables[b, :count] = torch.tensor(blocks, dtype=torch.int32)
        keys.append(k_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:n])
        values.append(v_cache[blocks].reshape(-1, num_kv_heads, head_dim)[:n])
    return PagedCase(
        k_cache.to(device), v_cache.to(device), tables.to(device),
        torch.tensor(lens, dtype=torch.int32, device=device),
        [k.to(device) for k in keys], [v.to(device) for v in values],
    )  # fmt: skip


def sdpa(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, q_offset: int) -> torch.Tensor:
    """``query [Q, Hq, D]`` over ``keys [L, Hkv, D]`` in float64 with SDPA; query i sees keys ``<= q_offset+i``."""
    group = query.shape[1] // keys.shape[1]
    q = query.double().transpose(0, 1)[None]  # [1, Hq, Q, D]
    k = keys.double().repeat_interleave(group, dim=1).transpose(0, 1)[None]
    v = values.double().repeat_interleave(group, dim=1).transpose(0, 1)[None]
    q_pos = torch.arange(query.shape[0], device=query.device)[:, None] + q_offset
    mask = torch.arange(keys.shape[0], device=query.device)[None, :] <= q_pos
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1)


def decode_oracle(case: PagedCase, query: torch.Tensor, scale: float) -> torch.Tensor:
    rows = []
    for b, keys in enumerate(case.keys):
        if keys.shape[0] == 0:
            rows.append(torch.zeros_like(query[b], dtype=torch.float64))
        else:
            rows.append(sdpa(query[b : b + 1], keys, case.values[b], scale, keys.shape[0] - 1)[0])
    return torch.stack(rows)


def prefill_oracle(case: PagedCase, query: torch.Tensor, q_lens: list[int], scale: float) -> torch.Tensor:
    rows, start = [], 0
    for b, q_len in enumerate(q_lens):
        n = case.keys[b].shape[0]
        rows.append(sdpa(query[start : start + q_len], case.keys[b], case.values[b], scale, n - q_len))
        start += q_len
    return torch.cat(rows)


def query_start_loc(q_lens: list[int], device: torch.device | str = "cpu") -> torch.Tensor:
    starts = [0]
    for n in q_lens:
        starts.append(starts[-1] + n)
    return torch.tensor(starts, dtype=torch.int32, device=device)


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Largest absolute difference relative to the largest expected magnitude; NaN anywhere fails."""
    actual, expected = actual.double(), expected.double()
    if torch.isnan(actual).any():
        return float("inf")
    return float((actual - expected).abs().max() / expected.abs().max().clamp(min=1e-30))


def poisoned_like(tensor: torch.Tensor) -> torch.Tensor:
    """An output buffer full of NaN, so an element a kernel forgets to write shows up."""
    return torch.full_like(tensor, float("nan"))
