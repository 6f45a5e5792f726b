"""float32 linear layers over a bfloat16 copy of weights that are exactly bfloat16 (the method:
``cpu_bf16_weights.c``), for CPUs without AMX.

Why: a decode step reads every weight once for a few dozen rows, so on a CPU its matmuls wait on memory. Published
checkpoints are stored in bfloat16; loaded as float32 their weights are still bfloat16 numbers, so a bfloat16 copy
of them is exact and half the bytes. The kernel widens each weight back to float32 as it reads it and multiplies
with float32 multiply-adds: a float32 product (within float32's error bound; greedy tokens stay those of
``transformers`` in float32) that reads half of what oneDNN's float32 copy does. Where AMX is present,
:mod:`kvbench.kernels.cpu_amx` does more with the same copy; whether this kernel beats oneDNN's at a row count is
measured on the machine (:mod:`kvbench.cpu.cpu_choices`), not assumed: it wins where a step waits on memory
(decode) and may lose where it waits on arithmetic (long prefills).

Used where the C kernels are built, the weight is float32 holding only bfloat16 values, and ``KVBENCH_BF16_WEIGHTS``
is not ``0``. With torch on several threads, the output columns are shared among that many threads.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypedDict

import torch

from kvbench import env_settings
from kvbench.kernels import cpu_amx, cpu_native

ENV = "KVBENCH_BF16_WEIGHTS"
STRIP = 32  # output columns per packed strip
MIN_WEIGHT_ELEMENTS = 1 << 16  # smaller weights: the fixed costs outweigh the gain


class _PoolState(TypedDict, total=False):
    pool: ThreadPoolExecutor
    workers: int  # the pool's size


_pool_state: _PoolState = {}
_lock = threading.Lock()


def unavailable_reason() -> str | None:
    """Why the kernel cannot run here, or None."""
    if not env_settings.switch(ENV, True):
        return f"turned off by {ENV}=0"
    if cpu_native._load() is None:
        return cpu_native.unavailable_reason()
    return None


def available() -> bool:
    return unavailable_reason() is None


def takes(weight: torch.Tensor) -> bool:
    """Whether :func:`pack` should take this weight: available, a large float32 CPU matrix of bfloat16 values."""
    return (
        weight.device.type == "cpu"
        and weight.dim() == 2
        and weight.numel() >= MIN_WEIGHT_ELEMENTS
        and available()
        and cpu_amx.exactly_bf16(weight)
    )


@dataclass(frozen=True)
class Bf16Weight:
    """A linear weight ``[out, in]`` and its bfloat16 copy in the kernel's strip layout (use it through
    :func:`linear`)."""

    plain: torch.Tensor
    packed: torch.Tensor  # [n_pad / 32, k, 16, 2] bfloat16: each row of a strip as pairs (column c, column c + 16)
    stream: bool = False  # the tiles of a block share the prefetch of the weight's next chunk (cpu_bf16_weights.c)

    @property
    def shape(self) -> torch.Size:
        return self.plain.shape


def pack(weight: torch.Tensor, stream: bool = False) -> Bf16Weight:
    """``weight`` with its bfloat16 copy laid out as the kernel reads it: for each 32 output columns, the k rows of
    their 32 values, each row as 16 pairs (column c, column c + 16), zero past the last column. ``stream``: its
    products are streamed (the kernel's two ways of reading the weight; which is faster at which row count is
    measured, :mod:`kvbench.cpu.cpu_choices`)."""
    n, k = weight.shape
    n_pad = -(-n // STRIP) * STRIP
    padded = torch.zeros((n_pad, k), dtype=torch.bfloat16)
    padded[:n] = weight
    strips = padded.view(n_pad // STRIP, 2, STRIP // 2, k)  # [strip, half, c, k]: column 16 * half + c
    return Bf16Weight(weight, strips.permute(0, 3, 2, 1).contiguous(), stream)


def packed_bytes(weight: torch.Tensor) -> int:
    """Bytes :func:`pack` adds for a weight of this shape."""
    n, k = weight.shape
    return -(-n // STRIP) * STRIP * k * 2


def _pool(workers: int) -> ThreadPoolExecutor:
    with _lock:
        if _pool_state.get("workers") != workers:
            _pool_state["pool"] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvbench-bf16w")
            _pool_state["workers"] = workers
        return _pool_state["pool"]


def over_strips(run: Callable[[int, int], None], strips: int, rows: int) -> None:
    """``run(first, last)`` over the strips ``[0, strips)``, shared among torch's threads in disjoint ranges (the
    caller's thread takes the first); nothing runs for an empty step."""
    if not rows:
        return
    parts = max(1, min(torch.get_num_threads(), strips))
    bounds = [strips * i // parts for i in range(parts + 1)]
    helpers = [_pool(parts - 1).submit(run, bounds[i], bounds[i + 1]) for i in range(1, parts)] if parts > 1 else []
    run(bounds[0], bounds[1])
    for helper in helpers:
        helper.result()


def linear(x: torch.Tensor, weight: Bf16Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight.plain, bias)`` for a float32 ``x [rows, in]``, reading the bfloat16 copy."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"the bfloat16-weight linear takes float32 [rows, {weight.shape[1]}], got {x.dtype} {tuple(x.shape)}"
        )
    lib = cpu_native._library()
    if x.stride(1) != 1:
        x = x.contiguous()
    (m, k), n = x.shape, weight.shape[0]
    out = torch.empty((m, n), dtype=torch.float32)

    def run(first: int, last: int) -> None:
        lib.kvbench_linear_bf16w_f32(
            x.data_ptr(),
            m,
            k,
            x.stride(0),
            weight.packed.data_ptr(),
            first,
            last,
            n,
            out.data_ptr(),
            n,
            int(weight.stream),
        )

    over_strips(run, weight.packed.shape[0], m)
    if bias is not None:
        out += bias
    return out
