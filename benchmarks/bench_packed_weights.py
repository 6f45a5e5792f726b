"""Packed vs plain matmul weights on a CPU: kvbench paged on a real model shape, A/B in alternating order.

Each run is its own process (``KVBENCH_PACKED_WEIGHTS=1`` or ``0``), on the same random-weight checkpoint and the
same prompts as ``bench_real_shapes.py``; a round runs both, the order alternates between rounds, and the figure is
the median of the per-round ratios. Tokens must be identical.

    python benchmarks/bench_packed_weights.py                       # smollm2 shape, 16x128x64 and 50x128x128
    python benchmarks/bench_packed_weights.py --shape tinyllama --workloads 16x128x64 --rounds 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_real_shapes as shapes  # noqa: E402  (the checkpoint writer and the per-process launcher)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="smollm2", choices=sorted(shapes.SHAPES))
    parser.add_argument("--workloads", default="16x128x64,50x128x128", help="requests x prompt x output tokens")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per engine run")
    args = parser.parse_args()
    launch_args = argparse.Namespace(timeout=args.timeout, vllm_python=None)
    import numpy as np

    with tempfile.TemporaryDirectory() as folder:
        scratch = Path(folder)
        checkpoint = shapes.write_checkpoint(args.shape, "fp32", scratch)
        for workload in args.workloads.split(","):
            count, prompt_len, output_len = (int(x) for x in workload.split("x"))
            prompts = np.random.default_rng(0).integers(0, shapes.vocab_of(checkpoint), (count, prompt_len)).tolist()
            job = {
                "checkpoint": str(checkpoint),
                "prompts": prompts,
                "output_len": output_len,
                "dtype": "fp32",
                "threads": args.threads,
            }
            ratios = []
            for round_index in range(args.rounds):
                rate, tokens = {}, {}
                for flag in ("0", "1") if round_index % 2 == 0 else ("1", "0"):
                    os.environ["KVBENCH_PACKED_WEIGHTS"] = flag
                    result = shapes.launch("paged", job, launch_args, scratch)
                    rate[flag], tokens[flag] = count * output_len / result["seconds"], result["tokens"]
                if tokens["0"] != tokens["1"]:
                    raise SystemExit(f"{workload}: packed and plain weights gave different tokens")
                ratios.append(rate["1"] / rate["0"])
                print(
                    f"  {args.shape} {workload} round {round_index + 1}: plain {rate['0']:.1f}, packed "
                    f"{rate['1']:.1f} tok/s (x{ratios[-1]:.2f})",
                    flush=True,
                )
            print(
                f"{args.shape} {workload}: packed/plain = {statistics.median(ratios):.2f}x (per-round median; min "
                f"{min(ratios):.2f}, max {max(ratios):.2f}); tokens identical",
                flush=True,
            )


if __name__ == "__main__":
    main()
