"""The fleet study and the simulated fleet's speed.

1. The seed article's budget (Llama-2-13B fp16 on an A100-80GB, max-len 2048, the article's lengths), 4
   simulated instances, at the Poisson rate that loads the fleet to about 85% block usage (searched: the mean
   usage of the fleet over the second half of the arrivals, under round-robin): most-free-blocks against
   round-robin (and the
   other policies) on the same arrivals. Writes a run directory with the plots (look at fleet_usage.png).
2. Speed: 64 simulated instances, 10,000 requests in all, rate scaled to the same load per instance (goal:
   under 60 s on the project's 2-core machine).
3. How the cost grows (``--growth``): wall time and peak memory of one policy's simulated run as the instances
   grow at a fixed request count and rate (16 to 1,024 instances, 3,000 requests at 1,000 req/s), and as the
   requests grow at a fixed fleet (64 instances, 1,000 to 30,000 requests at 85% load). Each run in a process
   of its own (its peak RSS is its own), with the engine steps it simulated: the cost should follow the
   steps and arrivals, not the instances or the simulated time.

    python benchmarks/bench_fleet.py [--out reports/bench-fleet] [--requests 4000] [--skip-scale] [--growth]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from kvbench.report.fleet_report import write_outputs
from kvbench.results.fleet_meta import FleetMeta
from kvbench.studies.fleet.fleet_setup import FleetOptions, FleetSetup
from kvbench.studies.fleet.results import fleet_point, fleet_series
from kvbench.studies.fleet.routing import POLICIES
from kvbench.studies.fleet.study import simulate_policy
from kvbench.studies.fleet.target_rate import TARGET_USAGE, rate_for_usage


def setup_for(rate: float, instances: int, requests: int, policies=tuple(POLICIES)) -> FleetSetup:
    return FleetSetup.resolve(
        FleetOptions(
            scenario="article",
            model="llama-2-13b",
            gpu="a100-80g",
            simulate=True,
            instances=instances,
            rate=rate,
            requests=requests,
            policies=policies,
            seed=0,
        )
    )


def arrival_usage(run, last_arrival: float) -> float:
    """Fleet block usage averaged over the second half of the arrivals: the steady state (the first half fills
    the pools from empty, the tail after the last arrival drains them)."""
    ticks: dict[float, list] = {}
    for t, _, used, total, _, _ in run.samples:
        if last_arrival / 2 <= t <= last_arrival:
            ticks.setdefault(t, []).append((used, total))
    return float(np.mean([sum(u for u, _ in rows) / sum(t for _, t in rows) for rows in ticks.values()]))


def find_rate(requests: int) -> tuple[float, float]:
    """Bisection on the rate for round-robin's mean steady usage ~ TARGET_USAGE."""
    low, high = 10.0, 80.0
    best = (low, 0.0)
    for _ in range(9):
        rate = (low + high) / 2
        setup = setup_for(rate, 4, requests, ("round-robin",))
        usage = arrival_usage(simulate_policy(setup, "round-robin"), setup.times[-1])
        if abs(usage - TARGET_USAGE) < abs(best[1] - TARGET_USAGE):
            best = (rate, usage)
        if usage < TARGET_USAGE:
            low = rate
        else:
            high = rate
    return best


def study(out: Path, requests: int) -> None:
    rate, usage = find_rate(requests)
    print(
        f"rate {rate:.2f} req/s loads 4 instances to {100 * usage:.1f}% block usage (round-robin, second half of "
        f"the arrivals)"
    )
    setup = setup_for(rate, 4, requests)
    estimate = rate_for_usage(
        setup.pairs, setup.timing, setup.config.block_size, setup.config.num_blocks, 4, TARGET_USAGE
    )
    print(f"estimated in closed form (what `kvbench fleet --simulate` uses without --rate): {estimate.rate:.2f} req/s")
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("*"):
        stale.unlink()
    points = []
    met: dict[str, float] = {}  # the KV usage arrivals met, per policy
    for name in setup.options.policies:
        run = simulate_policy(setup, name)
        point = fleet_point(run, "paged", "article")
        met[name] = arrival_usage(run, setup.times[-1])
        from kvbench.fileio import write_json_atomic

        write_json_atomic(out / f"fleet-{name}.json", fleet_series(run).to_json())
        points.append(point)
    write_outputs(out, FleetMeta.from_json(setup.meta()), points)
    print(
        f"{'policy':>17} {'p50 TTFT':>9} {'p99 TTFT':>9} {'preempt':>8} {'imbal mean':>10} {'imbal p99':>9} "
        f"{'usage':>6} {'out tok/s':>9}"
    )
    for p in points:
        print(
            f"{p.policy:>17} {p.p50_ttft_ms or 0:8.0f}ms {p.p99_ttft_ms or 0:8.0f}ms {p.preemptions:8d} "
            f"{p.free_blocks_imbalance_mean or 0:10.0f} {p.free_blocks_imbalance_p99 or 0:9.0f} "
            f"{100 * met[p.policy]:5.1f}% {p.output_throughput:9.1f}"
        )
    by = {p.policy: p for p in points}
    rr, mfb = by["round-robin"], by["most-free-blocks"]
    print(
        f"most-free-blocks / round-robin: p99 TTFT x{(mfb.p99_ttft_ms or 0) / (rr.p99_ttft_ms or 1):.2f}, "
        f"preemptions {mfb.preemptions} vs {rr.preemptions}, mean imbalance "
        f"{mfb.free_blocks_imbalance_mean or 0:.0f} vs {rr.free_blocks_imbalance_mean or 0:.0f} blocks "
        f"(of {setup.config.num_blocks} per instance)"
    )
    print(f"plots: {out}/fleet_usage.png, fleet_ttft_cdf.png")
    return rate


def scale(rate_per_4: float, instances: int = 64, requests: int = 10_000) -> None:
    rate = rate_per_4 * instances / 4
    setup = setup_for(rate, instances, requests, ("most-free-blocks",))
    start = time.perf_counter()
    run = simulate_policy(setup, "most-free-blocks")
    seconds = time.perf_counter() - start
    run.check_complete(requests)
    print(
        f"{instances} simulated instances, {requests:,} requests at {rate:.0f} req/s: {seconds:.1f} s wall "
        f"({run.end_s:.0f} s simulated; goal < 60 s)"
    )


def one_run(instances: int, rate: float, requests: int, policy: str) -> dict:
    """One policy's simulated run, timed (setup excluded), in this process: what ``--one`` prints."""
    setup = setup_for(rate, instances, requests, (policy,))
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    run = simulate_policy(setup, policy)
    seconds = time.perf_counter() - start
    run.check_complete(requests)
    steps = sum(slot.handle.clock for slot in run.slots if slot.handle is not None)
    return {
        "instances": instances,
        "rate": rate,
        "requests": requests,
        "wall_s": seconds,
        "steps": steps,
        "simulated_s": run.end_s,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_mib": rss_before / 1024,
        "samples": len(run.samples),
    }


def growth(rate_per_4: float, policy: str = "most-free-blocks") -> None:
    """The cost against the instances (fixed requests and rate) and against the requests (fixed fleet)."""
    configs = [(n, 1000.0, 3000) for n in (16, 64, 256, 1024)]
    configs += [(64, rate_per_4 * 16, n) for n in (1000, 3000, 10_000, 30_000)]
    print(
        f"{'instances':>9} {'req/s':>7} {'requests':>8} {'wall s':>7} {'steps':>9} {'us/(step+req)':>13} "
        f"{'sim s':>7} {'peak RSS MiB':>12}"
    )
    for instances, rate, requests in configs:
        out = subprocess.run(
            [sys.executable, __file__, "--one", str(instances), str(rate), str(requests), policy],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        r = json.loads(out.strip().splitlines()[-1])
        per = 1e6 * r["wall_s"] / (r["steps"] + r["requests"])
        print(
            f"{instances:>9} {rate:>7.0f} {requests:>8,} {r['wall_s']:>7.1f} {r['steps']:>9,} {per:>13.1f} "
            f"{r['simulated_s']:>7.0f} {r['peak_rss_mib']:>12.0f}",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("reports/bench-fleet"))
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--skip-scale", action="store_true")
    parser.add_argument(
        "--growth",
        action="store_true",
        help="Only the cost-growth tables (rate per 4 instances: "
        "--rate-per-4, default the 85%% rate found before, 38.7 req/s).",
    )
    parser.add_argument("--rate-per-4", type=float, default=38.7)
    parser.add_argument("--one", nargs=4, metavar=("INSTANCES", "RATE", "REQUESTS", "POLICY"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        instances, rate, requests, policy = args.one
        print(json.dumps(one_run(int(instances), float(rate), int(requests), policy)))
        return
    if args.growth:
        growth(args.rate_per_4)
        return
    rate = study(args.out, args.requests)
    if not args.skip_scale:
        scale(rate)


if __name__ == "__main__":
    main()
