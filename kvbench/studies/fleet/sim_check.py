"""The simulator against a real fleet: the same arrivals through simulated instances given the servers' KV
budgets and the real run's step times (the servers' own step counters, else a fit to its requests), policy by
policy, and where the two disagree.

What makes a simulated answer for 256 instances believable is that it matches a real fleet of two where both
can be run: the share of requests each instance took, the cluster's prefix hit rate and the preemptions.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import astuple, replace

import numpy as np

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.simulator import SimulatedInstance
from kvbench.engine.step_totals import StepTotals
from kvbench.engine.timing import MeasuredTiming
from kvbench.errors import KvbenchError
from kvbench.results.fleet_point import FleetPoint
from kvbench.results.simulator_check import TIMED_BY_COUNTERS, TIMED_BY_REQUESTS, PolicyCheck, SimulatorCheck
from kvbench.studies.fleet.core import FleetRun
from kvbench.studies.fleet.results import fleet_point
from kvbench.studies.fleet.routing import KvWeights, make_policy
from kvbench.studies.fleet.sim_driver import SimulatedFleet

AGREEMENT_POINTS = 5.0  # share and hit rate within this many percentage points: the simulator agrees
LOWER_ROUNDS = 3  # times the prefill line is fitted again on the half of the requests below it
MIN_FIT_POINTS = 8


def counted_timing(runs: Sequence[FleetRun]) -> MeasuredTiming | None:
    """Step times from the servers' own step counters (``kvbench serve`` exports them): between two scrapes of a
    server, its decode steps took ``decode_s`` each plus ``decode_per_running_s`` per token (one per running
    request), its prefill steps ``prefill_base_s`` each plus ``prefill_per_token_s`` per token computed; each pair
    a least-squares fit over every scrape interval of every run. None where the servers export no counters or
    fewer than MIN_FIT_POINTS intervals saw steps of either phase: the requests' timings are fitted instead."""
    decode: list[tuple[float, float, float]] = []  # (steps, tokens, seconds) of one interval
    prefill: list[tuple[float, float, float]] = []
    for run in runs:
        last: dict[int, StepTotals] = {}
        for _t, instance, totals in run.step_samples:
            before, last[instance] = last.get(instance), totals
            if before is None:
                continue
            steps = totals.since(before)
            if min(astuple(steps)) < 0:  # the server restarted: its counters began again
                continue
            if steps.decode_steps > 0:
                decode.append((steps.decode_steps, steps.decode_tokens, steps.decode_seconds))
            if steps.prefill_steps > 0:
                prefill.append((steps.prefill_steps, steps.prefill_tokens, steps.prefill_seconds))
    if len(decode) < MIN_FIT_POINTS or len(prefill) < MIN_FIT_POINTS:
        return None
    decode_s, per_running = _per_step_and_token(decode)
    prefill_s, per_token = _per_step_and_token(prefill)
    return MeasuredTiming(max(decode_s, 1e-6), prefill_s, per_token, per_running)


def _per_step_and_token(intervals: list[tuple[float, float, float]]) -> tuple[float, float]:
    """(seconds a step, seconds a token) with ``seconds = a step x steps + a token x tokens`` closest to every
    interval's seconds (least squares, neither term below 0: a negative one is dropped and the other refitted)."""
    steps, tokens, seconds = (np.array(column, dtype=np.float64) for column in zip(*intervals, strict=True))
    (per_step, per_token), *_ = np.linalg.lstsq(np.column_stack([steps, tokens]), seconds, rcond=None)
    if per_token < 0 or per_step < 0:
        if per_token < 0 or not tokens.sum():
            return float(seconds.sum() / steps.sum()), 0.0
        return 0.0, float(seconds.sum() / tokens.sum())
    return float(per_step), float(per_token)


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
    counted = counted_timing(runs)
    timing = counted if counted is not None else fit_timing(runs)
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
        # each policy with the step times its own run's servers counted: servers sharing a machine step slower
        # while the others work, how much they work turns on the policy, and simulated twins never slow each other
        own = counted_timing([run]) if counted is not None else None
        fleet = SimulatedFleet(
            _twins(configs, own or timing),
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
        policies.append(replace(compare(run.policy, real, simulated), timing=own))
    source = TIMED_BY_COUNTERS if counted is not None else TIMED_BY_REQUESTS
    return SimulatorCheck(timing, [c.num_blocks for c in configs], policies, source)


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
