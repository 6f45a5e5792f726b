"""The Ray fleet end to end: a local Ray with 2 CPUs and 2 tiny CPU instances (tensor engine) as actors.

Every request ends exactly once (finished, or rejected with a reason) under every policy; an instance killed
mid-run has its requests re-routed or failed with a reason; autoscaling adds an instance under a load that
keeps block usage above 80% and removes it (after draining it, with nothing routed to it) when the load is
gone. One Ray and one pool of instances serve the whole module: starting a tensor-engine actor costs seconds.
"""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")

from kvbench.engine.request import RequestStatus  # noqa: E402
from kvbench.studies.fleet.core import AutoscaleSettings  # noqa: E402
from kvbench.studies.fleet.fleet_setup import FleetOptions, FleetSetup  # noqa: E402
from kvbench.studies.fleet.pool import InstancePool  # noqa: E402
from kvbench.studies.fleet.routing import DEFAULT_POLICIES  # noqa: E402
from kvbench.studies.fleet.study import run_fleet  # noqa: E402

SCENARIO = """
description = "test: tiny fleet"
max_len = 64
mean_len = 16
distribution = "uniform"
sigma = 0.5
prompt_ratio = 0.5
requests = 40
block_size = 4

[budget]
slots = 160
"""


@pytest.fixture(scope="module")
def scenario(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("fleet") / "tiny.toml"
    path.write_text(SCENARIO)
    return str(path)


@pytest.fixture(scope="module")
def pool(scenario, ray_local):
    """Two tiny instances on the session's Ray (2 CPUs), each reserving half a CPU: room for one autoscaled more."""
    setup = FleetSetup.resolve(FleetOptions(scenario=scenario, rate=1.0, instances=2))
    with InstancePool(ray_local, setup.instance_spec(), cpus_per_instance=0.5) as instances:
        instances.base(2)
        yield instances


def _run(scenario, tmp_path, pool, faults=(), **changes):
    options = FleetOptions(
        **{"scenario": scenario, "instances": 2, "cpus_per_instance": 0.5, "tick_s": 0.05, **changes}
    )
    setup = FleetSetup.resolve(options)
    points = run_fleet(setup, tmp_path, faults=faults, pool=pool)
    lines = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    assert lines == [p.to_json() for p in points]  # each point as written when it finished
    return setup, points


def test_every_request_ends_exactly_once_under_every_policy(scenario, tmp_path, pool):
    setup, points = _run(scenario, tmp_path, pool, rate=40.0, requests=40)
    assert [p.policy for p in points] == list(DEFAULT_POLICIES)
    for point in points:  # run_fleet checked each run: 40 distinct requests, each finished or rejected with a reason
        assert point.completed == 40 and point.rejected == 0, point.policy
        assert sum(i.routed for i in point.instances) == 40
        assert all(i.startup_s > 0 for i in point.instances)  # measured when the actors loaded
        assert point.p50_ttft_ms > 0 and point.output_throughput > 0
        assert point.simulated is False and point.routed_after_drain == 0
    for policy in DEFAULT_POLICIES:
        assert (tmp_path / f"fleet-{policy}.json").is_file()


def test_autoscaling_adds_an_instance_above_80_percent_and_removes_it_after(scenario, tmp_path, pool):
    """A burst keeps one instance's blocks above 80%; a trickle of short requests after it lasts long
    enough for the added instance to start (its start-up measured on this machine) and be drained."""
    startup = max(s for _, s in pool.base(2))
    burst = [(0.003 * i, 12, 24) for i in range(300)]  # far more than one instance serves: its blocks stay full
    trickle_s = 2.5 * startup + 6.0  # margin: a start-up on a loaded machine was seen to take twice the first
    trickle = [(1.2 + 0.25 * i, 4, 2) for i in range(int(trickle_s / 0.25))]
    path = tmp_path / "arrivals.jsonl"
    path.write_text(
        "".join(
            json.dumps({"prompt_token_ids": [1 + (i % 500)] * p, "output_len": o, "arrival_time": t}) + "\n"
            for i, (t, p, o) in enumerate(burst + trickle)
        )
    )
    settings = AutoscaleSettings(scale_up=0.8, scale_down=0.3, window_s=0.2, min_instances=1, max_instances=2)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    _setup, points = _run(
        scenario, run_dir, pool, requests_file=path, policies=("most-free-blocks",), autoscale=settings, instances=1
    )
    point = points[0]
    assert point.completed == len(burst) + len(trickle)
    assert point.scale_ups >= 1 and point.scale_downs >= 1
    added = point.instances[1]
    assert added.startup_s > 0 and added.ready_at_s > added.started_at_s  # measured, not assumed
    removed = [i for i in point.instances if i.state == "stopped"]
    assert removed and all(i.routed_after_drain == 0 for i in removed) and point.routed_after_drain == 0
    series = json.loads((run_dir / "fleet-most-free-blocks.json").read_text())
    kinds = [kind for _, kind, _ in series["events"]]
    assert kinds.index("up") < kinds.index("ready") < kinds.index("down") < kinds.index("stopped")
    assert max(n for _, n, _ in series["instances"]) == 2 and series["instances"][-1][1] == 1


def test_killing_an_instance_mid_run_reroutes_or_fails_its_requests_with_a_reason(scenario, tmp_path, pool):
    _setup, points = _run(
        scenario, tmp_path, pool, faults=[(0.4, 1)], rate=40.0, requests=40, policies=("round-robin",)
    )
    point = points[0]
    dead = point.instances[1]
    assert dead.state == "dead" and "instance 1 failed" in dead.failure
    assert point.completed + point.rejected == 40  # none silently lost (run_fleet checked each one)
    assert point.rerouted + point.rejected_by_reason.get("instance_failed", 0) > 0
    series = json.loads((tmp_path / "fleet-round-robin.json").read_text())
    kinds = [kind for _, kind, _ in series["events"]]
    assert "killed" in kinds and "died" in kinds
    assert RequestStatus.FINISHED.value == "finished"


def test_simulated_policies_as_ray_tasks_equal_the_in_process_run(tmp_path, ray_local):
    options = dict(
        simulate=True, instances=3, rate=30.0, requests=200, policies=("round-robin", "most-free-blocks"), tick_s=0.5
    )
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    local = run_fleet(FleetSetup.resolve(FleetOptions(**options)), tmp_path / "a")
    fanned = run_fleet(FleetSetup.resolve(FleetOptions(**options, simulate_on_ray=True)), tmp_path / "b")
    assert fanned == local
