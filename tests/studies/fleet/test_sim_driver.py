"""The simulated fleet: every request ends once under every policy, autoscaling by block usage, draining."""

from __future__ import annotations

import math

import pytest

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.simulator import SimulatedInstance
from kvbench.engine.timing import RooflineTiming
from kvbench.models.gpus import resolve_gpu
from kvbench.models.resolve import resolve_model
from kvbench.studies.fleet.core import DRAINING, AutoscaleSettings
from kvbench.studies.fleet.fleet_setup import prefix_prompts
from kvbench.studies.fleet.results import fleet_point, fleet_series
from kvbench.studies.fleet.routing import POLICIES, make_policy
from kvbench.studies.fleet.sim_driver import SimulatedFleet
from kvbench.workload.arrivals import poisson_arrivals
from kvbench.workload.lengths import LengthSpec

CONFIG = EngineConfig(block_size=16, num_blocks=64, max_len=512, enable_prefix_caching=True)
TIMING = RooflineTiming.for_model(resolve_model("llama-2-7b"), resolve_gpu("a100-80g"))


def make_instance(t: float) -> SimulatedInstance:
    return SimulatedInstance(CONFIG.build_manager(), TIMING, CONFIG, keep_timeline=False, start_time=t)


def arrivals(count: int, rate: float, seed: int = 0, prefixes: int = 0, too_long: int = 0):
    pairs = LengthSpec(mean_len=200, max_len=512).sample(count, seed)
    prompts = prefix_prompts(pairs, 32000, seed, prefixes, 64) if prefixes else [None] * count
    times = poisson_arrivals(count, rate, seed + 1)
    requests = [
        Request(i, p, o, prompt_token_ids=ids) for i, ((p, o), ids) in enumerate(zip(pairs, prompts, strict=True))
    ]
    for request in requests[:too_long]:
        request.max_tokens = 600  # over max-len: rejected with a reason by the instance
    return list(zip(times, requests, strict=True))


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_request_ends_exactly_once_under_every_policy(policy):
    load = arrivals(300, 60.0, prefixes=4, too_long=3)
    fleet = SimulatedFleet(make_instance, make_policy(policy, 0, 16), 3, 16, tick_s=0.2)
    run = fleet.run(load, policy)
    run.check_complete(300)
    statuses = [r.status for r in run.requests]
    assert statuses.count(RequestStatus.REJECTED) == 3
    assert all(r.reject_reason for r in run.requests if r.status is RequestStatus.REJECTED)
    assert [r.request_id for r in run.requests] == list(range(300))
    point = fleet_point(run, "paged", "test")
    assert point.completed == 297 and point.rejected == 3 and point.rejected_by_reason == {"too_long": 3}
    assert sum(i.routed for i in point.instances) == 300
    assert point.p99_ttft_ms >= point.p50_ttft_ms > 0 and point.output_throughput > 0
    assert point.instance_seconds == pytest.approx(3 * run.end_s)
    for slot in run.slots:
        assert slot.stats.free_blocks == slot.stats.total_blocks  # every block back (cached ones are free)
    series = fleet_series(run)
    assert set(series.usage) == {"0", "1", "2"} and series.ttft_cdf[-1][1] == 1.0


def test_the_same_arrivals_give_the_same_run():
    a = SimulatedFleet(make_instance, make_policy("random", 5), 3, 16, tick_s=0.2).run(arrivals(200, 50.0), "random")
    b = SimulatedFleet(make_instance, make_policy("random", 5), 3, 16, tick_s=0.2).run(arrivals(200, 50.0), "random")
    assert fleet_point(a, "paged", "x") == fleet_point(b, "paged", "x")


def test_prefix_affinity_hits_the_prefix_cache_more_than_round_robin():
    points = {}
    for policy in ("round-robin", "prefix-affinity"):
        run = SimulatedFleet(make_instance, make_policy(policy, 0, 16), 4, 16, tick_s=0.2).run(
            arrivals(300, 30.0, prefixes=4), policy
        )
        points[policy] = fleet_point(run, "paged", "x")
    assert points["prefix-affinity"].prefix_hit_rate > points["round-robin"].prefix_hit_rate > 0


def test_most_free_blocks_balances_block_usage_better_than_round_robin():
    imbalance = {}
    for policy in ("round-robin", "most-free-blocks"):
        run = SimulatedFleet(make_instance, make_policy(policy, 0, 16), 4, 16, tick_s=0.1).run(
            arrivals(600, 90.0), policy
        )
        imbalance[policy] = fleet_point(run, "paged", "x").free_blocks_imbalance_mean
    assert imbalance["most-free-blocks"] < imbalance["round-robin"]


def test_autoscaling_adds_an_instance_above_80_percent_and_removes_it_after():
    burst = arrivals(500, 120.0)  # keeps one instance's blocks above 80% ...
    calm_start = burst[-1][0] + 1.0
    calm = [(calm_start + 0.5 * i, Request(1000 + i, 20, 10)) for i in range(40)]  # ... then a trickle
    settings = AutoscaleSettings(scale_up=0.8, scale_down=0.3, window_s=0.5, min_instances=1, max_instances=3)
    fleet = SimulatedFleet(
        make_instance, make_policy("most-free-blocks", 0, 16), 1, 16, autoscale=settings, startup_s=1.0, tick_s=0.1
    )
    run = fleet.run(burst + calm, "most-free-blocks")
    run.check_complete(540)
    kinds = [kind for _, kind, _ in run.events]
    assert "up" in kinds and "ready" in kinds and "down" in kinds and "stopped" in kinds
    first_up = next(t for t, kind, _ in run.events if kind == "up")
    ready = next(t for t, kind, _ in run.events if kind == "ready")
    assert ready == pytest.approx(first_up + 1.0)
    assert max(serving for _, serving, _ in run.fleet_samples) >= 2
    assert run.slots[1].routed > 0  # the added instance took load once it was ready
    stopped = [index for _, kind, index in run.events if kind == "stopped"]
    for index in stopped:  # nothing was routed to an instance once it was draining
        slot = run.slots[index]
        assert slot.routed_after_drain == 0 and slot.stopped_at is not None
        drained_at = next(t for t, kind, i in run.events if kind == "down" and i == index)
        assert not [r for r in run.requests if run.placement.get(r.request_id) == index and r.arrival_time > drained_at]
    point = fleet_point(run, "paged", "x")
    assert point.scale_ups >= 1 and point.scale_downs >= 1 and point.routed_after_drain == 0
    assert point.instance_seconds < 3 * run.end_s


def test_a_draining_instance_is_never_chosen():
    fleet = SimulatedFleet(make_instance, make_policy("round-robin"), 3, 16, tick_s=0.2)
    fleet.slots[1].state, fleet.slots[1].drained_at = DRAINING, 0.0
    run = fleet.run(arrivals(60, 20.0), "round-robin")
    assert fleet.slots[1].routed == 0 and run.slots[1].state == "stopped"
    assert {run.placement[r.request_id] for r in run.requests} == {0, 2}


# -- the cost follows the work: idle instances and idle time cost nothing --------------------------------------
def _gapped(gap_s: float, count: int = 60, rate: float = 20.0) -> list:
    """Two bursts of arrivals with an idle gap of ``gap_s`` between them."""
    load = arrivals(count, rate)
    half = count // 2
    return [(t + (gap_s if i >= half else 0.0), request) for i, (t, request) in enumerate(load)]


@pytest.mark.parametrize("autoscale", [None, AutoscaleSettings(0.5, 0.2, 2.0, 1, 4)])
@pytest.mark.parametrize("policy", ["round-robin", "most-free-blocks"])
def test_an_idle_gap_skipped_gives_the_figures_of_every_tick_taken(policy, autoscale, monkeypatch):
    """The ticks of an idle gap are not taken one by one, and every figure is the same as when they are."""

    def run(skip: bool):
        if not skip:
            monkeypatch.setattr(SimulatedFleet, "_idle", lambda self: False)
        fleet = SimulatedFleet(make_instance, make_policy(policy, 0, 16), 3, 16, autoscale, startup_s=1.0, tick_s=0.25)
        result = fleet.run(_gapped(400.0), policy)
        monkeypatch.undo()
        return result

    skipped, every = run(True), run(False)
    assert len(skipped.fleet_samples) < len(every.fleet_samples) / 5  # ~1,600 ticks for the gap alone
    assert sum(skipped.tick_weight(t) for t, _, _ in skipped.fleet_samples) == len(every.fleet_samples)
    point, reference = fleet_point(skipped, "paged", "t"), fleet_point(every, "paged", "t")
    assert _differences(point.to_json(), reference.to_json()) == []
    assert point.scale_downs == (2 if autoscale else 0)  # the autoscaler still drains idle instances in the gap


def _differences(mine, theirs, where: str = "") -> list[str]:
    """Where two JSON-like values differ (floats to 1e-12 relative)."""
    if isinstance(mine, dict) and isinstance(theirs, dict):
        return [
            d
            for key in mine.keys() | theirs.keys()
            for d in _differences(mine.get(key), theirs.get(key), f"{where}.{key}")
        ]
    if isinstance(mine, list) and isinstance(theirs, list) and len(mine) == len(theirs):
        return [
            d for i, (a, b) in enumerate(zip(mine, theirs, strict=True)) for d in _differences(a, b, f"{where}[{i}]")
        ]
    if isinstance(mine, float) and isinstance(theirs, float):
        return [] if math.isclose(mine, theirs, rel_tol=1e-12, abs_tol=1e-12) else [f"{where}: {mine} != {theirs}"]
    return [] if mine == theirs else [f"{where}: {mine!r} != {theirs!r}"]


def test_a_one_year_gap_costs_what_its_requests_cost(monkeypatch):
    """The clock of an idle fleet jumps to the next arrival: a year costs nothing, per instance or per tick."""
    steps = {"n": 0}
    step = SimulatedInstance.step

    def counted(self, horizon=float("inf")):
        steps["n"] += 1
        return step(self, horizon)

    monkeypatch.setattr(SimulatedInstance, "step", counted)
    year = 365 * 86400.0
    run = SimulatedFleet(make_instance, make_policy("round-robin", 0, 16), 256, 16, tick_s=1.0).run(
        _gapped(year, count=20, rate=5.0), "round-robin"
    )
    run.check_complete(20)
    assert run.end_s > year and len(run.fleet_samples) < 200
    assert steps["n"] < 2_000  # 20 requests' prefills and decode spans; every instance x tick would be 8e9
    point = fleet_point(run, "paged", "t")
    assert point.instances_mean == 256 and 0 < point.kv_usage_mean < 1e-5  # a time average over a year


def test_idle_instances_are_not_stepped(monkeypatch):
    """1,024 instances and a handful of requests: only the instances holding one are ever stepped."""
    stepped: set[int] = set()
    step_until = SimulatedInstance.step_until

    def tracked(self, t):
        if self.scheduler.running or self.scheduler.waiting:
            stepped.add(id(self))
        return step_until(self, t)

    monkeypatch.setattr(SimulatedInstance, "step_until", tracked)
    calls = {"stats": 0}
    stats = SimulatedInstance.stats

    def counted(self):
        calls["stats"] += 1
        return stats(self)

    monkeypatch.setattr(SimulatedInstance, "stats", counted)
    run = SimulatedFleet(make_instance, make_policy("least-requests", 0, 16), 1024, 16, tick_s=0.5).run(
        arrivals(8, 4.0), "least-requests"
    )
    run.check_complete(8)
    assert len(stepped) == len(set(run.placement.values())) < 8  # the few instances that held a request
    assert calls["stats"] < 1024 + 200  # one report each at the start, then only the instances that changed
