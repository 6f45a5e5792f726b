"""kvbench's environment variables, each named and described once.

Every read goes through :func:`read`, which refuses a name not listed here, so no variable is read where it is
used without being documented: ``docs/COMMANDS.md`` lists the same table, and a test holds the two together.
They are for tests, benchmarks and A/B runs; a command's options are the way to set what a run measures.
"""

from __future__ import annotations

import os

from kvbench.errors import KvbenchError

VARIABLES: dict[str, str] = {
    "KVBENCH_REPORT": "0 (or off, false, no): runs skip report.html at their end; `kvbench report` builds it later",
    "KVBENCH_THREADS": "a thread count the automatic choice takes instead of measuring one at start-up",
    "KVBENCH_CACHE_DIR": "kvbench's private cache folder (built kernels, start-up measurements); default: the "
    "per-user cache folder",
    "KVBENCH_REMEASURE": "1: measure the CPU's start-up choices again instead of reading them from the cache",
    "KVBENCH_MATMUL": "forces one CPU matmul path for every weight: plain, oneDNN, bf16-weights, "
    "bf16-weights-stream, AMX, bf16-dot, bf16-dot-stream or packed",
    "KVBENCH_PACKED_WEIGHTS": "0: no packed weight copies (every CPU matmul on the plain weight)",
    "KVBENCH_BF16_WEIGHTS": "0: the AVX-512/AVX2 bfloat16-weight kernel is not offered",
    "KVBENCH_BF16_DOT": "0: the AVX-512 BF16 (vdpbf16ps) kernel is not offered",
    "KVBENCH_AMX": "0: the Intel AMX kernel is not offered",
    "KVBENCH_KEEP_FREED_MEMORY": "0: a CPU engine's freed activations go back to the system (as malloc does)",
    "KVBENCH_DECODE_PREFETCH": "forces the C decode attention's prefetch: off, or TOKENS:L1 / TOKENS:L2",
    "KVBENCH_NATIVE_KERNELS": "0: the torch reference instead of the C kernels on a CPU",
    "KVBENCH_CPU_ISA": "builds the C kernels for a narrower instruction set than this CPU's (avx2, avx512, ...)",
    "KVBENCH_KERNEL_BACKEND": "forces the KV ops' backend: torch, native or triton",
    "KVBENCH_DEBUG": "1: `kvbench serve`'s engine process prints a failed step's traceback",
}


ON_WORDS, OFF_WORDS = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


def switch(name: str, default: bool) -> bool:
    """An on/off variable (1/0, on/off, true/false, yes/no; unset or empty: ``default``); anything else is refused
    in one line naming it, never read as on."""
    value = read(name)
    if value is None:
        return default
    text = value.strip().lower()
    if text in ON_WORDS or text in OFF_WORDS:
        return text in ON_WORDS
    raise KvbenchError(f"{name}={value[:40]!r} is neither on nor off; set it to 1 or 0 (or unset it)")


def read(name: str, default: str | None = None) -> str | None:
    """The variable's value (``default`` when unset or empty: ``NAME= kvbench ...`` unsets it, as shells mean it);
    a name not in :data:`VARIABLES` is a programming error."""
    if name not in VARIABLES:
        raise KeyError(f"{name} is not one of kvbench's environment variables (kvbench/env_settings.py)")
    value = os.environ.get(name)
    return default if value is None or not value.strip() else value
