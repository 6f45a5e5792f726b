"""The simulator against a real fleet: the same arrivals through simulated instances given the servers' KV
budgets and step times fitted to the real run's requests, policy by policy, and where the two disagree.

What makes a simulated answer for 256 instances believable is that it matches a real fleet of two where both
can be run: the share of requests each instance took, the cluster's prefix hit rate and the preemptions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.simulator import SimulatedInstance
from kvbench.engine.timing import MeasuredTiming
from kvbench.errors import KvbenchError
from kvbench.results.fleet_point import FleetPoint
from kvbench.results.simulator_check import PolicyCheck, SimulatorCheck
from kvbench.studies.fleet.core import FleetRun
from kvbench.studies.fleet.results import fleet_point
from kvbench.studies.fleet.routing import KvWeights, make_policy
from kvbench.studies.fleet.sim_driver import SimulatedFleet

AGREEMENT_POINTS = 5.0  # share and hit rate within this many percentage points: the simulator agrees
LOWER_ROUNDS = 3  # times the prefill line is fitted again on the half of the requests below it
MIN_FIT_POINTS = 8


def fit_timing(runs: Sequence[FleetRun]) -> MeasuredTiming:
    """Step times from the finished requests of every run. The decode step is a line of each request's time per
    output token after the first against the requests its server was running meanwhile (its scrapes), by the
    median of pairwise slopes, which the requests a prefill held up do not pull; with too few scraped requests,
    the median time per output token whatever the batch. The prefill is a least-squares line of time to first
    token against the tokens not cached, fitted again, up to three times, on the half of the requests below it
    (those that queued least: under load the time to first token is mostly queueing)."""
    done = [
        r
        for run in runs
        for r in run.requests
        if r.status is RequestStatus.FINISHED and r.first_token_time is not None and r.finish_time is not None
    ]
    if not done:
        raise KvbenchError("no request finished on the servers: there are no step times to fit the simulator to")
    first = [float(r.first_token_time or 0.0) for r in done]
    decode, per_running = _decode_step(runs)
    uncached = np.array([r.prompt_len - r.num_cached_tokens for r in done], dtype=np.float64)
    ttft = np.array([t - r.arrival_time for r, t in zip(done, first, strict=True)], dtype=np.float64)
    base, slope = _line(uncached, ttft)
    for _ in range(LOWER_ROUNDS):  # towards the lower envelope: the requests that queued least
        keep = ttft - (base + slope * uncached) <= np.median(ttft - (base + slope * uncached))
        if keep.sum() < MIN_FIT_POINTS:
            break
        uncached, ttft = uncached[keep], ttft[keep]
        base, slope = _line(uncached, ttft)
    return MeasuredTiming(max(decode, 1e-6), max(base, 0.0), max(slope, 0.0), per_running)


def _decode_step(runs: Sequence[FleetRun]) -> tuple[float, float]:
    """(seconds a decode step takes with no batch, seconds each running request adds), from each finished
    request's time per output token and the mean of its server's running count scraped while it decoded; the
    median time per output token and no batch term where fewer than MIN_FIT_POINTS requests were scraped while
    decoding, or all at one batch."""
    every, batch, scraped = [], [], []
    for run in runs:
        by_instance: dict[int, list[tuple[float, int]]] = {}
        for t, instance, _used, _total, running, _waiting in run.samples:
            by_instance.setdefault(instance, []).append((t, running))
        for r in run.requests:
            if r.status is not RequestStatus.FINISHED or r.num_outputs < 2:
                continue
            if r.first_token_time is None or r.finish_time is None:
                continue
            start, end = float(r.first_token_time), float(r.finish_time)
            per_token = (end - start) / (r.num_outputs - 1)
            every.append(per_token)
            seen = [n for t, n in by_instance.get(run.placement.get(r.request_id, -1), []) if start <= t <= end]
            if seen:
                batch.append(float(np.mean(seen)))
                scraped.append(per_token)
    if len(batch) < MIN_FIT_POINTS or float(np.ptp(batch)) == 0.0:
        return (float(np.median(every)) if every else 0.0), 0.0
    from scipy.stats import theilslopes  # scipy loads when a fleet is checked, not with the command

    slope, intercept, _low, _high = theilslopes(scraped, batch, method="joint")
    return float(intercept), max(float(slope), 0.0)


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    if len(x) < 2 or float(np.ptp(x)) == 0.0:
        return float(np.median(y)), 0.0
    slope, base = np.polyfit(x, y, 1)
    return float(base), float(slope)


def check_simulator(
    runs: Sequence[FleetRun],
    points: Sequence[FleetPoint],
    arrivals: Sequence[tuple[float, Request]],
    config: EngineConfig,
    servers: Sequence[tuple[int, int]],
    seed: int,
    weights: KvWeights,
    scrape_interval_s: float,
) -> SimulatorCheck:
    """Each real policy beside the simulator's run of it. ``servers``: (total blocks, block size) of each server,
    each twin given its server's pool; ``arrivals``: the requests as the real run replayed them (fresh copies); the
    simulated router reads its instances every ``scrape_interval_s``, as the real one scraped them."""
    timing = fit_timing(runs)
    block_size = servers[0][1]
    configs = [
        replace(config, block_size=block_size, num_blocks=total, enable_prefix_caching=True) for total, _ in servers
    ]
    policies: list[PolicyCheck] = []
    for run, real in zip(runs, points, strict=True):
        if any(slot.failure for slot in run.slots):
            policies.append(PolicyCheck(run.policy, skipped="a server died during the real run"))
            continue
        requests = [
            (t, Request(r.request_id, r.prompt_len, r.max_tokens, prompt_token_ids=r.prompt_token_ids))
            for t, r in arrivals
        ]

        fleet = SimulatedFleet(
            _twins(configs, timing),
            make_policy(run.policy, seed, block_size, weights),
            len(servers),
            block_size,
            None,
            0.0,
            scrape_interval_s,
            reports_at_ticks=True,  # the real router read the servers at each scrape
        )
        sim_run = fleet.run(requests, run.policy)
        simulated = replace(fleet_point(sim_run, config.engine, ""), prefix_hit_rate=answered_hit_rate(sim_run))
        policies.append(compare(run.policy, real, simulated))
    return SimulatorCheck(timing, [c.num_blocks for c in configs], policies)


def _twins(configs: Sequence[EngineConfig], timing: MeasuredTiming) -> Callable[[float], SimulatedInstance]:
    """The servers' twins, one per call: without autoscaling a fleet builds its instances once, in order."""
    built: list[SimulatedInstance] = []

    def make(start: float) -> SimulatedInstance:
        own = configs[len(built)]
        built.append(SimulatedInstance(own.build_manager(), timing, own, keep_timeline=False, start_time=start))
        return built[-1]

    return make


def answered_hit_rate(run: FleetRun) -> float:
    """Cached prompt tokens over prompt tokens, each request counted at its first admission: what servers report
    in their answers (the instances' own counters count a preempted request's prefill again)."""
    done = [r for r in run.requests if r.status is RequestStatus.FINISHED]
    prompt = sum(r.prompt_len for r in done)
    return sum(r.first_cached_tokens or 0 for r in done) / prompt if prompt else 0.0


def compare(policy: str, real: FleetPoint, simulated: FleetPoint) -> PolicyCheck:
    """The figures side by side, and the gaps in percentage points."""
    real_share, sim_share = _shares(real), _shares(simulated)
    share_gap = max((abs(a - b) for a, b in zip(real_share, sim_share, strict=True)), default=0.0) * 100
    real_hit, sim_hit = real.prefix_hit_rate, simulated.prefix_hit_rate
    hit_gap = (real_hit - sim_hit) * 100 if real_hit is not None and sim_hit is not None else None
    return PolicyCheck(
        policy=policy,
        share_real=real_share,
        share_simulated=sim_share,
        share_gap_points=share_gap,
        hit_rate_real=real_hit,
        hit_rate_simulated=sim_hit,
        hit_rate_gap_points=hit_gap,
        preemptions_real=real.preemptions,
        preemptions_simulated=simulated.preemptions,
        p50_ttft_ms_real=real.p50_ttft_ms,
        p50_ttft_ms_simulated=simulated.p50_ttft_ms,
        agrees=share_gap <= AGREEMENT_POINTS and (hit_gap is None or abs(hit_gap) <= AGREEMENT_POINTS),
    )


def _shares(point: FleetPoint) -> list[float]:
    routed = [instance.routed for instance in point.instances]
    total = sum(routed)
    return [count / total if total else 0.0 for count in routed]
