"""Waste accounting: how the KV pool divides into used / reserved / internal / external / free.

Definitions (docs/ARCHITECTURE.md), in token slots, for the live requests at a step:
  used      slots holding token states already written
  reserved  slots a live request holds and will still write before it finishes
  internal  slots a live request holds and will never write (beyond its final length)
  external  free slots that cannot serve the request at the head of the queue because no free extent is
            large enough although the free total is (0 when nothing waits; 0 for the paged manager)
  free      the rest
Shares are time-averaged over the run, weighted by step time, and tracked at peak.

Steps are fed in spans of ``k`` steps during which nothing but the written token count changes, so the
simulator can account thousands of steps in O(1): within a span, ``used_j = used0 + grow * j`` and the
step time is ``t_j = max(floor_s, base_s + per_used_s * used_j)`` (a roofline: the larger of a fixed compute
time and a memory time that grows with the KV read).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields
from typing import Generic, TypeVar

N = TypeVar("N", int, float)


@dataclass
class PoolParts(Generic[N]):
    """One figure per part of the pool (slot-seconds, peak slots, shares)."""

    used: N
    reserved: N
    internal: N
    external: N
    free: N

    @property
    def occupied(self) -> N:
        """Every part but the free one: what live requests hold or block."""
        return self.used + self.reserved + self.internal + self.external

    def as_dict(self) -> dict[str, N]:
        """By part name, in the order of :data:`PARTS`."""
        return asdict(self)


PARTS = tuple(f.name for f in fields(PoolParts))


def _sum_j(k: int) -> int:
    return k * (k - 1) // 2


def _sum_j2(k: int) -> int:
    return (k - 1) * k * (2 * k - 1) // 6


@dataclass
class WasteAccountant:
    pool_slots: int
    block_size: int
    keep_timeline: bool = True
    elapsed_s: float = 0.0
    steps: int = 0
    slot_seconds: PoolParts[float] = field(default_factory=lambda: PoolParts(0.0, 0.0, 0.0, 0.0, 0.0))
    peak: PoolParts[int] = field(default_factory=lambda: PoolParts(0, 0, 0, 0, 0))
    peak_allocated: int = 0
    peak_needed: int = 0  # peak of used + reserved: what slabs of exactly each real length would hold (hindsight)
    fragmentation_seconds: float = 0.0
    allocated_seconds: float = 0.0
    running_seconds: float = 0.0
    timeline: list[tuple[float, int, int]] = field(default_factory=list)  # (time s, blocks in use, used slots)

    def add_span(
        self,
        k: int,
        *,
        used0: int,
        grow: int,
        capped_held: int,
        internal: int,
        external: int,
        held: int,
        running: int,
        base_s: float,
        per_used_s: float = 0.0,
        floor_s: float = 0.0,
    ) -> float:
        """Account ``k`` steps; returns their total time in seconds.

        ``capped_held`` is the sum over live requests of min(held, final length): reserved = capped_held - used.
        ``held`` is the slots the live requests hold in all (used + reserved + internal).
        """
        if k <= 0:
            return 0.0
        # the first `split` steps run at the fixed floor, the rest at the growing memory time
        mem0 = base_s + per_used_s * used0
        if mem0 >= floor_s:
            split = 0
        elif per_used_s * grow <= 0:
            split = k
        else:
            split = min(k, math.ceil((floor_s - mem0) / (per_used_s * grow)))
        total = 0.0
        if split > 0:
            total += self._span(split, used0, grow, floor_s, 0.0, capped_held, internal, external, held, running)
        if split < k:
            u = used0 + grow * split
            total += self._span(
                k - split,
                u,
                grow,
                base_s + per_used_s * u,
                per_used_s * grow,
                capped_held,
                internal,
                external,
                held,
                running,
            )
        return total

    def _span(self, k, used0, grow, t0, dt, capped_held, internal, external, held, running) -> float:
        s0, s1, s2 = k, _sum_j(k), _sum_j2(k)
        time = t0 * s0 + dt * s1
        used_time = used0 * t0 * s0 + (used0 * dt + grow * t0) * s1 + grow * dt * s2
        free = self.pool_slots - held - external
        seconds, peak = self.slot_seconds, self.peak
        seconds.used += used_time
        seconds.reserved += (capped_held) * time - used_time
        seconds.internal += internal * time
        seconds.external += external * time
        seconds.free += free * time
        used_last = used0 + grow * (k - 1)
        peak.used = max(peak.used, used_last, used0)
        peak.reserved = max(peak.reserved, capped_held - min(used0, used_last))
        peak.internal = max(peak.internal, internal)
        peak.external = max(peak.external, external)
        peak.free = max(peak.free, free)
        self.peak_allocated = max(self.peak_allocated, held)
        self.peak_needed = max(self.peak_needed, capped_held)
        if held > 0:  # the time integral of 1 - used/held, exact also when step times grow
            self.fragmentation_seconds += time - used_time / held
            self.allocated_seconds += time
        self.running_seconds += running * time
        if self.keep_timeline:
            self.timeline.append((self.elapsed_s, held // self.block_size, used0))
        self.elapsed_s += time
        self.steps += k
        return time

    # -- results ----------------------------------------------------------------------------------------
    def shares_pct(self) -> PoolParts[float]:
        """Time-averaged share of the pool per part, in percent (they add up to 100)."""
        denom = self.pool_slots * self.elapsed_s
        if denom <= 0:
            return PoolParts(0.0, 0.0, 0.0, 0.0, 0.0)
        s = self.slot_seconds
        return PoolParts(
            100.0 * s.used / denom,
            100.0 * s.reserved / denom,
            100.0 * s.internal / denom,
            100.0 * s.external / denom,
            100.0 * s.free / denom,
        )

    def mean_slots(self) -> PoolParts[float]:
        """Time-averaged slots per part."""
        if self.elapsed_s <= 0:
            return PoolParts(0.0, 0.0, 0.0, 0.0, 0.0)
        s, t = self.slot_seconds, self.elapsed_s
        return PoolParts(s.used / t, s.reserved / t, s.internal / t, s.external / t, s.free / t)

    def effective_usage(self) -> float:
        """The paper's effective memory usage: used / (used + reserved + internal + external)."""
        occupied = self.slot_seconds.occupied
        return self.slot_seconds.used / occupied if occupied > 0 else 0.0

    def fragmentation_mean(self) -> float:
        """Time average of the online fragmentation 1 - used / allocated (over steps with allocations)."""
        return self.fragmentation_seconds / self.allocated_seconds if self.allocated_seconds > 0 else 0.0

    def mean_running(self) -> float:
        return self.running_seconds / self.elapsed_s if self.elapsed_s > 0 else 0.0

    def waste_pct(self) -> dict[str, float]:
        """The results schema's waste block: shares of the pool, time-averaged, in percent."""
        shares = self.shares_pct()
        return {
            "token_state_pct": shares.used,
            "reservation_pct": shares.reserved,
            "internal_pct": shares.internal,
            "external_pct": shares.external,
            "free_pct": shares.free,
        }
