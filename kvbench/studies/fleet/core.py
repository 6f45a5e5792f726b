"""What both fleet drivers share: the driver's view of each instance, the router's bookkeeping, the autoscaler
and the record of a run.

The drivers differ only in how time passes: the simulated fleet advances a virtual clock from arrival to
arrival, the Ray fleet runs on the wall clock with instances in other processes. Everything here talks to an
instance through what it last reported (:class:`~kvbench.engine.instance.InstanceStats`), never its internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvbench.engine.instance import InstanceStats
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.step_totals import StepTotals
from kvbench.kv.block_pool import blocks_for
from kvbench.studies.fleet.routing import InstanceView, RoutingPolicy

STARTING, SERVING, DRAINING, STOPPED, DEAD = "starting", "serving", "draining", "stopped", "dead"


@dataclass
class InstanceSlot:
    """The driver's record of one instance."""

    index: int
    handle: Any  # the instance (simulated) or its actor handle (Ray)
    state: str
    started_at: float  # when it was asked for: its cost starts here
    ready_at: float | None = None
    stopped_at: float | None = None
    startup_s: float | None = None  # measured (Ray) or the simulation's setting
    stats: InstanceStats | None = None  # as last reported
    outstanding: dict[int, Request] = field(default_factory=dict)  # routed here, not ended
    transit_blocks: int = 0  # prefill blocks routed here that the last report does not show yet
    routed: int = 0
    routed_after_drain: int = 0  # must stay 0: the router never sends to a draining instance
    failure: str | None = None
    last_end: float = 0.0  # when its latest request ended
    drained_at: float | None = None  # when the router stopped sending to it
    final_stats: InstanceStats | None = None
    name: str | None = None  # a server's label (a fleet of servers over HTTP)
    seen: InstanceStats | None = None  # what the router last read, where it reads at intervals (None: ``stats``)
    _view: InstanceView | None = field(default=None, repr=False, compare=False)
    _view_of: InstanceStats | None = field(default=None, repr=False, compare=False)

    @property
    def live(self) -> bool:
        return self.state in (STARTING, SERVING, DRAINING)

    def view(self) -> InstanceView:
        """What the router sees; made again only when the report, the requests in flight or the blocks in
        transit changed (a router reads every instance at every arrival, most unchanged since the last)."""
        stats, in_flight = self.seen or self.stats, len(self.outstanding)
        assert stats is not None, "the router sees only instances that have reported"
        cached = self._view
        if (
            cached is not None
            and self._view_of is stats
            and cached.in_flight == in_flight
            and cached.queued_blocks == stats.waiting_blocks + self.transit_blocks
        ):
            return cached
        self._view = InstanceView(
            index=self.index,
            total_blocks=stats.total_blocks,
            free_blocks=stats.free_blocks,
            queued_blocks=stats.waiting_blocks + self.transit_blocks,
            running=stats.running,
            waiting=stats.waiting,
            in_flight=in_flight,
        )
        self._view_of = stats
        return self._view

    def seconds(self, end: float) -> float:
        """Instance-seconds: from the request for it to its stop (or the end of the run)."""
        stop = self.stopped_at if self.stopped_at is not None else end
        return max(0.0, stop - self.started_at)


class FleetRouter:
    """Routes with a policy over the serving instances and keeps each instance's requests in flight."""

    def __init__(self, policy: RoutingPolicy, block_size: int) -> None:
        self.policy = policy
        self.block_size = block_size

    def choose(self, request: Request, slots: list[InstanceSlot]) -> InstanceSlot | None:
        serving = [slot for slot in slots if slot.state == SERVING and slot.stats is not None]
        if not serving:
            return None
        slot = serving[self.policy.choose(request, [s.view() for s in serving], request.arrival_time)]
        slot.outstanding[request.request_id] = request
        slot.routed += 1
        slot.transit_blocks += self.blocks(request)
        return slot

    def blocks(self, request: Request) -> int:
        return blocks_for(request.prompt_len, self.block_size)


@dataclass(frozen=True)
class AutoscaleSettings:
    scale_up: float = 0.8  # fleet block usage above which an instance is added ...
    scale_down: float = 0.3  # ... and below which one is drained and removed
    window_s: float = 5.0  # how long usage must stay past a threshold
    min_instances: int = 1
    max_instances: int = 8


class Autoscaler:
    """Adds an instance when fleet block usage stays above ``scale_up`` for a window, drains one when it stays
    below ``scale_down``; one change at a time: while an instance starts or drains nothing is decided, and the
    window starts again once it has (no flapping on what the change itself did to usage)."""

    def __init__(self, settings: AutoscaleSettings) -> None:
        self.settings = settings
        self._above_since: float | None = None
        self._below_since: float | None = None

    def decide(self, now: float, slots: list[InstanceSlot]) -> str | None:
        """ "up", "down" or None, from the serving instances' last reports."""
        s = self.settings
        serving = [slot for slot in slots if slot.state == SERVING and slot.stats is not None]
        busy = any(slot.state in (STARTING, DRAINING) for slot in slots)
        usage = fleet_usage(serving)
        if usage is None:
            return None
        if busy:  # a change under way: the next decision needs a full window of the fleet it leaves behind
            self._above_since = self._below_since = None
            return None
        self._above_since = (
            (self._above_since if self._above_since is not None else now) if usage > s.scale_up else None
        )
        self._below_since = (
            (self._below_since if self._below_since is not None else now) if usage < s.scale_down else None
        )
        if self._above_since is not None and now - self._above_since >= s.window_s and len(serving) < s.max_instances:
            self._above_since = None
            return "up"
        if self._below_since is not None and now - self._below_since >= s.window_s and len(serving) > s.min_instances:
            self._below_since = None
            return "down"
        return None


def fleet_usage(serving: list[InstanceSlot]) -> float | None:
    """Blocks in use over blocks in all, across the serving instances (None when none serves)."""
    reports = [slot.stats for slot in serving if slot.stats is not None]  # callers pass reported ones only
    total = sum(stats.total_blocks for stats in reports)
    if not total:
        return None
    return sum(stats.used_blocks for stats in reports) / total


def drain_choice(slots: list[InstanceSlot]) -> InstanceSlot:
    """The serving instance to remove: the least work, then the newest."""
    serving = [slot for slot in slots if slot.state == SERVING]
    return min(serving, key=lambda s: (len(s.outstanding), -s.index))


@dataclass
class FleetRun:
    """What one policy's run recorded."""

    policy: str
    requests: list[Request]  # every request as it ended (finished or rejected), in arrival order
    placement: dict[int, int]  # request id -> the instance that served (or last held) it
    slots: list[InstanceSlot]
    samples: list[tuple[float, int, int, int, int, int]]  # (t, instance, used blocks, total, running, waiting)
    fleet_samples: list[tuple[float, int, int]]  # (t, serving instances, starting instances)
    events: list[tuple[float, str, int]]  # (t, "up" | "ready" | "down" | "stopped" | "killed" | "died", instance)
    end_s: float
    rerouted: int = 0
    simulated: bool = True
    notes: list[str] = field(default_factory=list)
    tick_repeats: dict[float, int] = field(default_factory=dict)  # a tick's time -> ticks its samples stand for
    step_samples: list[tuple[float, int, StepTotals]] = field(default_factory=list)  # (t, instance, its steps so far)

    def tick_weight(self, t: float) -> int:
        """How many ticks the samples taken at ``t`` stand for (more than one across a skipped idle gap)."""
        return self.tick_repeats.get(t, 1)

    def check_complete(self, count: int) -> None:
        """Every request ended exactly once: finished, or rejected with a reason (else a bug: never reported)."""
        ids = [r.request_id for r in self.requests]
        if len(ids) != count or len(set(ids)) != count:
            raise RuntimeError(
                f"policy {self.policy}: {len(set(ids))} of {count} requests ended ({len(ids) - len(set(ids))} twice)"
            )
        for request in self.requests:
            if request.status is RequestStatus.FINISHED:
                continue
            if request.status is not RequestStatus.REJECTED or not request.reject_reason:
                raise RuntimeError(
                    f"policy {self.policy}: request {request.request_id} ended as "
                    f"{request.status.value} without a reason"
                )


def reject(request: Request, reason: str, kind: str) -> Request:
    """End a request the fleet could not serve, with its reason."""
    request.status = RequestStatus.REJECTED
    request.reject_reason = reason
    request.reject_kind = kind
    return request
