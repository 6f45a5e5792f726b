"""Paged vs contiguous at equal batch on the main job's points: repeats, interleaved rounds, medians.

The main job (``kvbench sweep --concurrency 10,30,50``: the tiny model, the article's lengths and KV budget)
holds every request at once in both engines at C=10 and C=30, so there the two should run equally fast; C=50
is where the baseline runs out of KV memory. Each round serves a point's request list with both engines in
three ways, the order alternating between rounds:

- ``interleaved``: one step of each engine in turn, each timed on its own steps (what the sweep does);
- ``sequential``: one engine's whole run, then the other's (what the sweep did before);
- ``cpu``: the sequential runs' process CPU time (the machine's other load left out).

Reported per point and mode: the median and range over rounds of the paged/contiguous ratio of output tok/s
(for CPU time, contiguous CPU seconds over paged CPU seconds, so higher is better on every line) and of TTFT
p50 (contiguous over paged). Goal: paged >= 0.97x contiguous on the median, and one run's interleaved ratio
within +-10% of it.

    python benchmarks/bench_main_job.py [--rounds 6] [--concurrency 10,30] [--modes interleaved,sequential,cpu]

An earlier revision (before interleaving existed) is measured with ``--modes sequential,cpu`` and
``PYTHONPATH`` pointing at its checkout.
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvbench.engine.load_pattern import ClosedLoop
from kvbench.studies.run_options import SweepOptions
from kvbench.studies.sweep_setup import SweepSetup

ENGINES = ("paged", "contiguous")


def _figures(result) -> tuple[float, float]:
    return result.throughput()["output_throughput"], result.latencies()["p50_ttft_ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--concurrency", default="10,30")
    parser.add_argument("--modes", default="interleaved,sequential,cpu")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="CPU threads (1: what a busy 2-core machine picks, "
        "and process CPU time then counts the engine's work only)",
    )
    args = parser.parse_args()
    modes = set(args.modes.split(","))
    levels = tuple(int(c) for c in args.concurrency.split(","))
    setup = SweepSetup.resolve(SweepOptions(concurrency=levels, threads=args.threads))
    backend = setup.backend
    for engine in ENGINES:
        backend.warm_up(engine, setup.plan(False).make_warmup())
    print(
        f"main job points {levels}: {', '.join(f'{setup.counts[c]} requests at C={c}' for c in levels)}; "
        f"{args.rounds} rounds; CPU threads {backend.threads}"
    )
    for concurrency in levels:
        ratios: dict[str, list[float]] = {"interleaved": [], "sequential": [], "cpu": []}
        ttft: dict[str, list[float]] = {"interleaved": [], "sequential": []}
        for index in range(args.rounds):
            order = ENGINES if index % 2 == 0 else ENGINES[::-1]
            if "interleaved" in modes:
                together = backend.run_together(
                    [(engine, setup.make_requests(concurrency)) for engine in order], concurrency, None
                )
                figures = {engine: _figures(result) for engine, (result, _) in zip(order, together, strict=True)}
                ratios["interleaved"].append(figures["paged"][0] / figures["contiguous"][0])
                ttft["interleaved"].append(figures["contiguous"][1] / figures["paged"][1])
            alone, cpu = {}, {}
            for engine in order:
                start = time.process_time()
                result, _ = backend.run(engine, setup.make_requests(concurrency), ClosedLoop(concurrency), None)
                cpu[engine] = time.process_time() - start
                alone[engine] = _figures(result)
            ratios["sequential"].append(alone["paged"][0] / alone["contiguous"][0])
            ttft["sequential"].append(alone["contiguous"][1] / alone["paged"][1])
            ratios["cpu"].append(cpu["contiguous"] / cpu["paged"])
            with open("/proc/loadavg", encoding="ascii") as handle:
                load = handle.read().split()[0]
            measured = ", ".join(f"{mode} {values[-1]:.3f}" for mode, values in ratios.items() if values)
            print(f"  C={concurrency} round {index + 1}: {measured} (load {load})", flush=True)
        for mode, values in ratios.items():
            if not values:
                continue
            line = (
                f"C={concurrency} {mode:>11}: paged/contiguous tok/s median {statistics.median(values):.3f}, "
                f"range {min(values):.3f}-{max(values):.3f}"
            )
            if mode in ttft:
                line += f"; TTFT p50 contiguous/paged median {statistics.median(ttft[mode]):.2f}"
            print(line)


if __name__ == "__main__":
    main()
