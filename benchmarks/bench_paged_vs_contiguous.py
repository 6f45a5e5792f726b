"""Paged vs contiguous engine at equal batch (both fit): interleaved runs, process CPU time.

    python benchmarks/bench_paged_vs_contiguous.py [--runs 10]
    python benchmarks/bench_paged_vs_contiguous.py --model CHECKPOINT_DIR --batch 16 --prompt 128 --output 64 --runs 8

Both engines run in this one process over the same loaded model (the tiny preset, or ``--model``: a preset, a
checkpoint directory or a GGUF file), one thread, greedy, so what differs is only the engine: a gap that appears
when each engine runs in its own process (``bench_real_shapes.py``) and not here is the processes', not the
engines'.

Goal: the paged engine within 5% of the contiguous one. CPU time, one warm-up each, then runs interleaved with the order
alternating. Reported: the ratio of the minimums, and the median of the per-round ratios (each round's two
runs sit next to each other in time, so load that drifts over the minutes cancels out of it). Wall clock on
a shared machine swings far more than the difference being measured.
"""

from __future__ import annotations

import argparse
import statistics
import time

from kvbench.engine.config import EngineConfig
from kvbench.studies.local_model import build_engine, load_model
from kvbench.studies.run_requests import token_requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--output", type=int, default=256)  # long enough that one run is not noise
    parser.add_argument("--model", default="tiny", help="a preset, a checkpoint directory or a GGUF file")
    args = parser.parse_args()
    loaded = load_model(args.model, "cpu", None, 0, threads=1)
    pairs = [(args.prompt, args.output)] * args.batch
    max_len = args.prompt + args.output
    num_blocks = args.batch * -(-max_len // 16)  # both fit: every contiguous max-len slab, every paged table
    engines = {
        name: build_engine(loaded, EngineConfig(engine=name, block_size=16, num_blocks=num_blocks, max_len=max_len))
        for name in ("paged", "contiguous")
    }
    cpu: dict[str, list[float]] = {name: [] for name in engines}

    def timed_run(name: str) -> float:
        requests = token_requests(pairs, loaded.shape.vocab_size, 0)
        start = time.process_time()
        result = engines[name].run(requests, args.batch)
        seconds = time.process_time() - start
        if result.rejected or result.peak_running != args.batch:
            raise SystemExit(f"{name}: the batch did not run whole; the comparison would be unfair")
        return seconds

    for name in engines:
        timed_run(name)  # warm-up
    order = list(engines)
    for index in range(args.runs):
        for name in order if index % 2 == 0 else order[::-1]:
            cpu[name].append(timed_run(name))
    for name, values in cpu.items():
        print(f"{name:>10}: min {min(values):.3f} s CPU over {args.runs} runs  {[round(v, 3) for v in values]}")
    ratio = min(cpu["paged"]) / min(cpu["contiguous"])
    paired = statistics.median(p / c for p, c in zip(cpu["paged"], cpu["contiguous"], strict=True))
    print(
        f"paged / contiguous CPU time: ratio of minimums {ratio:.3f}, median of per-round ratios {paired:.3f} "
        f"({'within' if abs(paired - 1) <= 0.05 else 'OUTSIDE'} 5% on the per-round median)"
    )


if __name__ == "__main__":
    main()
