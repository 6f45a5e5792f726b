"""A point's ``waste`` block, typed: how its KV pool divided, time-averaged, in % of the pool (they add up to 100).
The block is written by the accountant (:meth:`kvbench.kv.accounting.WasteAccountant.waste_pct`)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class WasteShares:
    token_state_pct: float | None = None  # slots holding token states already written
    reservation_pct: float | None = None  # held, and still to be written before the request ends
    internal_pct: float | None = None  # held, and never to be written (internal fragmentation)
    external_pct: float | None = None  # free, yet no extent large enough for the request waiting (external)
    free_pct: float | None = None

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
        return cls(
            data.get("token_state_pct"),
            data.get("reservation_pct"),
            data.get("internal_pct"),
            data.get("external_pct"),
            data.get("free_pct"),
        )


ShareOf = Callable[[WasteShares], float | None]  # one share read from the block: a table's column, a plot's bar
