"""A point's ``waste`` block, typed: how its KV pool divided, time-averaged, in % of the pool (they add up to 100).
The block is written by the accountant (:meth:`kvbench.kv.accounting.WasteAccountant.waste_pct`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from kvbench.values import number


@dataclass(frozen=True)
class WasteShares:
    token_state_pct: float | None = None  # slots holding token states already written
    reservation_pct: float | None = None  # held, and still to be written before the request ends
    internal_pct: float | None = None  # held, and never to be written (internal fragmentation)
    external_pct: float | None = None  # free, yet no extent large enough for the request waiting (external)
    free_pct: float | None = None

    @property
    def free_share(self) -> float | None:
        """The free share in [0, 1]: the recorded one, else what the four held parts leave."""
        free = self.free_pct
        if free is None:
            held = (self.token_state_pct, self.reservation_pct, self.internal_pct, self.external_pct)
            if any(part is None for part in held):
                return None
            free = 100.0 - sum(part for part in held if part is not None)  # none is, after the check above
        return max(0.0, free) / 100.0

    def to_json(self) -> dict[str, Any]:
        return {
            "token_state_pct": self.token_state_pct,
            "reservation_pct": self.reservation_pct,
            "internal_pct": self.internal_pct,
            "external_pct": self.external_pct,
            "free_pct": self.free_pct,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WasteShares:
        """A share that is not a number (a hand-edited file) reads None: no rule or cell judges a guess."""
        return cls(
            number(data.get("token_state_pct")),
            number(data.get("reservation_pct")),
            number(data.get("internal_pct")),
            number(data.get("external_pct")),
            number(data.get("free_pct")),
        )


ShareOf = Callable[[WasteShares], float | None]  # one share read from the block: a table's column, a plot's bar
