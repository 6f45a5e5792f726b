"""The torch reference ops against contiguous SDPA, and their cache-editing contracts."""

from __future__ import annotations

import pytest
import torch
from kv_cases import decode_oracle, make_case, poisoned_like, prefill_oracle, query_start_loc, rel_error

from kvbench.kernels import reference

LENS = [1, 15, 16, 17, 300]
SCALE = 0.17


@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_matches_sdpa(block_size: int, group: int) -> None:
    case = make_case(LENS, block_size, num_kv_heads=2, head_dim=16, seed=block_size * 10 + group)
    query = torch.randn(len(LENS), 2 * group, 16, generator=torch.Generator().manual_seed(1))
    out = poisoned_like(query)
    result = reference.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE, out=out
    )
    assert result is out
    assert rel_error(out, decode_oracle(case, query, SCALE)) < 1e-5


@pytest.mark.parametrize("block_size", [1, 16])
@pytest.mark.parametrize("group", [1, 4])
def test_prefill_matches_causal_sdpa_with_cached_prefix(block_size: int, group: int) -> None:
    q_lens = [1, 15, 5, 17, 33]  # fresh prompts, and chunks over a cached prefix (16 - 5, 300 - 33)
    case = make_case(LENS, block_size, num_kv_heads=2, head_dim=16, seed=block_size + group)
    query = torch.randn(sum(q_lens), 2 * group, 16, generator=torch.Generator().manual_seed(2))
    out = poisoned_like(query)
    reference.paged_prefill_attention(
        query, case.k_cache, case.v_cache, case.block_tables, query_start_loc(q_lens), case.context_lens, SCALE,
        out=out,
    )  # fmt: skip
    assert rel_error(out, prefill_oracle(case, query, q_lens, SCALE)) < 1e-5


@pytest.mark.parametrize("chunk_bytes", [1, 1 << 12, 1 << 30])
def test_chunking_does_not_change_results(monkeypatch: pytest.MonkeyPatch, chunk_bytes: int) -> None:
    """One request per chunk, a few, or all at once: the same numbers."""
    monkeypatch.setattr(reference, "_CHUNK_BYTES", chunk_bytes)
    lens, q_lens = [40, 3, 64, 17, 9, 100], [40, 1, 8, 2, 9, 100]
    case = make_case(lens, 8, num_kv_heads=2, head_dim=16, seed=5)
    gen = torch.Generator().manual_seed(3)
    query = torch.randn(len(lens), 4, 16, generator=gen)
    decoded = reference.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE
    )
    assert rel_error(decoded, decode_oracle(case, query, SCALE)) < 1e-5
    chunk = torch.randn(sum(q_lens), 4, 16, generator=gen)
    filled = reference.paged_prefill_attention(
        chunk, case.k_cache, case.v_cache, case.block_tables, query_start_loc(q_lens), case.context_lens, SCALE
    )
    assert rel_error(filled, prefill_oracle(case, chunk, q_lens, SCALE)) < 1e-5


def test_prefill_skips_requests_without_new_tokens() -> None:
    lens, q_lens = [20, 7, 30], [4, 0, 30]
    case = make_case(lens, 16, num_kv_heads=1, head_dim=16, seed=9)
    query = torch.randn(sum(q_lens), 2, 16, generator=torch.Generator().manual_seed(4))
    out = reference.paged_prefill_attention(
        query, case.k_cache, case.v_cache, case.block_tables, query_start_loc(q_lens), case.context_lens, SCALE
    )
    assert rel_error(out, prefill_oracle(case, query, q_lens, SCALE)) < 1e-5


def test_decode_empty_context_gives_zeros() -> None:
    case = make_case([0, 5], 4, num_kv_heads=1, head_dim=16, seed=1)
    query = torch.randn(2, 2, 16)
    out = reference.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE
    )
    assert torch.equal(out[0], torch.zeros_like(out[0]))
    assert rel_error(out[1:], decode_oracle(case, query, SCALE)[1:]) < 1e-5


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_caches_accumulate_in_float(dtype: torch.dtype) -> None:
    case = make_case([33, 70], 16, num_kv_heads=2, head_dim=32, seed=2, dtype=dtype)
    query = torch.randn(2, 4, 32).to(dtype)
    out = reference.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE
    )
    assert out.dtype == dtype
    tolerance = 1e-2 if dtype == torch.float16 else 2e-2
    assert rel_error(out, decode_oracle(case, query, SCALE)) < tolerance


def test_write_kv_touches_only_its_slots() -> None:
    gen = torch.Generator().manual_seed(0)
    k_cache, v_cache = torch.randn(6, 8, 2, 16, generator=gen), torch.randn(6, 8, 2, 16, generator=gen)
    before_k, before_v = k_cache.clone(), v_cache.clone()
    slots = torch.tensor([3, -1, 17, 47, 8])
    key, value = torch.randn(5, 2, 16, generator=gen), torch.randn(5, 2, 16, generator=gen)
    reference.write_kv(key, value, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(48, 2, 16), v_cache.view(48, 2, 16)
    written = [3, 17, 47, 8]
    assert torch.equal(flat_k[written], key[[0, 2, 3, 4]])
    assert torch.equal(flat_v[written], value[[0, 2, 3, 4]])
    untouched = [s for s in range(48) if s not in written]
    assert torch.equal(flat_k[untouched], before_k.view(48, 2, 16)[untouched])
    assert torch.equal(flat_v[untouched], before_v.view(48, 2, 16)[untouched])


def test_copy_blocks_copies_every_pair_in_every_layer() -> None:
    gen = torch.Generator().manual_seed(0)
    k_caches = [torch.randn(8, 4, 2, 16, generator=gen) for _ in range(3)]
    v_caches = [torch.randn(8, 4, 2, 16, generator=gen) for _ in range(3)]
    before = [c.clone() for c in k_caches + v_caches]
    src, dst = torch.tensor([0, 5, 2]), torch.tensor([7, 1, 3])
    reference.copy_blocks(k_caches, v_caches, src, dst)
    for cache, old in zip(k_caches + v_caches, before, strict=True):
        assert torch.equal(cache[dst], old[src])
        others = [b for b in range(8) if b not in dst.tolist()]
        assert torch.equal(cache[others], old[others])


def test_write_kv_unpadded_fast_path_equals_the_filtered_one() -> None:
    gen = torch.Generator().manual_seed(1)
    caches = [torch.randn(6, 8, 2, 16, generator=gen) for _ in range(2)]
    fast = [c.clone() for c in caches]
    slots = torch.tensor([3, 17, 47, 8])
    key, value = torch.randn(4, 2, 16, generator=gen), torch.randn(4, 2, 16, generator=gen)
    reference.write_kv(key, value, *caches, slots)
    reference.write_kv(key, value, *fast, slots, padded=False)
    assert all(torch.equal(a, b) for a, b in zip(caches, fast, strict=True))


@pytest.mark.parametrize("chunk_bytes", [1 << 10, 1 << 30])
def test_one_plan_serves_every_layer(monkeypatch: pytest.MonkeyPatch, chunk_bytes: int) -> None:
    """A plan built once per step gives each layer's caches the same result as planning inside the call."""
    monkeypatch.setattr(reference, "_CHUNK_BYTES", chunk_bytes)
    lens, q_lens = [40, 3, 64, 17], [40, 1, 8, 2]
    first = make_case(lens, 8, num_kv_heads=2, head_dim=16, seed=11)
    gen = torch.Generator().manual_seed(5)
    other_layer = (torch.randn(first.k_cache.shape, generator=gen), torch.randn(first.v_cache.shape, generator=gen))
    decode_plan = reference.plan_decode(first.block_tables, first.context_lens, 8, 2 * 16)
    assert len(decode_plan.chunks) == (1 if chunk_bytes > 1 << 20 else len(lens))
    starts = query_start_loc(q_lens)
    prefill_plan = reference.plan_prefill(first.block_tables, starts, first.context_lens, 8, 2 * 16, 8)
    for k_cache, v_cache in ((first.k_cache, first.v_cache), other_layer):  # same tables, other contents
        query = torch.randn(len(lens), 8, 16, generator=gen)
        args = (k_cache, v_cache, first.block_tables, first.context_lens, SCALE)
        planned = reference.paged_decode_attention(query, *args, plan=decode_plan)
        assert torch.equal(planned, reference.paged_decode_attention(query, *args))
        chunk = torch.randn(sum(q_lens), 8, 16, generator=gen)
        prefill_args = (k_cache, v_cache, first.block_tables, starts, first.context_lens, SCALE)
        filled = reference.paged_prefill_attention(chunk, *prefill_args, plan=prefill_plan)
        assert torch.equal(filled, reference.paged_prefill_attention(chunk, *prefill_args))
    assert rel_error(planned, decode_oracle(first, query, SCALE)) > 1e-3  # the other layer's contents were read
    query = torch.randn(len(lens), 8, 16, generator=gen)
    planned = reference.paged_decode_attention(
        query, first.k_cache, first.v_cache, first.block_tables, first.context_lens, SCALE, plan=decode_plan
    )
    assert rel_error(planned, decode_oracle(first, query, SCALE)) < 1e-5


def test_a_plan_for_another_batch_is_refused() -> None:
    case = make_case([9, 30], 8, 1, 16, seed=1)
    plan = reference.plan_decode(case.block_tables[:1], case.context_lens[:1], 8, 16)
    with pytest.raises(ValueError, match="plan covers 1 requests"):
        reference.paged_decode_attention(
            torch.randn(2, 2, 16), case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE, plan=plan
        )


def test_decode_buckets_follow_the_sum_of_the_contexts():
    """Mixed lengths are attended in buckets of similar length: the gathered width follows each bucket's
    longest, and the output equals dense attention over each request's own context."""
    torch.manual_seed(0)
    block_size, heads, kv_heads, dim = 4, 4, 2, 8
    lens = [3, 200, 7, 190, 5, 1]
    blocks = sum(-(-n // block_size) for n in lens) + 1
    k_cache = torch.randn(blocks, block_size, kv_heads, dim)
    v_cache = torch.randn(blocks, block_size, kv_heads, dim)
    tables, start = [], 1
    width = max(-(-n // block_size) for n in lens)
    for n in lens:
        used = -(-n // block_size)
        tables.append(list(range(start, start + used)) + [0] * (width - used))
        start += used
    block_tables = torch.tensor(tables, dtype=torch.int32)
    context_lens = torch.tensor(lens, dtype=torch.int32)
    query = torch.randn(len(lens), heads, dim)
    plan = reference.plan_decode(block_tables, context_lens, block_size, kv_heads * dim, valid_tables=True)
    gathered = sum(chunk.block_index.numel() for chunk in plan.chunks) * block_size
    assert gathered <= 1.25 * sum(lens) + 2 * 256  # not len(lens) x the longest (1,200 slots)
    buckets = [set(c.rows.tolist()) if c.rows is not None else set(range(c.start, c.end)) for c in plan.chunks]
    assert len(buckets) > 1 and any({1, 3} <= bucket for bucket in buckets)  # the two long ones together
    bucketed = reference.paged_decode_attention(query, k_cache, v_cache, block_tables, context_lens, 0.3, plan=plan)
    for b, n in enumerate(lens):  # each row against dense attention over its own context
        keys = reference.gather_context(k_cache, block_tables[b], n)
        values = reference.gather_context(v_cache, block_tables[b], n)
        q = query[b].view(kv_heads, heads // kv_heads, dim)
        scores = torch.einsum("hgd,lhd->hgl", q, keys) * 0.3
        expected = torch.einsum("hgl,lhd->hgd", torch.softmax(scores, -1), values).reshape(heads, dim)
        torch.testing.assert_close(bucketed[b], expected, rtol=1e-5, atol=1e-5)
