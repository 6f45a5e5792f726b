"""float32-accurate linear layers on Intel AMX, for weights that are exactly bfloat16 (the method: ``cpu_amx.c``).

Why: a decode step reads every weight once for a few dozen rows, so on a CPU its matmuls wait on memory, and a
prefill step's wait on float32 multiply-adds. Published checkpoints are stored in bfloat16; loaded as float32
their weights are still bfloat16 numbers, so a bfloat16 copy of them is exact and half the bytes. The kernel
multiplies that copy by the activations split into three bfloat16 terms on the AMX tile unit, with float32
sums: a float32 product (greedy tokens stay those of ``transformers`` in float32) at 3x the decode speed and 2x
the prefill speed of torch's float32 matmul on the 1.1B shape (``benchmarks/bench_linear_paths.py``). Whether it is
used at a row count is measured on the machine (:mod:`kvbench.cpu.cpu_choices`).

Used where the CPU has AMX and Linux grants it, the C kernels are built, the weight is float32 holding only
bfloat16 values, and ``KVBENCH_AMX`` is not ``0``. Anything else keeps the float32 path of
:mod:`kvbench.cpu.cpu_linear`. With torch on several threads, the output columns are shared among that many
threads (the kernel runs outside Python's lock).
"""

from __future__ import annotations

import ctypes
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypedDict

import torch

from kvbench import env_settings
from kvbench.kernels import cpu_native

ENV = "KVBENCH_AMX"
TILE = 32  # rows, columns and k of the packed blocks
ACTIVATION_CACHE_BYTES = 768 * 1024  # one block of the three activation terms, sized to stay in a core's L2
MAX_ROWS_PER_PASS = 1024  # a longer step goes through in passes of this many rows (scratch <= 3 x 1024 x k)
M_CHUNK = 64  # rows per block (with k up to 2,048 per block): the fastest of 64-512 rows x 256-2,048 k, measured
MIN_WEIGHT_ELEMENTS = 1 << 18  # smaller weights: the fixed costs outweigh the gain (measured on the tiny preset)


class _State(TypedDict, total=False):
    library: ctypes.CDLL  # the loaded library the AMX grant was asked of
    granted: bool  # whether the kernel got the AMX tiles
    pool: ThreadPoolExecutor
    pool_workers: int  # the pool's size


_state: _State = {}
_local = threading.local()


def available() -> bool:
    """Whether the AMX kernel can run here (checks once per process)."""
    return unavailable_reason() is None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False, or None."""
    if not env_settings.switch(ENV, True):
        return f"turned off by {ENV}=0"
    lib = cpu_native._load()
    if lib is None:
        return cpu_native.unavailable_reason()
    if _state.get("library") is not lib:  # asked once per loaded library: the grant lasts the process
        _state["library"], _state["granted"] = lib, bool(lib.kvbench_amx_init())
    if not _state["granted"]:
        return "no AMX bfloat16 tiles here (the CPU, the compiler's target or the kernel does not offer them)"
    return None


def exactly_bf16(weight: torch.Tensor) -> bool:
    """Whether every value of a float32 ``weight`` is a bfloat16 number (so a bfloat16 copy loses nothing): one
    pass in C that stops at the first value that is not, where the kernels are built."""
    if weight.dtype != torch.float32 or weight.device.type != "cpu":
        return False
    lib = cpu_native._load()
    if lib is not None and weight.is_contiguous():
        return bool(lib.kvbench_all_bf16(weight.data_ptr(), weight.numel()))
    return bool(torch.equal(weight.bfloat16().float(), weight))


def takes(weight: torch.Tensor) -> bool:
    """Whether :func:`pack` should take this weight: AMX available, float32 on the CPU, exactly bfloat16, large."""
    return (
        weight.device.type == "cpu"
        and weight.dim() == 2
        and weight.numel() >= MIN_WEIGHT_ELEMENTS
        and available()
        and exactly_bf16(weight)
    )


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


@dataclass(frozen=True)
class AmxWeight:
    """A linear weight ``[out, in]`` and its bfloat16 copy in the kernel's tile layout (use it through
    :func:`linear`)."""

    plain: torch.Tensor
    packed: torch.Tensor  # [n_pad/32, k_pad/32, 2, 16, 16, 2] bfloat16
    n_pad: int
    k_pad: int

    @property
    def shape(self) -> torch.Size:
        return self.plain.shape


def pack(weight: torch.Tensor) -> AmxWeight:
    """``weight`` with its bfloat16 copy laid out as the kernel reads it: for each 32 output columns, each 32 of
    k, two 16-column tiles whose rows hold consecutive k pairs (AMX's layout for the second operand)."""
    n, k = weight.shape
    n_pad, k_pad = _round_up(n, TILE), _round_up(k, TILE)
    padded = torch.zeros((n_pad, k_pad), dtype=torch.bfloat16)
    padded[:n, :k] = weight
    tiles = padded.view(n_pad // TILE, 2, 16, k_pad // TILE, 16, 2).permute(0, 3, 1, 4, 2, 5).contiguous()
    return AmxWeight(weight, tiles, n_pad, k_pad)


def packed_bytes(weight: torch.Tensor) -> int:
    """Bytes :func:`pack` adds for a weight of this shape."""
    n, k = weight.shape
    return _round_up(n, TILE) * _round_up(k, TILE) * 2


def _scratch(elements: int) -> torch.Tensor:
    """This thread's buffer for the activation terms, grown as needed and kept: a fresh one for every call of a
    prefill-sized step cost more in page faults than its matmul (measured)."""
    buffer: torch.Tensor | None = getattr(_local, "terms", None)
    if buffer is None or buffer.numel() < elements:
        buffer = torch.empty(elements, dtype=torch.bfloat16)
        _local.terms = buffer
    return buffer[:elements]


def _pool(workers: int) -> ThreadPoolExecutor:
    if _state.get("pool_workers") != workers:
        _state["pool"] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="kvbench-amx")
        _state["pool_workers"] = workers
    return _state["pool"]


def _multiply(x: torch.Tensor, weight: AmxWeight, out: torch.Tensor) -> None:
    """``out = x . weight^T`` for rows of a contiguous ``out``: split ``x`` into its terms, then the kernel, its
    column strips shared among torch's thread count."""
    lib = cpu_native._library()
    (m, k), n = x.shape, weight.shape[0]
    m_pad = _round_up(m, TILE)
    m_chunk = min(m_pad, M_CHUNK)
    k_chunk = max(TILE, min(weight.k_pad, ACTIVATION_CACHE_BYTES // (6 * m_chunk) // TILE * TILE))
    terms = _scratch(3 * m_pad * weight.k_pad)
    lib.kvbench_split3_bf16(x.data_ptr(), m, k, x.stride(0), terms.data_ptr(), m_pad, weight.k_pad)
    strips = weight.n_pad // TILE
    parts = max(1, min(torch.get_num_threads(), strips))
    bounds = [strips * i // parts for i in range(parts + 1)]
    strip_bytes = (weight.k_pad // TILE) * TILE * TILE * 2

    def run(first: int, last: int) -> None:
        lib.kvbench_amx_linear_f32(
            terms.data_ptr(),
            m_pad,
            weight.k_pad,
            weight.packed.data_ptr() + first * strip_bytes,
            (last - first) * TILE,
            out.data_ptr() + first * TILE * 4,
            m,
            min(n, last * TILE) - first * TILE,
            n,
            m_chunk,
            k_chunk,
        )

    helpers = [_pool(parts - 1).submit(run, bounds[i], bounds[i + 1]) for i in range(1, parts)] if parts > 1 else []
    run(bounds[0], bounds[1])
    for helper in helpers:
        helper.result()


def linear(x: torch.Tensor, weight: AmxWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight.plain, bias)`` for a float32 ``x [rows, in]``, computed on the AMX tiles."""
    if x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"the AMX linear takes float32 [rows, {weight.shape[1]}], got {x.dtype} {tuple(x.shape)}")
    reason = unavailable_reason()  # also what asks Linux for the tiles: without that, their first use kills us
    if reason is not None:
        raise RuntimeError(f"the AMX kernel cannot run here: {reason}")
    if x.stride(1) != 1:
        x = x.contiguous()
    m, n = x.shape[0], weight.shape[0]
    out = torch.empty((m, n), dtype=torch.float32)
    for first in range(0, m, MAX_ROWS_PER_PASS):  # bounded scratch memory, whatever the step's size
        rows = min(MAX_ROWS_PER_PASS, m - first)
        _multiply(x[first : first + rows], weight, out[first : first + rows])
    if bias is not None:
        out += bias
    return out
