"""The AMX linear kernel against the float32 matmuls it replaces, on the real shapes' matrices, side by side.

For each weight of SmolLM2-135M and TinyLlama-1.1B (fused q/k/v, o, fused gate/up, down, lm_head) and each row
count (decode batches of 1, 16 and 50 rows, prefill chunks of 512 and 2,048), times the engine's float32 path
(the oneDNN-packed weight below 1,024 rows, the plain one from there, as ``kvbench.models.cpu_linear`` does) and
the AMX kernel, interleaved, on bfloat16-valued weights; prints both rates and their ratio, and the largest error
of each against a float64 product relative to float32's error bound. Needs a CPU with AMX (Sapphire Rapids or
later) and the C kernels built.

    python benchmarks/bench_amx_linear.py                 # 1 thread
    python benchmarks/bench_amx_linear.py --threads 2
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from kvbench.kernels import cpu_amx
from kvbench.models import cpu_linear

MATRICES = {  # name: (out, in)
    "smollm2 qkv": (960, 576), "smollm2 o": (576, 576), "smollm2 gate/up": (3072, 576),
    "smollm2 down": (576, 1536), "smollm2 lm_head": (49152, 576),
    "tinyllama qkv": (2560, 2048), "tinyllama o": (2048, 2048), "tinyllama gate/up": (11264, 2048),
    "tinyllama down": (2048, 5632), "tinyllama lm_head": (32000, 2048),
}
ROWS = (1, 16, 50, 512, 2048)


def seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
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
    args = parser.parse_args()
    if not cpu_amx.available():
        raise SystemExit(f"the AMX kernel is unavailable here: {cpu_amx.unavailable_reason()}")
    torch.set_num_threads(args.threads)
    names = list(MATRICES) if args.matrices == "all" else args.matrices.split(",")
    print(f"{args.threads} thread(s); GFLOP/s, float32 path vs AMX; error as a share of float32's bound")
    print(f"{'matrix':<18} {'rows':>5} {'float32':>8} {'AMX':>8} {'speed-up':>8} {'err f32':>8} {'err AMX':>8}")
    for name in names:
        out_dim, in_dim = MATRICES[name]
        weight = (torch.randn(out_dim, in_dim) / in_dim**0.5).bfloat16().float()
        onednn, amx = cpu_linear.pack(weight), cpu_amx.pack(weight)
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, in_dim)
            flops = 2 * rows * in_dim * out_dim
            repeats = max(3, min(50, int(2e10 // flops)))
            ours, theirs = [], []
            for _ in range(3):  # interleaved, so drifting load hits both alike
                theirs.append(seconds(lambda x=x, w=onednn: cpu_linear.linear(x, w), repeats))
                ours.append(seconds(lambda x=x, w=amx: cpu_amx.linear(x, w), repeats))
            fp32_s, amx_s = statistics.median(theirs), statistics.median(ours)
            errors = (bound_ratio(cpu_linear.linear(x, onednn), x, weight), bound_ratio(cpu_amx.linear(x, amx), x,
                                                                                           weight))
            print(f"{name:<18} {rows:>5} {flops / fp32_s / 1e9:>8.0f} {flops / amx_s / 1e9:>8.0f} "
                  f"{fp32_s / amx_s:>7.2f}x {errors[0]:>8.4f} {errors[1]:>8.4f}", flush=True)


if __name__ == "__main__":
    main()
