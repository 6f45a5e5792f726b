"""Simulator speed: 10,000 requests at max-len 2048 (Llama-2-13B on an A100-80GB budget), per strategy.

    python benchmarks/bench_simulator.py [--requests 10000]

Goal: under 10 s per strategy on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import time

from rich.console import Console
from rich.table import Table

from kvbench.engine.timing import RooflineTiming
from kvbench.models.gpus import kv_budget, resolve_gpu
from kvbench.models.resolve import resolve_model
from kvbench.studies.waste import parse_strategies, run_strategy
from kvbench.workload.lengths import LengthSpec


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=256)
    args = parser.parse_args()
    shape, gpu = resolve_model("llama-2-13b"), resolve_gpu("a100-80g")
    slots = kv_budget(shape, gpu).kv_bytes // shape.bytes_per_token
    pairs = LengthSpec(500, 2048).sample(args.requests, 0)
    timing = RooflineTiming.for_model(shape, gpu)
    table = Table(
        title=f"Simulator: {args.requests:,} requests, max-len 2048, {slots:,} slots, concurrency {args.concurrency}"
    )
    for column in ("strategy", "wall s", "simulated steps", "steps / s", "preemptions", "goal < 10 s"):
        table.add_column(column, justify="right")
    for strategy in parse_strategies(["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"], [16]):
        start = time.perf_counter()
        result = run_strategy(strategy, pairs, slots, 2048, args.concurrency, timing)
        wall = time.perf_counter() - start
        steps = result.accountant.steps
        table.add_row(
            strategy.name,
            f"{wall:.2f}",
            f"{steps:,}",
            f"{steps / wall:,.0f}",
            str(result.num_preemptions),
            "yes" if wall < 10 else "NO",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
