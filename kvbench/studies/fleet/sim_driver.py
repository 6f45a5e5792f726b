"""The simulated fleet: instances on one virtual clock, advanced from arrival to arrival.

At each arrival every instance is first run up to that instant (its steps are atomic, so one may stand a
step past it), then the router chooses from their states as they are then. Autoscaling decisions are taken
at regular ticks, which also sample each instance's block usage for the plots. A new instance is ready a
set start-up time after it is asked for (a simulation has nothing to measure it on).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from kvbench.engine.client import OpenLoopClient
from kvbench.engine.request import Request
from kvbench.engine.simulator import SimulatedInstance
from kvbench.studies.fleet.core import (
    DRAINING,
    SERVING,
    STARTING,
    STOPPED,
    Autoscaler,
    AutoscaleSettings,
    FleetRouter,
    FleetRun,
    InstanceSlot,
    drain_choice,
    reject,
)
from kvbench.studies.fleet.routing import RoutingPolicy


class SimulatedFleet:
    def __init__(self, make_instance: Callable[[float], SimulatedInstance], policy: RoutingPolicy, instances: int,
                 block_size: int, autoscale: AutoscaleSettings | None = None, startup_s: float = 0.0,
                 tick_s: float = 1.0) -> None:
        """``make_instance(t)`` builds an idle instance whose clock starts at ``t``."""
        self.make_instance = make_instance
        self.router = FleetRouter(policy, block_size)
        self.scaler = Autoscaler(autoscale) if autoscale is not None else None
        self.startup_s = startup_s
        self.tick_s = tick_s
        self.slots = [self._serving_slot(index, 0.0) for index in range(instances)]
        self.ended: list[Request] = []
        self.placement: dict[int, int] = {}
        self.samples: list[tuple[float, int, int, int, int, int]] = []
        self.fleet_samples: list[tuple[float, int, int]] = []
        self.events: list[tuple[float, str, int]] = []
        self.next_tick = 0.0  # when the next usage sample and autoscaling decision is due
        self.client: OpenLoopClient | None = None

    def _serving_slot(self, index: int, t: float) -> InstanceSlot:
        instance = self.make_instance(t)
        return InstanceSlot(index, instance, SERVING, started_at=t, ready_at=t, startup_s=0.0, stats=instance.stats())

    # -- time -------------------------------------------------------------------------------------------
    def advance(self, t: float) -> None:
        """Every instance runs up to ``t``; what ended is collected; started and drained instances change state."""
        for slot in self.slots:
            if slot.state == STARTING and slot.ready_at <= t:
                slot.handle = self.make_instance(slot.ready_at)
                slot.state = SERVING
                self.events.append((slot.ready_at, "ready", slot.index))
            if slot.state not in (SERVING, DRAINING):
                continue
            instance = slot.handle
            if instance.now < t:
                instance.step_until(t)
            ended = instance.take_ended()
            if ended:
                for request in ended:
                    slot.outstanding.pop(request.request_id, None)
                    slot.last_end = max(slot.last_end, request.finish_time or request.arrival_time)
                    if self.client is not None:  # its slot in the client frees (a capped open loop)
                        self.client.done(request.finish_time or request.arrival_time)
                self.ended.extend(ended)
            slot.stats = instance.stats()
            if slot.state == DRAINING and not slot.outstanding and not slot.stats.has_work:
                stop = max(slot.last_end, slot.drained_at or 0.0)  # its last request ended (an idle clock moves on)
                slot.state, slot.stopped_at, slot.final_stats = STOPPED, stop, slot.stats
                self.events.append((stop, "stopped", slot.index))

    def tick(self, t: float) -> None:
        self.advance(t)
        serving = starting = 0
        for slot in self.slots:
            if slot.state in (SERVING, DRAINING):
                serving += 1
                s = slot.stats
                self.samples.append((t, slot.index, s.used_blocks, s.total_blocks, s.running, s.waiting))
            elif slot.state == STARTING:
                starting += 1
        self.fleet_samples.append((t, serving, starting))
        if self.scaler is None:
            return
        action = self.scaler.decide(t, self.slots)
        if action == "up":
            index = len(self.slots)
            self.slots.append(InstanceSlot(index, None, STARTING, started_at=t, ready_at=t + self.startup_s,
                                           startup_s=self.startup_s))
            self.events.append((t, "up", index))
        elif action == "down":
            slot = drain_choice(self.slots)
            slot.state, slot.drained_at = DRAINING, t
            self.events.append((t, "down", slot.index))

    def add(self, request: Request) -> bool:
        """An arrival at ``request.arrival_time``: samples and decisions up to then, every instance run up to
        it, then the router's choice; False when no instance was serving (the request is rejected)."""
        t = request.arrival_time
        while self.next_tick <= t:
            self.tick(self.next_tick)
            self.next_tick += self.tick_s
        self.advance(t)
        slot = self.router.choose(request, self.slots)
        if slot is None:
            self.ended.append(reject(request, "no instance was serving when it arrived", "no_instance"))
            return False
        if slot.state == DRAINING:
            slot.routed_after_drain += 1
        self.placement[request.request_id] = slot.index
        slot.handle.submit(request, t)
        slot.stats = slot.handle.stats()
        slot.transit_blocks = 0  # a simulated instance reports at once
        return True

    # -- the run ----------------------------------------------------------------------------------------
    def run(self, arrivals: Sequence[tuple[float, Request]], policy_name: str) -> FleetRun:
        """Serve ``arrivals`` open loop (``engine.client.OpenLoopClient``): each arrival, in order, runs the fleet
        up to its instant and is routed (``add``); then the fleet runs until every request has ended."""
        self.client = OpenLoopClient(arrivals, self)
        while (due := self.client.next_time()) is not None:
            self.client.release(due)
        while len(self.ended) < len(arrivals):
            self.tick(self.next_tick)
            self.next_tick += self.tick_s
        end = max((r.finish_time or r.arrival_time for r in self.ended), default=0.0)
        self.advance(end)  # an instance that was draining and has just emptied stops
        for slot in self.slots:
            if slot.state in (SERVING, DRAINING):
                slot.final_stats = slot.stats
        order = {request.request_id: position for position, (_, request) in enumerate(arrivals)}
        self.ended.sort(key=lambda r: order[r.request_id])
        return FleetRun(policy_name, self.ended, self.placement, self.slots, self.samples, self.fleet_samples,
                        self.events, end, simulated=True)
