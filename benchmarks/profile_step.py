"""Where a decode-heavy run's time goes on a real model shape: matmuls, lm_head, attention, sampling, the rest.

Runs kvbench's paged engine on random weights with the shape of SmolLM2-135M (or TinyLlama-1.1B) and attributes
wall time by wrapping the runner's pieces: the layer matmuls and the lm_head (told apart by their weight), the
attention kernels with write_kv, sampling; "Python and glue" is what is left (scheduling, packing, norms, rotary,
residual adds and the loop itself). Each matmul part also gets its rate (rows as multiplied, a decode step's padding
included) and, where ``kvbench.kernels.cpu_peak`` can measure it, its share of this core's peak at the dtype: how
much a faster kernel could still win there.

    python benchmarks/profile_step.py                       # 135M shape, 16 and 50 running, 1 thread
    python benchmarks/profile_step.py --shape tinyllama --running 16 --threads 2
    python benchmarks/profile_step.py --dtype bf16 --clock cpu  # bf16; CPU time (a busy machine inflates wall time)

With ``--clock cpu`` every part is timed in the process's CPU time, which other processes taking the cores away do
not inflate (with one thread it is the work's own cost; with more it sums the threads).
"""

from __future__ import annotations

import argparse
import os
import time
from collections import defaultdict

import numpy as np
import torch

from kvbench import kernels
from kvbench.cpu import cpu_choices, cpu_linear
from kvbench.engine.config import EngineConfig
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.kernels import cpu_peak
from kvbench.models.hf_model import build_random_model, round_weights_to_bf16_
from kvbench.models.runner import matmul_rows
from kvbench.models.shapes import ModelShape

SHAPES = {
    "smollm2": ModelShape(
        "smollm2-135m-shape",
        30,
        576,
        9,
        3,
        1536,
        49152,
        8192,
        tie_word_embeddings=True,
        rope_theta=100000.0,
        dtype="fp32",
    ),
    "tinyllama": ModelShape("tinyllama-1.1b-shape", 22, 2048, 32, 4, 5632, 32000, 2048, dtype="fp32"),
}


def profile(
    shape: ModelShape,
    running: int,
    prompt_len: int,
    output_len: int,
    dtype: torch.dtype,
    weights: str,
    clock=time.perf_counter,
) -> dict:
    model = build_random_model(shape, seed=0, dtype=dtype)
    if weights == "bf16" and dtype == torch.float32:
        round_weights_to_bf16_(model)
    length = prompt_len + output_len
    config = EngineConfig(
        engine="paged", block_size=16, num_blocks=running * -(-length // 16) + 16, max_len=length, max_num_seqs=running
    )
    engine = LLMEngine(model, config)
    runner = engine.runner
    rng = np.random.default_rng(0)
    prompts = rng.integers(0, shape.vocab_size, (running, prompt_len)).tolist()

    def requests(out: int) -> list:
        return [make_request(i, p, SamplingParams(max_tokens=out, ignore_eos=True)) for i, p in enumerate(prompts)]

    engine.run(requests(2), running)  # warm-up
    spent: dict[str, float] = defaultdict(float)
    flops: dict[str, float] = defaultdict(float)  # each matmul part's floating-point operations, rows as multiplied

    def timed(name, fn):
        def wrapper(*args, **kwargs):
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                spent[name] += clock() - start

        return wrapper

    lm_head = runner.lm_head
    linear = cpu_linear.linear

    def timed_linear(x, weight, bias=None):  # the runner's matmuls, told apart by which weight they multiply
        phase = "prefill" if x.shape[0] > matmul_rows(running) else "decode"  # x arrives padded (matmul_rows)
        name = f"lm_head ({phase})" if weight is lm_head else f"layer matmuls ({phase}: qkv, o, gate/up, down)"
        flops[name] += 2.0 * x.shape[0] * weight.shape[0] * weight.shape[1]
        return timed(name, linear)(x, weight, bias)

    saved = (cpu_linear.linear, kernels.paged_decode_attention, kernels.paged_prefill_attention, kernels.write_kv)
    cpu_linear.linear = timed_linear
    kernels.paged_decode_attention = timed("attention (decode)", saved[1])
    kernels.paged_prefill_attention = timed("attention (prefill)", saved[2])
    kernels.write_kv = timed("write_kv", saved[3])
    runner.sample = timed("sampling", runner.sample)
    try:
        start = clock()
        result = engine.run(requests(output_len), running)
        total = clock() - start
    finally:
        cpu_linear.linear, kernels.paged_decode_attention, kernels.paged_prefill_attention, kernels.write_kv = saved
    spent["Python and glue (scheduling, packing, norms, rotary, adds)"] = total - sum(spent.values())
    tokens = sum(r.num_outputs for r in result.requests)
    prefetch = runner.decode_prefetch.line() if runner.decode_prefetch else None
    plan = cpu_choices.plan_of(model)
    return {
        "total_s": total,
        "tok_s": tokens / total,
        "parts": dict(spent),
        "flops": dict(flops),
        "decode_prefetch": prefetch,
        "matmul_plan": plan.lines() if plan else [],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="smollm2", choices=tuple(SHAPES))
    parser.add_argument("--running", default="16,50", help="requests running at once (one run each)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument(
        "--clock",
        default="wall",
        choices=("wall", "cpu"),
        help="wall time, or the process's CPU time (what the work cost, whatever the load)",
    )
    parser.add_argument(
        "--weights",
        default="bf16",
        choices=("bf16", "fp32"),
        help="the values the weights hold: bf16 numbers (as published checkpoints store them, where "
        "the AMX path applies) or any float32",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    try:  # the matmul parts' rates are put against this core's peak (times the threads, by wall time)
        peaks = cpu_peak.measure()
        peak = peaks.matmul_flops(args.dtype) * (args.threads if args.clock == "wall" else 1)
        print(f"this core's peaks: {peaks.describe(args.dtype)}")
    except cpu_peak.PeakUnavailable as why:
        peak = None
        print(f"no peak to compare the matmuls with: {why}")
    for running in (int(n) for n in args.running.split(",")):
        clock = time.perf_counter if args.clock == "wall" else time.process_time
        report = profile(SHAPES[args.shape], running, args.prompt_len, args.output_len, dtype, args.weights, clock)
        print(
            f"{args.shape} {args.dtype} ({args.weights} weights), {running} running x "
            f"{args.prompt_len}+{args.output_len} tokens, "
            f"{args.threads} thread(s): {report['total_s']:.2f} s {args.clock} time, {report['tok_s']:.1f} output "
            f"tok/s; load {' '.join(f'{x:.2f}' for x in os.getloadavg())}"
        )
        for name, seconds in sorted(report["parts"].items(), key=lambda item: -item[1]):
            rate = report["flops"].get(name, 0.0) / seconds if seconds > 0 else 0.0
            against = f", {rate / peak:.0%} of the peak" if peak and rate else ""
            at = f" at {rate / 1e9:.0f} GFLOP/s{against}" if rate else ""
            print(f"  {100 * seconds / report['total_s']:5.1f}%  {seconds:6.2f} s  {name}{at}")
        if report["decode_prefetch"]:
            print(f"  {report['decode_prefetch']}")
        for line in report["matmul_plan"]:
            print(f"  {line}")


if __name__ == "__main__":
    main()
