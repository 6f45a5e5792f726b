"""The Ray fleet: tensor-engine instances as Ray actors, on the wall clock, routed from the driver.

The driver keeps one step call in flight per instance with work; a request is sent with ``submit`` and,
because an actor runs its calls in order, it joins the batch at that instance's next step, as in a serving
engine. Every answer carries the instance's stats, which is all the router and the autoscaler read. An actor
that dies (a crash, a lost node, a fault a test injects) has its unfinished requests sent to another instance
once, or failed with the reason; none is dropped silently.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from kvbench.engine.load_pattern import OpenLoopClient
from kvbench.engine.request import Request
from kvbench.studies.fleet.actor import InstanceSpec, Report
from kvbench.studies.fleet.core import (
    DEAD,
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


class RayFleet:
    def __init__(
        self,
        ray,
        new_actor: Callable[[float], Any],
        base: Sequence[tuple[Any, float]],
        policy: RoutingPolicy,
        spec: InstanceSpec,
        autoscale: AutoscaleSettings | None = None,
        tick_s: float = 0.1,
        faults: Sequence[tuple[float, int]] = (),
        metrics=None,
    ) -> None:
        """``base``: (actor, measured start-up seconds) of the instances the run starts with, already loaded;
        ``new_actor(epoch)`` starts one more (autoscaling); ``faults``: (seconds, instance) actors to kill."""
        self.ray = ray
        self.new_actor = new_actor
        self.base = list(base)
        self.router = FleetRouter(policy, spec.config.block_size)
        self.scaler = Autoscaler(autoscale) if autoscale is not None else None
        self.tick_s = tick_s
        self.faults = sorted(faults)
        self.metrics = metrics
        self.slots: list[InstanceSlot] = []
        self.pending: dict[Any, tuple[InstanceSlot, str, Request | None]] = {}
        self.stepping: set[int] = set()
        self.ended: dict[int, Request] = {}
        self.placement: dict[int, int] = {}
        self.rerouted: set[int] = set()
        self.samples: list[tuple[float, int, int, int, int, int]] = []
        self.fleet_samples: list[tuple[float, int, int]] = []
        self.events: list[tuple[float, str, int]] = []
        self.epoch = 0.0
        self.client: OpenLoopClient | None = None

    def now(self) -> float:
        return time.time() - self.epoch

    # -- the run ----------------------------------------------------------------------------------------
    def run(self, arrivals: Sequence[tuple[float, Request]], policy_name: str) -> FleetRun:
        ray = self.ray
        self.epoch = time.time()
        reports = ray.get([actor.reset.remote(self.epoch) for actor, _ in self.base])
        for index, ((actor, startup), report) in enumerate(zip(self.base, reports, strict=True)):
            self.slots.append(
                InstanceSlot(index, actor, SERVING, 0.0, ready_at=0.0, startup_s=startup, stats=report.stats)
            )
        client = self.client = OpenLoopClient(arrivals, self)  # each request routed (``add``) when it is due
        next_tick, faults = 0.0, list(self.faults)
        while True:
            now = self.now()
            while faults and faults[0][0] <= now:
                self._kill(faults.pop(0)[1], now)
            client.release(now)
            if now >= next_tick:
                self._tick(now)
                next_tick = now + self.tick_s
            if client.exhausted and len(self.ended) == len(arrivals):
                break
            due = client.next_time()
            horizon = min(next_tick, due if due is not None else next_tick, faults[0][0] if faults else next_tick)
            self._wait(max(0.0, horizon - self.now()))
        end = max((r.finish_time or r.arrival_time for r in self.ended.values()), default=0.0)
        self._stop_extra_actors(end)
        requests = [self.ended[request.request_id] for _, request in arrivals]
        return FleetRun(
            policy_name,
            requests,
            self.placement,
            self.slots,
            self.samples,
            self.fleet_samples,
            self.events,
            end,
            rerouted=len(self.rerouted),
            simulated=False,
        )

    def _wait(self, timeout: float) -> None:
        if not self.pending:
            time.sleep(timeout)
            return
        refs = list(self.pending)
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=timeout)
        if ready:
            ready, _ = self.ray.wait(refs, num_returns=len(refs), timeout=0)
        for ref in ready:
            self._answer(ref)

    # -- requests ---------------------------------------------------------------------------------------
    def add(self, request: Request) -> bool:
        """A request due (its ``arrival_time`` set by the client) goes to the instance the router chooses; False
        when none is serving (the request is rejected)."""
        slot = self.router.choose(request, self.slots)
        if slot is None:
            self._end(reject(request, "no instance was serving when it arrived", "no_instance"))
            return False
        if slot.state == DRAINING:
            slot.routed_after_drain += 1
        self.placement[request.request_id] = slot.index
        self._call(slot, "submit", request, slot.handle.submit.remote(request, request.arrival_time))
        return True

    def _call(self, slot: InstanceSlot, kind: str, request: Request | None, ref) -> None:
        self.pending[ref] = (slot, kind, request)
        if kind in ("submit", "step"):
            self._ensure_step(slot)

    def _ensure_step(self, slot: InstanceSlot) -> None:
        if slot.index not in self.stepping and slot.state in (SERVING, DRAINING):
            self.stepping.add(slot.index)
            self.pending[slot.handle.step.remote()] = (slot, "step", None)

    def _answer(self, ref) -> None:
        slot, kind, request = self.pending.pop(ref)
        if kind == "step":
            self.stepping.discard(slot.index)
        try:
            answer = self.ray.get(ref)
        except Exception as err:  # the actor died, or its method raised: the instance has failed
            self._failed(slot, err)
            return
        if slot.state == DEAD:
            return
        if kind == "ready":
            slot.startup_s = self.now() - slot.started_at  # measured: process start + model load
            slot.ready_at, slot.state = self.now(), SERVING
            self.events.append((slot.ready_at, "ready", slot.index))
            self.pending[slot.handle.stats.remote()] = (slot, "stats", None)
            return
        self._apply(slot, answer)
        if kind == "submit" and request is not None:  # a submit always carries its request
            slot.transit_blocks = max(0, slot.transit_blocks - self.router.blocks(request))

    def _apply(self, slot: InstanceSlot, report: Report) -> None:
        slot.stats = report.stats
        for request in report.ended:
            slot.outstanding.pop(request.request_id, None)
            self._end(request)
        if self.metrics is not None:
            self.metrics.observe_instance(slot.index, report.stats)
        if report.stats.has_work:
            self._ensure_step(slot)
        elif slot.state == DRAINING and not slot.outstanding:
            slot.state, slot.stopped_at, slot.final_stats = STOPPED, self.now(), report.stats
            self.events.append((slot.stopped_at, "stopped", slot.index))
            if slot.index >= len(self.base):
                self.ray.kill(slot.handle)

    def _end(self, request: Request) -> None:
        self.ended[request.request_id] = request
        if self.client is not None and request.request_id in self.placement:  # it held a slot of the client's
            self.client.done(self.now())

    # -- failures ---------------------------------------------------------------------------------------
    def _kill(self, index: int, now: float) -> None:
        slot = self.slots[index] if index < len(self.slots) else None
        if slot is None or not slot.live:
            return
        self.events.append((now, "killed", index))
        self.ray.kill(slot.handle, no_restart=True)

    def _failed(self, slot: InstanceSlot, err: Exception) -> None:
        if slot.state == DEAD:
            return
        reason = f"instance {slot.index} failed: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        slot.state, slot.stopped_at, slot.failure = DEAD, self.now(), reason
        slot.final_stats = slot.stats
        self.stepping.discard(slot.index)
        self.events.append((slot.stopped_at, "died", slot.index))
        orphans = list(slot.outstanding.values())
        slot.outstanding.clear()
        for request in orphans:
            if request.request_id in self.rerouted or request.request_id in self.ended:
                if request.request_id not in self.ended:
                    self._end(reject(request, f"{reason}; already re-routed once", "instance_failed"))
                continue
            self.rerouted.add(request.request_id)
            target = self.router.choose(request, self.slots)
            if target is None:
                self._end(reject(request, f"{reason}; no other instance could take it", "instance_failed"))
                continue
            self.placement[request.request_id] = target.index
            self._call(target, "submit", request, target.handle.submit.remote(request, request.arrival_time))

    # -- ticks: samples and autoscaling -----------------------------------------------------------------
    def _tick(self, t: float) -> None:
        serving = starting = 0
        for slot in self.slots:
            if slot.state in (SERVING, DRAINING) and slot.stats is not None:
                serving += 1
                s = slot.stats
                self.samples.append((t, slot.index, s.used_blocks, s.total_blocks, s.running, s.waiting))
            elif slot.state == STARTING:
                starting += 1
        self.fleet_samples.append((t, serving, starting))
        if self.metrics is not None:
            self.metrics.observe_fleet(serving, starting)
        if self.scaler is None:
            return
        action = self.scaler.decide(t, self.slots)
        if action == "up":
            slot = InstanceSlot(len(self.slots), self.new_actor(self.epoch), STARTING, started_at=t)
            self.slots.append(slot)
            self.events.append((t, "up", slot.index))
            self.pending[slot.handle.ready.remote()] = (slot, "ready", None)
        elif action == "down":
            slot = drain_choice(self.slots)
            slot.state, slot.drained_at = DRAINING, t
            self.events.append((t, "down", slot.index))
            self.pending[slot.handle.drain.remote()] = (slot, "drain", None)

    def _stop_extra_actors(self, end: float) -> None:
        """Actors started by the autoscaler go when the run ends; the base ones stay for the next policy."""
        for slot in self.slots:
            if slot.state in (SERVING, DRAINING) and slot.final_stats is None:
                slot.final_stats = slot.stats
            if slot.index >= len(self.base) and slot.state != DEAD:
                self.ray.kill(slot.handle)
                if slot.stopped_at is None:
                    slot.stopped_at = end
