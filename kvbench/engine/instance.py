"""An engine instance as a fleet sees it: fed request by request, stepped over time, asked how full it is.

Two kinds implement :class:`EngineInstance`: the simulator's :class:`~kvbench.engine.simulator.SimulatedInstance`
(a virtual clock advanced by roofline step times) and the tensor engine's
:class:`~kvbench.engine.llm_engine.EngineSession` (wall-clock time, real forwards). Both run the shared
scheduler, so a fleet routes the same decisions over either. What a router or an autoscaler may read of an
instance is an :class:`InstanceStats`: small, plain and picklable, so it crosses process boundaries (Ray).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol

from kvbench.engine.request import Request
from kvbench.kv.block_pool import blocks_for


@dataclass(frozen=True)
class InstanceStats:
    """An instance's state at ``time`` (seconds on the fleet's clock)."""

    time: float
    total_blocks: int
    free_blocks: int  # in the pool's free queue (blocks kept only as prefix cache count as free: evictable)
    running: int
    waiting: int
    waiting_blocks: int  # blocks the queued requests' prefills need: demand routed here but not yet admitted
    preemptions: int
    finished: int
    rejected: int
    prompt_tokens: int  # prompt tokens admitted (prefills), for the prefix-cache hit rate
    cached_tokens: int  # of which the prefix cache held the KV

    @property
    def used_blocks(self) -> int:
        return self.total_blocks - self.free_blocks

    @property
    def usage(self) -> float:
        """Share of the pool's blocks in use, 0..1."""
        return self.used_blocks / self.total_blocks if self.total_blocks else 0.0

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting)

    def as_dict(self) -> dict:
        return asdict(self)


def instance_stats(scheduler, now: float) -> InstanceStats:
    """Read a scheduler and its pool (O(1): the scheduler keeps the totals)."""
    pool = scheduler.manager.pool
    return InstanceStats(
        time=now,
        total_blocks=pool.num_blocks,
        free_blocks=pool.num_free,
        running=len(scheduler.running),
        waiting=len(scheduler.waiting),
        waiting_blocks=blocks_for(scheduler.waiting_tokens, pool.block_size),
        preemptions=scheduler.num_preemptions,
        finished=scheduler.num_finished,
        rejected=scheduler.num_rejected,
        prompt_tokens=scheduler.prefill_tokens,
        cached_tokens=scheduler.cached_tokens,
    )


class EngineInstance(Protocol):
    """What a fleet asks of one engine: submit, advance, report, and give back the requests that ended."""

    def submit(self, request: Request, arrival_time: float) -> bool:
        """Queue an arriving request; False when the instance rejects it at once (its reason on the request)."""
        ...

    def step_until(self, t: float) -> None:
        """Run engine steps up to time ``t`` (a virtual instance) or while there is work (a real one)."""
        ...

    def stats(self) -> InstanceStats: ...

    def take_ended(self) -> list[Request]:
        """Requests that finished or were rejected since the last call, each returned once."""
        ...
