"""Decode-attention benchmark: paged kernel vs contiguous SDPA of the same shapes, and achieved bandwidth.

Bytes moved by one decode step are counted as K and V read once plus the query read and the output written.
On CUDA each timed call follows an L2 flush and is timed with CUDA events; on CPU with ``perf_counter``.
Times are medians over ``reps`` calls after ``warmup`` calls.

The bandwidth is put beside a reference the device reaches. On CUDA: a 1 GiB copy (after the same L2 flush, so both
read HBM). On a CPU a reference measured once on a large copy is wrong: a point's K and V (tens of MB) stay largely
in the last-level cache between repeated calls, so the kernel "beat" the copy by 2-5x. So on a CPU each point's
reference is torch reading the same bytes (a sum over a tensor as large as the point's K, V, query and output),
timed the same way, warmed the same way: what reading that many bytes costs here, cache and all.
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kvbench.kernels import dispatch
from kvbench.results.decode_benchmark import DecodePoint

# (query heads, KV heads, head_dim) of models people benchmark paged attention with.
HEAD_SHAPES: dict[str, tuple[int, int, int]] = {
    "llama-2-13b": (40, 40, 128),
    "llama-2-7b": (32, 32, 128),
    "llama-3-8b": (32, 8, 128),
    "tiny": (4, 2, 16),
}
DTYPES: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32,
    "fp16": torch.float16, "float16": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}  # fmt: skip
_L2_FLUSH_BYTES = 256 << 20


@dataclass(frozen=True)
class DecodeShape:
    batch: int
    context: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int

    def bytes_moved(self, element_size: int) -> int:
        """K and V read once, plus the query read and the output written."""
        kv = 2 * self.batch * self.context * self.num_kv_heads * self.head_dim
        q_and_out = 2 * self.batch * self.num_heads * self.head_dim
        return (kv + q_and_out) * element_size

    def bytes_needed(self, element_size: int) -> int:
        """Rough footprint of one benchmark point: paged caches, contiguous copies and slack."""
        return int(2.5 * 2 * self.batch * self.context * self.num_kv_heads * self.head_dim * element_size)


@dataclass
class DecodeInputs:
    query: torch.Tensor  # [B, Hq, D]
    k_cache: torch.Tensor  # [num_blocks, block_size, Hkv, D]
    v_cache: torch.Tensor
    block_tables: torch.Tensor  # [B, blocks per request] int32, blocks shuffled over the pool
    context_lens: torch.Tensor  # [B] int32
    q_sdpa: torch.Tensor  # [B, Hq, 1, D]
    k_contiguous: torch.Tensor  # [B, Hkv, context, D]
    v_contiguous: torch.Tensor


def build_inputs(shape: DecodeShape, dtype: torch.dtype, device: torch.device, seed: int = 0) -> DecodeInputs:
    """Random caches whose blocks are handed out in shuffled order (a fragmented pool), and the contiguous
    tensors a non-paged kernel would read for the same shapes."""
    gen = torch.Generator(device=device).manual_seed(seed)
    per_request = math.ceil(shape.context / shape.block_size)
    num_blocks = shape.batch * per_request
    cache_shape = (num_blocks, shape.block_size, shape.num_kv_heads, shape.head_dim)
    k_cache = torch.randn(cache_shape, generator=gen, device=device, dtype=dtype)
    v_cache = torch.randn(cache_shape, generator=gen, device=device, dtype=dtype)
    tables = torch.randperm(num_blocks, generator=gen, device=device).to(torch.int32).view(shape.batch, per_request)
    lens = torch.full((shape.batch,), shape.context, dtype=torch.int32, device=device)
    query = torch.randn(shape.batch, shape.num_heads, shape.head_dim, generator=gen, device=device, dtype=dtype)
    contiguous = (shape.batch, shape.num_kv_heads, shape.context, shape.head_dim)
    k_contiguous = torch.randn(contiguous, generator=gen, device=device, dtype=dtype)
    v_contiguous = torch.randn(contiguous, generator=gen, device=device, dtype=dtype)
    return DecodeInputs(query, k_cache, v_cache, tables, lens, query[:, :, None, :], k_contiguous, v_contiguous)


def sdpa_decode(inputs: DecodeInputs, scale: float) -> torch.Tensor:
    """Contiguous decode attention with PyTorch's fused SDPA (grouped-query heads without copying K/V)."""
    q, k, v = inputs.q_sdpa, inputs.k_contiguous, inputs.v_contiguous
    if q.shape[1] == k.shape[1]:
        return F.scaled_dot_product_attention(q, k, v, scale=scale)
    return F.scaled_dot_product_attention(q, k, v, scale=scale, enable_gqa=True)


def time_ms(fn: Callable[[], object], device: torch.device, warmup: int, reps: int) -> float:
    """Median milliseconds of ``fn`` over ``reps`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    if device.type != "cuda":
        samples = []
        for _ in range(reps):
            began = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - began) * 1e3)
        return statistics.median(samples)
    flush = torch.empty(_L2_FLUSH_BYTES, dtype=torch.int8, device=device)
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
    torch.cuda.synchronize(device)
    for start, end in events:
        flush.zero_()  # evict the previous call's K/V from L2 so every call reads HBM
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize(device)
    return statistics.median(start.elapsed_time(end) for start, end in events)


def copy_bandwidth_gbps(device: torch.device, nbytes: int | None = None, reps: int = 10) -> float:
    """Measured device copy bandwidth: bytes read plus bytes written per second by a large tensor copy."""
    nbytes = nbytes or ((1 << 30) if device.type == "cuda" else (64 << 20))
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.zeros_like(src)
    ms = time_ms(lambda: dst.copy_(src), device, warmup=2, reps=reps)
    return 2 * nbytes / (ms * 1e-3) / 1e9


def read_bandwidth_gbps(device: torch.device, nbytes: int, warmup: int, reps: int, threads: int | None = None) -> float:
    """GB/s of torch reading ``nbytes`` (a sum over a float32 tensor that large) on ``threads`` threads (None:
    torch's), timed like the kernels: the reference a CPU point is put beside (see the module's docstring)."""
    data = torch.ones(max(nbytes // 4, 1), dtype=torch.float32, device=device)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads or before)
        ms = time_ms(lambda: data.sum(), device, warmup=max(warmup, 1), reps=reps)
    finally:
        torch.set_num_threads(before)
    return data.numel() * 4 / (ms * 1e-3) / 1e9


def available_bytes(device: torch.device) -> int:
    """Memory the benchmark may still take on ``device``."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def run_decode_point(
    shape: DecodeShape,
    dtype: torch.dtype,
    device: torch.device,
    backend: str,
    *,
    warmup: int,
    reps: int,
    copy_gbps: float | None = None,
    num_splits: int | None = None,
    seed: int = 0,
) -> DecodePoint:
    """Time paged decode attention (``backend``) and contiguous SDPA at one shape."""
    element_size = torch.empty((), dtype=dtype).element_size()
    need, have = shape.bytes_needed(element_size), available_bytes(device)
    if need > 0.8 * have:
        return DecodePoint(
            shape.batch, shape.context, f"skipped: needs ~{need / 2**30:.1f} GiB, {have / 2**30:.1f} free"
        )
    inputs = build_inputs(shape, dtype, device, seed)
    scale = shape.head_dim**-0.5
    out = torch.empty_like(inputs.query)
    splits = None
    if backend == "triton":
        from kvbench.kernels import triton_ops

        splits = num_splits or triton_ops.choose_num_splits(shape.batch, shape.num_kv_heads, shape.context, device)

    def paged() -> None:
        dispatch.paged_decode_attention(
            inputs.query, inputs.k_cache, inputs.v_cache, inputs.block_tables, inputs.context_lens, scale, backend,
            out=out, num_splits=splits, max_context_len=shape.context,
        )  # fmt: skip

    paged_ms = time_ms(paged, device, warmup, reps)
    contiguous_ms = time_ms(lambda: sdpa_decode(inputs, scale), device, warmup, reps)
    moved = shape.bytes_moved(element_size)
    paged_gbps = moved / (paged_ms * 1e-3) / 1e9
    reference = None
    if device.type == "cpu":  # read at the kernel's thread count: the C kernel runs on one thread
        reference = read_bandwidth_gbps(device, moved, warmup, reps, threads=1 if backend == "native" else None)
    return DecodePoint(
        batch=shape.batch,
        context=shape.context,
        status="ok",
        paged_ms=paged_ms,
        contiguous_ms=contiguous_ms,
        paged_over_contiguous=paged_ms / contiguous_ms,
        paged_gbps=paged_gbps,
        contiguous_gbps=moved / (contiguous_ms * 1e-3) / 1e9,
        pct_of_copy_bandwidth=100 * paged_gbps / copy_gbps if copy_gbps else None,
        reference_gbps=reference,
        pct_of_read_bandwidth=100 * paged_gbps / reference if reference else None,
        num_splits=splits,
    )
