"""The simulated fleet: instances on one virtual clock, advanced from arrival to arrival.

At each arrival every instance is first run up to that instant (its steps are atomic, so one may stand a
step past it), then the router chooses from their states as they are then. Autoscaling decisions are taken
at regular ticks, which also sample each instance's block usage for the plots. A new instance is ready a
set start-up time after it is asked for (a simulation has nothing to measure it on).

The cost follows the work, not the fleet's size or the simulated time: only instances with work are stepped
(a queue ordered by their clocks; an idle instance's state cannot change until it is given a request), and
while the whole fleet is idle and nothing can change, the ticks up to the next arrival are not taken one by
one: the last sample stands for them (``FleetRun.tick_repeats``), so every figure is as if they had been.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Sequence

from kvbench.engine.load_pattern import OpenLoopClient
from kvbench.engine.request import Request
from kvbench.engine.simulator import SimulatedInstance
from kvbench.errors import KvbenchError
from kvbench.kv.paged import PagedManager
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
from kvbench.studies.fleet.prefix_index import HeldBlocks, feed_events
from kvbench.studies.fleet.routing import PrecisePrefix, RoutingPolicy

MAX_SAMPLES = 5_000_000  # instance usage samples kept for the figures and plots (~0.5 GB)


class SimulatedFleet:
    def __init__(
        self,
        make_instance: Callable[[float], SimulatedInstance],
        policy: RoutingPolicy,
        instances: int,
        block_size: int,
        autoscale: AutoscaleSettings | None = None,
        startup_s: float = 0.0,
        tick_s: float = 1.0,
        reports_at_ticks: bool = False,
    ) -> None:
        """``make_instance(t)`` builds an idle instance whose clock starts at ``t``. ``reports_at_ticks``: the
        router reads each instance only at the ticks, as a router scraping real servers does (else at once)."""
        self.reports_at_ticks = reports_at_ticks
        self.held = policy.held if isinstance(policy, PrecisePrefix) else None  # fed from the managers' events
        self.make_instance = self._publishing(make_instance) if self.held is not None else make_instance
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
        self.tick_repeats: dict[float, int] = {}  # a tick's time -> the ticks its samples stand for (idle gaps)
        self._busy: list[tuple[float, int]] = []  # (clock, slot index) of the instances with work, earliest first
        self._queued: set[int] = set()  # slot indices in _busy
        self._touched: set[int] = set()  # slots given a request since the last advance
        self._changing: list[InstanceSlot] = []  # slots starting or draining (few, and only with autoscaling)
        self._ticks = 0  # ticks taken; tick k is at k * tick_s (usage samples and autoscaling decisions)
        self.client: OpenLoopClient | None = None

    @staticmethod
    def _publishing(make_instance: Callable[[float], SimulatedInstance]) -> Callable[[float], SimulatedInstance]:
        """Instances whose KV managers record their cache events, as a server publishes them."""

        def make(t: float) -> SimulatedInstance:
            instance = make_instance(t)
            manager = instance.scheduler.manager
            if not isinstance(manager, PagedManager) or not manager.enable_prefix_caching:
                raise KvbenchError("precise-prefix reads the instances' prefix-cache events, and prefix caching is off")
            manager.events = []
            return instance

        return make

    def _hear_events(self) -> None:
        """What every instance's cache stored and removed since the last arrival, into the precise view."""
        assert self.held is not None
        for slot in self.slots:
            if slot.handle is None:
                continue
            manager = slot.handle.scheduler.manager
            assert isinstance(manager, PagedManager)
            if manager.events:
                feed_events(self.held.setdefault(slot.index, HeldBlocks()), manager.events, manager.block_size)
                manager.events.clear()

    def _serving_slot(self, index: int, t: float) -> InstanceSlot:
        instance = self.make_instance(t)
        return InstanceSlot(index, instance, SERVING, started_at=t, ready_at=t, startup_s=0.0, stats=instance.stats())

    # -- time -------------------------------------------------------------------------------------------
    def advance(self, t: float) -> None:
        """Every instance runs up to ``t``; what ended is collected; started and drained instances change state.

        Only the instances with work whose clock is before ``t``, and those given a request since the last
        call, are stepped: an idle instance stands still until a request comes (its report stays true)."""
        due = self._touched
        self._touched = set()
        while self._busy and self._busy[0][0] < t:
            index = heapq.heappop(self._busy)[1]
            self._queued.discard(index)
            due.add(index)
        for slot in self._changing:
            # a starting slot has its ready time
            if slot.state == STARTING and slot.ready_at is not None and slot.ready_at <= t:
                slot.handle = self.make_instance(slot.ready_at)
                slot.state = SERVING
                slot.stats = slot.handle.stats()
                self.events.append((slot.ready_at, "ready", slot.index))
            elif slot.state == DRAINING:
                due.add(slot.index)
        for index in sorted(due):
            self._step(self.slots[index], t)
        self._changing = [slot for slot in self._changing if slot.state in (STARTING, DRAINING)]

    def _step(self, slot: InstanceSlot, t: float) -> None:
        """One instance run up to ``t``: what ended is collected, its report refreshed, a drained one stopped."""
        if slot.state not in (SERVING, DRAINING):
            return
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
        elif slot.stats.has_work and slot.index not in self._queued:
            heapq.heappush(self._busy, (instance.now, slot.index))
            self._queued.add(slot.index)

    def tick(self, t: float) -> None:
        self.advance(t)
        serving = starting = 0
        for slot in self.slots:
            if slot.state in (SERVING, DRAINING):
                serving += 1
                s = slot.stats
                assert s is not None  # an instance reports as it becomes ready
                if self.reports_at_ticks:  # the scrape: everything routed so far shows in it
                    slot.seen, slot.transit_blocks = s, 0
                self.samples.append((t, slot.index, s.used_blocks, s.total_blocks, s.running, s.waiting))
            elif slot.state == STARTING:
                starting += 1
        self.fleet_samples.append((t, serving, starting))
        if len(self.samples) > MAX_SAMPLES:
            raise KvbenchError(
                f"the fleet's usage samples passed {MAX_SAMPLES:,} ({serving} instances sampled every "
                f"{self.tick_s:g} s, {t:,.0f} s of simulated time so far): sample less often (a "
                "longer tick)"
            )
        if self.scaler is None:
            return
        action = self.scaler.decide(t, self.slots)
        if action == "up":
            index = len(self.slots)
            self.slots.append(
                InstanceSlot(index, None, STARTING, started_at=t, ready_at=t + self.startup_s, startup_s=self.startup_s)
            )
            self._changing.append(self.slots[-1])
            self.events.append((t, "up", index))
        elif action == "down":
            slot = drain_choice(self.slots)
            slot.state, slot.drained_at = DRAINING, t
            self._changing.append(slot)
            self.events.append((t, "down", slot.index))

    def _idle(self) -> bool:
        """Nothing can change until a request arrives: no instance has work or a request in flight, none
        starts or drains, and the autoscaler has nothing left to remove."""
        if self._busy or self._touched or self._changing:
            return False
        serving = 0
        for slot in self.slots:
            if slot.state in (STARTING, DRAINING) or slot.outstanding:
                return False
            serving += slot.state == SERVING
        return self.scaler is None or serving <= self.scaler.settings.min_instances

    def _skip_idle(self, taken: int, until: float) -> int:
        """After tick number ``taken - 1``: if the fleet is idle, the number of the last tick at or before
        ``until`` (taken next); the ticks in between are counted on the last one taken, not run."""
        last = math.floor(until / self.tick_s)
        while last > taken and last * self.tick_s > until:
            last -= 1
        if last <= taken or not self._idle():
            return taken
        previous = (taken - 1) * self.tick_s
        self.tick_repeats[previous] = self.tick_repeats.get(previous, 1) + last - taken
        return last

    def add(self, request: Request) -> bool:
        """An arrival at ``request.arrival_time``: samples and decisions up to then, every instance run up to
        it, then the router's choice; False when no instance was serving (the request is rejected)."""
        t = request.arrival_time
        while self._ticks * self.tick_s <= t:
            self.tick(self._ticks * self.tick_s)
            self._ticks = self._skip_idle(self._ticks + 1, t)
        self.advance(t)
        if self.held is not None:
            self._hear_events()
        slot = self.router.choose(request, self.slots)
        if slot is None:
            self.ended.append(reject(request, "no instance was serving when it arrived", "no_instance"))
            return False
        if slot.state == DRAINING:
            slot.routed_after_drain += 1
        self.placement[request.request_id] = slot.index
        slot.handle.submit(request, t)
        slot.stats = slot.handle.stats()
        if not self.reports_at_ticks:
            slot.transit_blocks = 0  # a simulated instance reports at once
        self._touched.add(slot.index)
        return True

    # -- the run ----------------------------------------------------------------------------------------
    def run(self, arrivals: Sequence[tuple[float, Request]], policy_name: str) -> FleetRun:
        """Serve ``arrivals`` open loop (``engine.client.OpenLoopClient``): each arrival, in order, runs the fleet
        up to its instant and is routed (``add``); then the fleet runs until every request has ended."""
        self._changing = [slot for slot in self.slots if slot.state in (STARTING, DRAINING)]
        self.client = OpenLoopClient(arrivals, self)
        while (due := self.client.next_time()) is not None:
            self.client.release(due)
        while len(self.ended) < len(arrivals):
            self.tick(self._ticks * self.tick_s)
            self._ticks += 1
        end = max((r.finish_time or r.arrival_time for r in self.ended), default=0.0)
        self.advance(end)  # an instance that was draining and has just emptied stops
        for slot in self.slots:
            if slot.state in (SERVING, DRAINING):
                slot.final_stats = slot.stats
        order = {request.request_id: position for position, (_, request) in enumerate(arrivals)}
        self.ended.sort(key=lambda r: order[r.request_id])
        return FleetRun(
            policy_name,
            self.ended,
            self.placement,
            self.slots,
            self.samples,
            self.fleet_samples,
            self.events,
            end,
            simulated=True,
            tick_repeats=self.tick_repeats,
        )
