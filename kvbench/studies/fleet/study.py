"""Run every routing policy on the same arrivals, one after the other, point by point.

Simulated fleets run in this process (or, asked to, one Ray task per policy); real ones run their instances
as Ray actors that load the model once and serve every policy in turn (a fresh pool and prefix cache per
policy); a fleet of servers over HTTP is routed from this process, its prefix caches reset between policies,
and then checked against the simulator given its measured step times and KV budgets (``sim_check``). Each
policy's point is appended to ``results.jsonl`` as soon as it is done, so an interrupted run keeps what it
measured; actors and Ray are shut down however the run ends.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.fileio import append_jsonl, write_json_atomic
from kvbench.results.fleet_point import FleetPoint
from kvbench.studies.fleet.core import FleetRun
from kvbench.studies.fleet.fleet_setup import FleetSetup
from kvbench.studies.fleet.pool import InstancePool
from kvbench.studies.fleet.ray_driver import RayFleet
from kvbench.studies.fleet.ray_runtime import check_gpus_here, ray_session
from kvbench.studies.fleet.results import fleet_point, fleet_series
from kvbench.studies.fleet.routing import RoutingPolicy, make_policy, needs_kv_events
from kvbench.studies.fleet.server_driver import ServerFleet, run_policies
from kvbench.studies.fleet.sim_check import check_simulator
from kvbench.studies.fleet.sim_driver import SimulatedFleet

Progress = Callable[[str, int, int], None]  # (policy, requests ended, requests in all)


def run_fleet(
    setup: FleetSetup,
    run_dir: Path,
    on_point: Callable[[FleetPoint], None] | None = None,
    faults: Sequence[tuple[float, int]] = (),
    metrics=None,
    pool=None,
) -> list[FleetPoint]:
    """Every policy's point, in the order asked; each also written to results.jsonl and its series file.

    ``faults``: (seconds, instance) actors killed during the first policy (tests); ``pool``: instances already
    started (an :class:`~kvbench.studies.fleet.pool.InstancePool`), else the run starts and stops its own.
    """
    results = run_dir / "results.jsonl"
    if results.exists():
        raise KvbenchError(f"{run_dir} already holds results; choose another run directory")
    points: list[FleetPoint] = []
    runs: list[FleetRun] = []

    def record(run: FleetRun) -> None:
        run.check_complete(len(setup.pairs))
        runs.append(run)
        point = fleet_point(run, setup.config.engine, setup.spec.name, setup.options.slo)
        write_json_atomic(run_dir / f"fleet-{run.policy}.json", fleet_series(run).to_json())
        append_jsonl(results, point.to_json())
        points.append(point)
        if on_point is not None:
            on_point(point)

    if setup.options.servers is not None:
        fleet = _run_on_servers(setup, record)
        if runs:
            check = check_simulator(
                runs,
                points,
                setup.arrivals(),
                setup.config,
                [(server.total_blocks, fleet.block_size) for server in fleet.servers],
                setup.seed,
                setup.options.weights,
                setup.options.servers.scrape_interval_s,
            )
            write_json_atomic(run_dir / "simulator-check.json", check.to_json())
            setup.simulator_check = check
    elif setup.options.simulate and not setup.options.simulate_on_ray:
        for name in setup.options.policies:
            record(simulate_policy(setup, name))
    elif setup.options.simulate:
        _simulate_on_ray(setup, record)
    else:
        _run_on_ray(setup, record, faults, metrics, pool)
    return points


def _run_on_servers(setup: FleetSetup, record: Callable[[FleetRun], None]) -> ServerFleet:
    """Every policy on the servers, one after the other (the servers are probed once, first)."""
    servers = setup.options.servers
    assert servers is not None
    fleet = ServerFleet(servers.targets, servers.limits, servers.scrape_interval_s, setup.config.block_size)

    def policies() -> Iterator[tuple[str, RoutingPolicy]]:  # made once the servers said their block size
        for name in setup.options.policies:
            yield name, make_policy(name, setup.seed, fleet.block_size, setup.options.weights)

    asyncio.run(run_policies(fleet, policies, setup.arrivals, record))
    return fleet


def simulate_policy(setup: FleetSetup, name: str) -> FleetRun:
    options = setup.options
    fleet = SimulatedFleet(
        setup.make_simulated_instance,
        make_policy(name, setup.seed, setup.config.block_size, options.weights),
        options.instances,
        setup.config.block_size,
        options.autoscale,
        options.startup_s,
        setup.tick_s(),
    )
    return fleet.run(setup.arrivals(), name)


def _simulate_on_ray(setup: FleetSetup, record: Callable[[FleetRun], None]) -> None:
    """One Ray task per policy; points are recorded in the order asked, as they come."""
    with ray_session(setup.options.ray_address, setup.options.ray_cpus) as ray:
        task = ray.remote(num_cpus=1)(simulate_policy)
        refs = {task.remote(setup, name): name for name in setup.options.policies}
        try:
            for ref in refs:
                record(ray.get(ref))
        finally:  # interrupted: the policies still running are cancelled
            _done, running = ray.wait(list(refs), num_returns=len(refs), timeout=0)
            for ref in running:
                ray.cancel(ref)


def _run_on_ray(setup: FleetSetup, record: Callable[[FleetRun], None], faults, metrics, pool=None) -> None:
    options = setup.options
    if pool is not None:
        _run_policies(setup, record, faults, metrics, pool, RayFleet)
        return
    check_gpus_here(options.device, False, options.ray_address, options.instances)
    with (
        ray_session(options.ray_address, options.ray_cpus) as ray,
        InstancePool(ray, setup.instance_spec(), options.cpus_per_instance, options.instances) as own,
    ):
        _run_policies(setup, record, faults, metrics, own, RayFleet)


def _run_policies(setup: FleetSetup, record, faults, metrics, pool, fleet_class) -> None:
    options = setup.options
    if unheard := [name for name in options.policies if needs_kv_events(name)]:
        raise KvbenchError(
            f"{unheard[0]} reads each instance's KV events, which kvbench's own instances on Ray do not publish: "
            "run it simulated, or on servers that publish them"
        )
    for number, name in enumerate(options.policies):
        base = pool.base(options.instances)  # a base instance that died under the last policy is replaced
        policy = make_policy(name, setup.seed, setup.config.block_size, options.weights)
        fleet = fleet_class(
            pool.ray,
            pool.new_actor,
            base,
            policy,
            setup.instance_spec(),
            options.autoscale,
            setup.tick_s(),
            faults if number == 0 else (),
            metrics,
        )
        if metrics is not None:
            metrics.begin_policy(name)
        run = fleet.run(setup.arrivals(), name)
        pool.forget_dead(run)
        record(run)
