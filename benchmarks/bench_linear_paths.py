"""The CPU matmul paths side by side on the real shapes' matrices: the plain weight (torch's BLAS), oneDNN's packed
copy, and for bfloat16-valued weights the bfloat16-weight kernel (read two ways: streamed or not) and, where the CPU
has it, AMX; at bf16, the vdpbf16ps kernel's two ways where the CPU has AVX-512 BF16.

For each weight of SmolLM2-135M and TinyLlama-1.1B (fused q/k/v, o, fused gate/up, down, lm_head) and each row
count (decode batches of 1, 16 and 50 rows, prefill chunks of 512 and 2,048), times every path this machine offers,
interleaved (the median of each), on bfloat16-valued weights, at fp32 (or bf16 activations and weights with
``--dtype bf16``, where the plain and oneDNN paths and the vdpbf16ps kernel are the candidates); prints each path's
GFLOP/s and the largest error of each against a float64 product as a share of float32's error bound (fp32 only).
``--cold`` empties the cache before each call, as a run over a model larger than the cache finds its weights. This
is what ``kvbench.cpu.cpu_choices`` measures at start-up, at more row counts and every path, for reading.
``--clock cpu`` times the thread's CPU time instead of wall time (one thread), which other processes taking the
core away inflate less.

    python benchmarks/bench_linear_paths.py                      # 1 thread, fp32
    python benchmarks/bench_linear_paths.py --threads 2 --cold
    python benchmarks/bench_linear_paths.py --dtype bf16 --matrices "smollm2 qkv,smollm2 lm_head"
    python benchmarks/bench_linear_paths.py --clock cpu --rows 16,50    # a busy machine
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from kvbench.cpu import cpu_choices, cpu_linear
from kvbench.kernels import cpu_native

MATRICES = {  # name: (out, in)
    "smollm2 qkv": (960, 576),
    "smollm2 o": (576, 576),
    "smollm2 gate/up": (3072, 576),
    "smollm2 down": (576, 1536),
    "smollm2 lm_head": (49152, 576),
    "tinyllama qkv": (2560, 2048),
    "tinyllama o": (2048, 2048),
    "tinyllama gate/up": (11264, 2048),
    "tinyllama down": (2048, 5632),
    "tinyllama lm_head": (32000, 2048),
}
ROWS = (1, 16, 50, 512, 2048)


def seconds(fn, repeats: int, evict, clock=time.perf_counter) -> float:
    times = []
    for _ in range(repeats):
        evict()
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def bound_ratio(result: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> float:
    """The largest error against float64 as a share of float32's worst-case bound (k u sum|x w|)."""
    exact = x.double() @ weight.double().T
    bound = x.shape[1] * 2.0**-24 * (x.double().abs() @ weight.double().abs().T)
    return ((result.double() - exact).abs() / bound).max().item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", default=",".join(map(str, ROWS)))
    parser.add_argument("--matrices", default="all", help="comma-separated names (see MATRICES) or all")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--cold", action="store_true", help="empty the cache before every call")
    parser.add_argument(
        "--clock",
        default="wall",
        choices=("wall", "cpu"),
        help="wall time, or the thread's CPU time (1 thread only: what a busy machine inflates less)",
    )
    args = parser.parse_args()
    names = list(MATRICES) if args.matrices == "all" else args.matrices.split(",")
    unknown = [name for name in names if name not in MATRICES]
    try:
        row_counts = [int(r) for r in args.rows.split(",")]
    except ValueError:
        row_counts = []
    problem = (
        f"unknown matrix {unknown[0]!r}; choose from {', '.join(MATRICES)} or all"
        if unknown
        else f"--rows takes positive integers, comma-separated, not {args.rows!r}"
        if not row_counts or min(row_counts) < 1
        else "--clock cpu times one thread's CPU time: use --threads 1"
        if args.clock == "cpu" and args.threads != 1
        else "--threads takes a positive integer"
        if args.threads < 1
        else None
    )
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        sys.exit(2)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    evict = cpu_choices._Evictor() if args.cold else (lambda: None)
    print(
        f"{cpu_native.build_description()}; {args.threads} thread(s), {args.dtype}, {args.clock} time, "
        f"{'cache emptied before each call' if args.cold else 'warm cache'}; load "
        f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}"
    )
    print("GFLOP/s per path (the fastest marked *); error as a share of float32's bound")
    with torch.inference_mode():
        for name in names:
            out_dim, in_dim = MATRICES[name]
            weight = (torch.randn(out_dim, in_dim) / in_dim**0.5).bfloat16().to(dtype)
            paths = cpu_linear.candidate_paths(weight)
            functions = {path: cpu_linear.path_function(weight, path) for path in paths}
            for rows in row_counts:
                x = torch.randn(rows, in_dim).to(dtype)
                flops = 2 * rows * in_dim * out_dim
                repeats = max(3, min(30, int(1e10 // flops)))
                times: dict[str, list[float]] = {path: [] for path in paths}
                for fn in functions.values():
                    fn(x)  # oneDNN builds its kernel for a row count on first use
                for _ in range(3):  # interleaved, so drifting load hits every path alike
                    for path, fn in functions.items():
                        times[path].append(seconds(lambda fn=fn, x=x: fn(x), repeats, evict, clock))
                best = min(paths, key=lambda path: statistics.median(times[path]))
                cells = []
                for path in paths:
                    rate = flops / statistics.median(times[path]) / 1e9
                    error = f", err {bound_ratio(functions[path](x), x, weight):.3f}" if dtype == torch.float32 else ""
                    cells.append(f"{path} {rate:.0f}{'*' if path == best else ''}{error}")
                print(f"{name:<18} {rows:>5} rows: " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
