"""The process heap on a CPU engine: memory a step frees is kept for the next step, not handed back to the kernel.

glibc's malloc serves every block above 32 MiB with its own ``mmap`` and unmaps it on ``free``, and trims the heap's
top once enough of it is free. A prefill step's activations are such blocks, so every step, every layer, faults
its buffers in afresh and the kernel zeroes each page (the cost, measured: docs/CPU_RESULTS.md, "Why the CPU
choices are measured"; any benchmark compares the two with ``KVBENCH_KEEP_FREED_MEMORY=0``). What torch's CUDA
caching allocator does for a GPU, this does for the CPU heap: ``mallopt`` turns off ``mmap`` for large blocks and
heap trimming, so a freed block is reused by the next step.

It is done only where torch asks for its large blocks aligned to 2 MiB for transparent huge pages
(``THP_MEM_ALLOC_ENABLE=1``, which kvbench sets unless the user chose otherwise): glibc 2.36 reuses a freed block for
the next 2 MiB-aligned request of its size, but not for torch's 64-byte-aligned ones (each would take fresh heap, the
growth without the gain).

The cost is that the process keeps its peak heap (the largest step's activations) until it exits; kvbench measures
KV memory through its allocator, never the process's resident size, so no figure changes. Outside glibc (musl,
macOS) nothing is done. ``KVBENCH_KEEP_FREED_MEMORY=0`` leaves malloc as it is.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from dataclasses import dataclass

from kvbench import env_settings

ENV = "KVBENCH_KEEP_FREED_MEMORY"
THP_ENV = "THP_MEM_ALLOC_ENABLE"  # torch's: large CPU blocks aligned to 2 MiB for huge pages (set in kvbench/__init__)
# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
TRIM_NEVER = 2**31 - 1  # the largest value mallopt takes (an int): trim only past 2 GiB free at the top
_SETTINGS = (("M_MMAP_MAX", M_MMAP_MAX, 0), ("M_TRIM_THRESHOLD", M_TRIM_THRESHOLD, TRIM_NEVER))


@dataclass(frozen=True)
class HeapPolicy:
    """What :func:`keep_freed_memory` did to this process's malloc, and why."""

    kept: bool
    reason: str

    def describe(self) -> str:
        return f"CPU heap: {'freed memory kept for the next step' if self.kept else 'as malloc does'} ({self.reason})"


_applied: HeapPolicy | None = None


def keep_freed_memory() -> HeapPolicy:
    """Make glibc's malloc keep what the process frees (once per process; later calls return the first answer)."""
    global _applied
    if _applied is None:
        _applied = _apply()
    return _applied


def current() -> HeapPolicy | None:
    """The policy applied in this process, or None before any CPU runner was built."""
    return _applied


def _apply() -> HeapPolicy:
    if not env_settings.switch(ENV, True):
        return HeapPolicy(False, f"{ENV}=0")
    if os.environ.get(THP_ENV) != "1":
        return HeapPolicy(False, f"{THP_ENV} is not 1: torch's large blocks would not be reused")
    libc_name, _ = platform.libc_ver()
    if libc_name != "glibc":
        return HeapPolicy(False, f"not glibc ({libc_name or platform.system()})")
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    refused = [name for name, param, value in _SETTINGS if mallopt(param, value) != 1]  # 1: done
    if refused:
        return HeapPolicy(False, f"glibc refused mallopt({', '.join(refused)})")
    return HeapPolicy(True, "glibc: no mmap per large block, no heap trimming; peak heap held until exit")
