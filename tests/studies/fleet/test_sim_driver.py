"""The simulated fleet: every request ends once under every policy, autoscaling by block usage, draining."""

from __future__ import annotations

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
    requests = [Request(i, p, o, prompt_token_ids=ids) for i, ((p, o), ids) in enumerate(zip(pairs, prompts, strict=True))]
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
    assert point["completed"] == 297 and point["rejected"] == 3 and point["rejected_by_reason"] == {"too_long": 3}
    assert sum(i["routed"] for i in point["instances"]) == 300
    assert point["p99_ttft_ms"] >= point["p50_ttft_ms"] > 0 and point["output_throughput"] > 0
    assert point["instance_seconds"] == pytest.approx(3 * run.end_s)
    for slot in run.slots:
        assert slot.stats.free_blocks == slot.stats.total_blocks  # every block back (cached ones are free)
    series = fleet_series(run)
    assert set(series["usage"]) == {"0", "1", "2"} and series["ttft_cdf"][-1][1] == 1.0


def test_the_same_arrivals_give_the_same_run():
    a = SimulatedFleet(make_instance, make_policy("random", 5), 3, 16, tick_s=0.2).run(arrivals(200, 50.0), "random")
    b = SimulatedFleet(make_instance, make_policy("random", 5), 3, 16, tick_s=0.2).run(arrivals(200, 50.0), "random")
    assert fleet_point(a, "paged", "x") == fleet_point(b, "paged", "x")


def test_prefix_affinity_hits_the_prefix_cache_more_than_round_robin():
    points = {}
    for policy in ("round-robin", "prefix-affinity"):
        run = SimulatedFleet(make_instance, make_policy(policy, 0, 16), 4, 16, tick_s=0.2).run(
            arrivals(300, 30.0, prefixes=4), policy)
        points[policy] = fleet_point(run, "paged", "x")
    assert points["prefix-affinity"]["prefix_hit_rate"] > points["round-robin"]["prefix_hit_rate"] > 0


def test_most_free_blocks_balances_block_usage_better_than_round_robin():
    imbalance = {}
    for policy in ("round-robin", "most-free-blocks"):
        run = SimulatedFleet(make_instance, make_policy(policy, 0, 16), 4, 16, tick_s=0.1).run(
            arrivals(600, 90.0), policy)
        imbalance[policy] = fleet_point(run, "paged", "x")["free_blocks_imbalance_mean"]
    assert imbalance["most-free-blocks"] < imbalance["round-robin"]


def test_autoscaling_adds_an_instance_above_80_percent_and_removes_it_after():
    burst = arrivals(500, 120.0)  # keeps one instance's blocks above 80% ...
    calm_start = burst[-1][0] + 1.0
    calm = [(calm_start + 0.5 * i, Request(1000 + i, 20, 10)) for i in range(40)]  # ... then a trickle
    settings = AutoscaleSettings(scale_up=0.8, scale_down=0.3, window_s=0.5, min_instances=1, max_instances=3)
    fleet = SimulatedFleet(make_instance, make_policy("most-free-blocks", 0, 16), 1, 16, autoscale=settings,
                           startup_s=1.0, tick_s=0.1)
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
    assert point["scale_ups"] >= 1 and point["scale_downs"] >= 1 and point["routed_after_drain"] == 0
    assert point["instance_seconds"] < 3 * run.end_s


def test_a_draining_instance_is_never_chosen():
    fleet = SimulatedFleet(make_instance, make_policy("round-robin"), 3, 16, tick_s=0.2)
    fleet.slots[1].state, fleet.slots[1].drained_at = DRAINING, 0.0
    run = fleet.run(arrivals(60, 20.0), "round-robin")
    assert fleet.slots[1].routed == 0 and run.slots[1].state == "stopped"
    assert {run.placement[r.request_id] for r in run.requests} == {0, 2}
