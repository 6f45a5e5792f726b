"""A server's resident prefix-cache blocks rebuilt from its KV events, and what they say about eviction.

A block is resident from the event that stores it to the one that removes it (or clears everything). From the
sequence of events: the resident count over time, each removed block's lifetime, eviction churn (blocks removed
per second), and thrash: the share of removed blocks stored again within ``window_s`` seconds, work the server
redid because it evicted too early. The re-store distance (seconds from a block's removal to its next store) is
the reuse a larger cache would have kept.

The events come as :class:`Change` tuples in the server's order, in the compact form the run directory keeps.
Joining a stream mid-way, a removal of a block never seen stored is counted apart (``removed_unknown``) and the
resident count is then a lower bound, which ``complete`` says.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from statistics import median
from typing import Any, Literal

from kvbench import json_input
from kvbench.fileio import json_text

DEFAULT_THRASH_WINDOW_S = 10.0
Key = int | str  # a block hash: an integer, or bytes written as hex
Kind = Literal["S", "R", "C"]  # stored, removed, all cleared


@dataclass(frozen=True, slots=True)
class Change:
    at_s: float  # when it was received (Unix seconds, our clock)
    kind: Kind
    hashes: tuple[Key, ...] = ()


@dataclass
class Residency:
    window_s: float
    complete: bool  # every event since the server started was seen: the resident count is exact
    series: list[tuple[float, int]] = field(default_factory=list)  # (time, resident blocks) after each change
    stored: int = 0  # block stores (a block stored again counts again)
    removed: int = 0
    removed_unknown: int = 0  # removals of blocks not seen stored (events before the listening began)
    cleared: int = 0  # resets
    stored_again: int = 0  # stores of a block removed earlier
    thrashed: int = 0  # of which within window_s of its removal
    lifetimes_s: list[float] = field(default_factory=list)  # removed blocks: from store to removal
    restore_gaps_s: list[float] = field(default_factory=list)  # from a removal to the next store of the block
    resident_end: int = 0
    resident_peak: int = 0
    duration_s: float = 0.0

    @property
    def churn_per_s(self) -> float | None:
        """Blocks removed per second of the listening."""
        return self.removed / self.duration_s if self.duration_s > 0 else None

    @property
    def thrash_share(self) -> float | None:
        """Share of the removed blocks stored again within ``window_s``; None when none was removed."""
        return self.thrashed / self.removed if self.removed else None

    def resident_at(self, at_s: float) -> int:
        """Resident blocks after the last change received at or before ``at_s`` (0 before the first)."""
        low, high = 0, len(self.series)
        while low < high:
            middle = (low + high) // 2
            if self.series[middle][0] <= at_s:
                low = middle + 1
            else:
                high = middle
        return self.series[low - 1][1] if low else 0

    def summary(self) -> dict[str, float | int | bool | None]:
        """The figures a point records (seconds and counts; None where nothing was measured)."""
        return {
            "kv_events_complete": self.complete,
            "kv_blocks_stored": self.stored,
            "kv_blocks_removed": self.removed,
            "kv_blocks_removed_unknown": self.removed_unknown,
            "kv_cache_resets": self.cleared,
            "kv_resident_blocks_end": self.resident_end,
            "kv_resident_blocks_peak": self.resident_peak,
            "kv_eviction_churn_per_s": self.churn_per_s,
            "kv_thrash_window_s": self.window_s,
            "kv_thrash_share": self.thrash_share,
            "kv_block_lifetime_median_s": median(self.lifetimes_s) if self.lifetimes_s else None,
            "kv_restore_gap_median_s": median(self.restore_gaps_s) if self.restore_gaps_s else None,
        }


class Tracker:
    """The resident set followed one change at a time (a live view applies changes as they arrive); the counts,
    lifetimes and thrash cover the changes applied with ``counted``."""

    def __init__(self, window_s: float, complete: bool) -> None:
        self.result = Residency(window_s, complete)
        self._resident: dict[Key, float] = {}  # hash -> when it was stored
        self._removed_at: dict[Key, float] = {}  # hash -> when it was last removed (not stored since)
        self.first: float | None = None  # the first and last counted change's time
        self.last: float | None = None

    def apply(self, change: Change, counted: bool = True) -> None:
        result, resident, removed_at, at = self.result, self._resident, self._removed_at, change.at_s
        if counted:
            self.first = at if self.first is None else self.first
            self.last = at
        if change.kind == "S":
            for key in change.hashes:
                if key in resident:
                    continue  # stored twice without a removal between: still one block
                resident[key] = at
                gone = removed_at.pop(key, None)
                if not counted:
                    continue
                result.stored += 1
                if gone is not None:
                    result.stored_again += 1
                    result.restore_gaps_s.append(at - gone)
                    if at - gone <= result.window_s:
                        result.thrashed += 1
        elif change.kind == "R":
            for key in change.hashes:
                since = resident.pop(key, None)
                if since is None:
                    result.removed_unknown += counted
                    continue
                removed_at[key] = at
                if counted:
                    result.removed += 1
                    result.lifetimes_s.append(at - since)
        else:
            result.cleared += counted
            resident.clear()
            removed_at.clear()  # a reset is asked for: what follows is not thrash
        result.series.append((at, len(resident)))
        result.resident_peak = max(result.resident_peak, len(resident))
        result.resident_end = len(resident)


def rebuild(
    changes: Iterable[Change],
    window_s: float,
    complete: bool,
    span_s: float | None = None,
    count_from_s: float = float("-inf"),
) -> Residency:
    """Replay ``changes`` in order. The counts, lifetimes and thrash cover the changes from ``count_from_s`` on
    (the resident set follows every change); ``span_s`` is the counted stretch's length (else from the first
    counted change to the last)."""
    tracker = Tracker(window_s, complete)
    for change in changes:
        tracker.apply(change, change.at_s >= count_from_s)
    result, first, last = tracker.result, tracker.first, tracker.last
    result.duration_s = span_s if span_s is not None else ((last - first) if first is not None and last else 0.0)
    return result


def change_rows(changes: Iterable[Change]) -> list[list]:
    """The compact JSON rows a run directory keeps: ``[time, kind, [hash, ...]]``."""
    return [[change.at_s, change.kind, list(change.hashes)] for change in changes]


def changes_from_rows(rows: Iterable[object]) -> list[Change]:
    """Rows read back; ValueError naming the first row that is not ``[time, "S"|"R"|"C", [hash, ...]]``."""
    out = []
    last = float("-inf")
    for index, row in enumerate(rows):
        if not (isinstance(row, list) and len(row) == 3 and isinstance(row[2], list)):
            raise ValueError(f"KV event row {index} is not [time, kind, hashes]")
        at, kind, hashes = row
        if isinstance(at, bool) or not isinstance(at, (int, float)) or not at == at or at < last:
            raise ValueError(f"KV event row {index}: its time is not a number at or after the one before")
        if kind not in ("S", "R", "C"):
            raise ValueError(f"KV event row {index}: kind {kind!r} is none of S, R, C")
        if any(isinstance(key, bool) or not isinstance(key, (int, str)) for key in hashes):
            raise ValueError(f"KV event row {index}: a block hash is neither an integer nor text")
        out.append(Change(float(at), kind, tuple(hashes)))
        last = at
    return out


FILE_KIND = "kvbench.kv_events"  # the first line of a run directory's kv-events file names it


def kv_events_text(figures: dict[str, Any], changes: Iterable[Change]) -> str:
    """A point's KV events as its run directory keeps them: a header line with the figures, then one row per
    change (``[time, kind, [hash, ...]]``)."""
    lines = [json_text({"kind": FILE_KIND, "figures": figures}, indent=None)]
    lines += [json_text(row, indent=None) for row in change_rows(changes)]
    return "\n".join(lines) + "\n"


def read_kv_events_text(text: str) -> tuple[dict[str, Any], list[Change]]:
    """The figures and changes of a kv-events file; ValueError with the reason when it is not one."""
    lines = [line for line in text.splitlines() if line.strip()]
    if not lines:
        raise ValueError("the KV events file is empty")
    try:
        header = json_input.loads(lines[0])
        rows = [json_input.loads(line) for line in lines[1:]]
    except (ValueError, UnicodeDecodeError) as err:
        raise ValueError(f"the KV events file is not JSON lines: {err}") from None
    if not isinstance(header, dict) or header.get("kind") != FILE_KIND or not isinstance(header.get("figures"), dict):
        raise ValueError(f"the first line does not name a {FILE_KIND} file")
    return header["figures"], changes_from_rows(rows)
