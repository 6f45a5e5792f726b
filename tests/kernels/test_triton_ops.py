"""Every Triton kernel against the torch reference (interpreted on CPU, compiled on a GPU)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from kv_cases import make_case, poisoned_like, query_start_loc, rel_error  # noqa: E402

from kvbench.kernels import reference, triton_ops  # noqa: E402

LENS = [1, 15, 16, 17, 300]  # one batch; lengths around a block edge and one long context
Q_LENS = [1, 15, 5, 17, 33]  # prefill: fresh prompts, and chunks over a cached prefix
SCALE = 0.21
HEAD_DIM = 16


def _decode_inputs(block_size: int, group: int, num_kv_heads: int, device: torch.device, seed: int = 0):
    case = make_case(LENS, block_size, num_kv_heads, HEAD_DIM, seed=seed, device=device)
    gen = torch.Generator().manual_seed(seed + 1)
    query = torch.randn(len(LENS), num_kv_heads * group, HEAD_DIM, generator=gen).to(device)
    expected = reference.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE
    )
    return case, query, expected


@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_decode_matches_reference(device: torch.device, block_size: int, group: int) -> None:
    case, query, expected = _decode_inputs(block_size, group, num_kv_heads=2 if group < 8 else 1, device=device)
    out = poisoned_like(query)
    result = triton_ops.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE, out=out, num_splits=1
    )
    assert result is out
    assert rel_error(out, expected) < 1e-5


@pytest.mark.parametrize(("block_size", "group", "num_splits"), [(1, 4, 2), (16, 1, 3), (32, 8, 5), (8, 4, 12)])
def test_split_kv_decode_matches_reference(device: torch.device, block_size: int, group: int, num_splits: int) -> None:
    """Forced partitions, including more partitions than the short requests have tiles (empty ones)."""
    case, query, expected = _decode_inputs(block_size, group, num_kv_heads=1, device=device, seed=block_size)
    out = poisoned_like(query)
    triton_ops.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE, out=out,
        num_splits=num_splits, block_n=16,
    )  # fmt: skip
    assert rel_error(out, expected) < 1e-5


def test_auto_split_for_small_batch_long_context(device: torch.device) -> None:
    lens = [600]
    case = make_case(lens, 16, 1, HEAD_DIM, seed=7, device=device)
    query = torch.randn(1, 4, HEAD_DIM, generator=torch.Generator().manual_seed(8)).to(device)
    assert triton_ops.choose_num_splits(1, 1, 600, query.device) > 1
    expected = reference.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE
    )
    out = poisoned_like(query)
    triton_ops.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE, out=out
    )
    assert rel_error(out, expected) < 1e-5


def test_choose_num_splits() -> None:
    gpu = torch.device("cpu")  # the heuristic pretends to have 132 multiprocessors off-GPU
    assert triton_ops.choose_num_splits(64, 40, 2048, gpu) == 1  # 2560 programs fill the GPU
    assert triton_ops.choose_num_splits(1, 40, 300, gpu) == 1  # too short to split
    assert triton_ops.choose_num_splits(1, 40, 4096, gpu) == 7  # 40 programs -> ~264
    assert triton_ops.choose_num_splits(1, 1, 1 << 20, gpu) == triton_ops.MAX_SPLITS


def test_decode_empty_context_and_noncontiguous_query(device: torch.device) -> None:
    case = make_case([0, 37], 8, 2, HEAD_DIM, seed=3, device=device)
    qkv = torch.randn(2, 4 + 2 * 2, HEAD_DIM, generator=torch.Generator().manual_seed(4)).to(device)
    query = qkv[:, :4]  # a view into a fused projection, as the model runner passes it
    expected = reference.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE
    )
    for splits in (1, 2):
        out = poisoned_like(query)
        triton_ops.paged_decode_attention(
            query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE, out=out, num_splits=splits
        )
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        assert rel_error(out, expected) < 1e-5


@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_prefill_matches_reference(device: torch.device, block_size: int, group: int) -> None:
    num_kv_heads = 2 if group == 1 else 1
    case = make_case(LENS, block_size, num_kv_heads, HEAD_DIM, seed=block_size + group, device=device)
    gen = torch.Generator().manual_seed(group)
    query = torch.randn(sum(Q_LENS), num_kv_heads * group, HEAD_DIM, generator=gen).to(device)
    starts = query_start_loc(Q_LENS, device)
    expected = reference.paged_prefill_attention(
        query, case.k_cache, case.v_cache, case.block_tables, starts, case.context_lens, SCALE
    )
    out = poisoned_like(query)
    result = triton_ops.paged_prefill_attention(
        query, case.k_cache, case.v_cache, case.block_tables, starts, case.context_lens, SCALE, out=out,
        block_m=64, block_n=64,
    )  # fmt: skip
    assert result is out
    assert rel_error(out, expected) < 1e-5


def test_decode_fp16(device: torch.device) -> None:
    case = make_case([5, 40, 77], 16, 2, 32, seed=11, dtype=torch.float16, device=device)
    query = torch.randn(3, 8, 32, generator=torch.Generator().manual_seed(12)).to(device, torch.float16)
    expected = reference.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE
    )
    out = poisoned_like(query)
    triton_ops.paged_decode_attention(
        query, case.k_cache, case.v_cache, case.block_tables, case.context_lens, SCALE, out=out
    )
    assert rel_error(out, expected) < 5e-3


@pytest.mark.parametrize(("cache_dtype", "tile"), [(torch.float32, 2048), (torch.float16, 2048), (torch.float32, 16)])
def test_write_kv_matches_reference_and_leaves_other_slots(
    device: torch.device, monkeypatch: pytest.MonkeyPatch, cache_dtype: torch.dtype, tile: int
) -> None:
    monkeypatch.setattr(triton_ops, "WRITE_KV_ELEMENTS", tile)  # 16: one KV head per program
    gen = torch.Generator().manual_seed(0)
    shape = (5, 8, 2, HEAD_DIM)
    k_cache = torch.randn(shape, generator=gen).to(device, cache_dtype)
    v_cache = torch.randn(shape, generator=gen).to(device, cache_dtype)
    slots = torch.tensor([39, -1, 0, 17, 8, -1, 22], dtype=torch.int64, device=device)
    key = torch.randn(7, 2, HEAD_DIM, generator=gen).to(device)
    value = torch.randn(7, 2, HEAD_DIM, generator=gen).to(device)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    reference.write_kv(key, value, expected_k, expected_v, slots)
    triton_ops.write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k)  # the written slots, and every other slot untouched
    assert torch.equal(v_cache, expected_v)


def test_write_kv_int32_slots_and_strided_inputs(device: torch.device) -> None:
    gen = torch.Generator().manual_seed(1)
    k_cache = torch.randn(4, 1, 3, HEAD_DIM, generator=gen).to(device)
    v_cache = torch.randn(4, 1, 3, HEAD_DIM, generator=gen).to(device)
    fused = torch.randn(3, 9, HEAD_DIM, generator=gen).to(device)
    key, value = fused[:, 3:6], fused[:, 6:9]
    slots = torch.tensor([2, 0, -1], dtype=torch.int32, device=device)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    reference.write_kv(key, value, expected_k, expected_v, slots)
    triton_ops.write_kv(key, value, k_cache, v_cache, slots)
    assert torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_copy_blocks_many_pairs_over_layers(device: torch.device, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(2)
    shape = (10, 16, 2, 32)  # 1024 elements per block: several chunks would be needed with a small chunk
    k_caches = [torch.randn(shape, generator=gen).to(device, dtype) for _ in range(3)]
    v_caches = [torch.randn(shape, generator=gen).to(device, dtype) for _ in range(3)]
    expected_k = [c.clone() for c in k_caches]
    expected_v = [c.clone() for c in v_caches]
    src = torch.tensor([0, 4, 4, 9], device=device)
    dst = torch.tensor([7, 1, 2, 5], device=device)
    reference.copy_blocks(expected_k, expected_v, src, dst)
    triton_ops.copy_blocks(k_caches, v_caches, src, dst)
    for actual, expected in zip(k_caches + v_caches, expected_k + expected_v, strict=True):
        assert torch.equal(actual, expected)


def test_copy_blocks_spans_chunks(device: torch.device, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(triton_ops, "COPY_CHUNK", 64)  # 3 chunks per 136-element block, the last one partial
    caches = [torch.randn(6, 17, 1, 8, generator=torch.Generator().manual_seed(i)).to(device) for i in range(4)]
    expected = [c.clone() for c in caches]
    src, dst = torch.tensor([1, 3], device=device), torch.tensor([4, 0], device=device)
    reference.copy_blocks(expected[:2], expected[2:], src, dst)
    triton_ops.copy_blocks(caches[:2], caches[2:], src, dst)
    assert all(torch.equal(a, b) for a, b in zip(caches, expected, strict=True))


def test_copy_blocks_rejects_mixed_caches(device: torch.device) -> None:
    caches = [torch.zeros(4, 2, 1, 8, device=device), torch.zeros(4, 2, 1, 16, device=device)]
    with pytest.raises(ValueError, match="one shape"):
        triton_ops.copy_blocks(caches[:1], caches[1:], torch.tensor([0]), torch.tensor([1]))
