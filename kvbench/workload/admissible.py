"""Requests that can never run: found before a run starts, counted and explained, never silently lost."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.errors import KvbenchError


@dataclass(frozen=True)
class Skipped:
    """Records left out of a run, and why."""

    count: int
    total: int
    reason: str

    def sentence(self, what: str) -> str:
        return f"{self.count} of {self.total} {what} skipped: {self.reason}"

    def as_dict(self) -> dict:
        return {"count": self.count, "total": self.total, "reason": self.reason}


def within_max_len(lengths: Sequence[tuple[int, int]], max_len: int, what: str) -> tuple[list[int], Skipped | None]:
    """Indices of the ``(prompt_len, output_len)`` records that fit ``max_len``, and what was left out.

    A request whose prompt plus output exceeds max-len is refused by every engine; running it would only
    produce a rejected request and a point without figures. When nothing is left, the run cannot start.
    """
    kept = [index for index, (prompt, output) in enumerate(lengths) if prompt + output <= max_len]
    dropped = len(lengths) - len(kept)
    if not kept:
        raise KvbenchError(
            f"every one of the {len(lengths)} {what} is longer than max-len {max_len} "
            "(prompt + output): nothing can run; raise max-len or use shorter requests"
        )
    if not dropped:
        return kept, None
    return kept, Skipped(dropped, len(lengths), f"prompt + output exceeds max-len {max_len}")
