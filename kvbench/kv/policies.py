"""The names a KV configuration is made of, written once: managers, reservation policies, admission modes."""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.errors import KvbenchError

MANAGERS = ("paged", "contiguous")  # the two KV managers an engine can run
RESERVATION_POLICIES = ("max", "pow2", "oracle")  # what a contiguous slab reserves (see contiguous.py)
ADMISSION_MODES = ("queue", "reject")  # contiguous, when a reservation does not fit: wait, or answer OOM


def check_choice(value: str, allowed: Sequence[str], what: str) -> str:
    """``value`` if it is one of ``allowed``, else a one-line error naming ``what`` and the choices."""
    if value not in allowed:
        raise KvbenchError(f"unknown {what} {value!r}; choose one of {', '.join(allowed)}")
    return value
