"""This core's peak rates, measured (the probes: ``cpu_peak.c``): float32 multiply-adds, AVX-512 BF16's bfloat16
dot products where the build has them, and one thread's memory reads; and how much its caches hold.

Why: an engine's speed alone does not say how much faster it could go. With the rates a core cannot exceed, the
roofline (:mod:`kvbench.models.roofline`) bounds the time any engine needs for a workload, so a benchmark can say
how close each engine came and how far ahead of another one any engine could get on this machine.

The probes are timed at start-up (about a second), best of several runs: a busy neighbour makes a probe slower,
never faster, so the best run is the nearest to the peak. Where the CPU has AMX, whose tile units multiply faster
than any vector unit, no probe here bounds a matmul: :func:`measure` says so instead of returning rates.
"""

from __future__ import annotations

import ctypes
import math
import time
from dataclasses import dataclass
from pathlib import Path

from kvbench.kernels import cpu_native

PROBE_SECONDS = 0.02  # one timed run of a probe lasts about this long
RUNS = 5  # timed runs per probe; the fastest counts
READ_BUFFER_MIN = 256 << 20  # bytes: the read probe's buffer is at least this, and 4x every cache together
CPU_ROOT = Path("/sys/devices/system/cpu")


class PeakUnavailable(RuntimeError):
    """No peak rate can be measured here (no C kernels, or a CPU whose matmul units no probe covers)."""


@dataclass(frozen=True)
class Peaks:
    """One thread's peak rates on this core and the capacity of every cache of the machine together."""

    fma_flops: float  # float32 multiply-adds, floating-point operations per second (one thread)
    dot_bf16_flops: float | None  # vdpbf16ps bfloat16 products summed in float32; None: the build has none
    read_bytes: float  # bytes per second one thread reads from memory
    cache_bytes: int | None  # every data cache's capacity summed (None: unknown); what a run can keep between steps
    vector_bits: int  # the width the float32 probe ran at

    def matmul_flops(self, dtype: str) -> float:
        """The fastest a matmul in ``dtype`` (fp32 or bf16) can run on one thread: bfloat16 products on vdpbf16ps
        where the build has it, else float32 multiply-adds (what a bfloat16 matmul is widened to without it)."""
        if dtype == "bf16" and self.dot_bf16_flops is not None:
            return self.dot_bf16_flops
        if dtype in ("bf16", "fp32"):
            return self.fma_flops
        raise ValueError(f"no peak for dtype {dtype!r}")

    def describe(self, dtype: str) -> str:
        unit = "bfloat16 dot products (vdpbf16ps)" if dtype == "bf16" and self.dot_bf16_flops else "float32 FMA"
        cache = f"{self.cache_bytes / 2**20:.0f} MiB of cache" if self.cache_bytes else "cache size unknown"
        return (
            f"{self.matmul_flops(dtype) / 1e9:.0f} GFLOP/s {unit} ({self.vector_bits}-bit vectors), "
            f"{self.read_bytes / 1e9:.1f} GB/s memory reads, {cache} (one thread)"
        )


def _best_seconds(call, runs: int = RUNS) -> float:
    best = math.inf
    for _ in range(runs):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def _arithmetic_rate(probe) -> float | None:
    """FLOP/s of a probe ``(iterations, sink) -> flops`` (None: the build has no such instruction)."""
    sink = ctypes.c_float()
    if probe(1, ctypes.byref(sink)) < 0:
        return None
    iterations = 1 << 12
    while True:  # grow the run until it lasts long enough to time
        start = time.perf_counter()
        flops = probe(iterations, ctypes.byref(sink))
        if time.perf_counter() - start >= PROBE_SECONDS / 4 or iterations >= 1 << 40:
            break
        iterations *= 4
    return flops / _best_seconds(lambda: probe(iterations, ctypes.byref(sink)))


def _read_rate(lib: ctypes.CDLL, cache_bytes: int | None) -> float:
    import torch

    count = max(READ_BUFFER_MIN, 4 * (cache_bytes or 0)) // 4
    data = torch.ones(count, dtype=torch.float32)  # written: a never-written buffer reads the shared zero page
    sink = ctypes.c_float()
    read = lib.kvbench_read_sweep(data.data_ptr(), count, ctypes.byref(sink))
    if sink.value != float(read // 4):  # the sum of ones is the count read: the probe read what it says
        raise PeakUnavailable(f"the read probe summed {sink.value}, not {read // 4}")
    return read / _best_seconds(lambda: lib.kvbench_read_sweep(data.data_ptr(), count, ctypes.byref(sink)), runs=3)


def sysfs_size_bytes(text: str) -> int:
    """A cache size as sysfs writes it (``32K``, ``1024K``, ``32M``) in bytes; ValueError where it is not one."""
    text = text.strip()
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(text[:-1]) * units[text[-1]] if text and text[-1] in units else int(text)


def cache_bytes(root: Path = CPU_ROOT) -> int | None:
    """Every data or unified cache of the machine, each counted once (a shared L3 once, each core's L1 and L2),
    from sysfs; None where sysfs does not say."""
    seen: dict[tuple[str, str, str], int] = {}
    for index in root.glob("cpu[0-9]*/cache/index[0-9]*"):
        try:
            kind = (index / "type").read_text().strip()
            if kind == "Instruction":
                continue
            key = ((index / "level").read_text().strip(), kind, (index / "shared_cpu_list").read_text().strip())
            seen[key] = sysfs_size_bytes((index / "size").read_text())
        except (OSError, ValueError):
            return None
    return sum(seen.values()) or None


def has_amx() -> bool:
    return "amx_tile" in (cpu_native._cpu_flags() or set())


def measure() -> Peaks:
    """This core's peak rates, timed now (about a second); :class:`PeakUnavailable` where none can be."""
    if has_amx():
        raise PeakUnavailable("this CPU has AMX, whose tile units no probe here measures")
    lib = cpu_native._load()
    if lib is None:
        raise PeakUnavailable(f"no C kernels: {cpu_native.unavailable_reason()}")
    fma = _arithmetic_rate(lib.kvbench_peak_fma)
    if fma is None:
        raise PeakUnavailable("the float32 probe did not run")
    caches = cache_bytes()
    dot = _arithmetic_rate(lib.kvbench_peak_dpbf16)
    return Peaks(fma, dot, _read_rate(lib, caches), caches, lib.kvbench_peak_vector_bits())
