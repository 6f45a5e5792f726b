"""How long ``kvbench reuse`` takes on a whole trace: reading it, the never-evicting run, every KV size, the
reuse distances; and the peak memory of the process.

Goal: Mooncake's whole conversation trace (12,031 requests over an hour) at 20 KV sizes in under 30 s on one
core, under 1 GiB. The trace is not shipped (the repository keeps its first 1,000 requests); fetch
``FAST25-release/traces/conversation_trace.jsonl`` from kvcache-ai/Mooncake and pass its path.

    python benchmarks/bench_reuse.py --trace conversation_trace.jsonl [--points 20 --model llama-3.1-8b --gpu h100-80g]
"""

from __future__ import annotations

import argparse
import platform
import resource
import subprocess
import time

from kvbench.studies.reuse import ReuseSettings, run_reuse_study
from kvbench.workload.prefix_trace import read_prefix_trace, resolve_trace


def cpu_model() -> str:
    try:
        text = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return platform.processor() or "unknown CPU"
    fields = dict(line.split(":", 1) for line in text.splitlines() if ":" in line)
    return ", ".join(
        f"{key.strip()} {fields[key].strip()}" for key in ("Model name", "CPU family", "Model") if key in fields
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="mooncake-conversation-1k")
    parser.add_argument("--points", type=int, default=20)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--gpu", default="h100-80g")
    args = parser.parse_args()
    stages: list[tuple[str, float]] = []
    start = cpu = time.process_time()
    wall = time.perf_counter()
    trace = read_prefix_trace(resolve_trace(args.trace))
    stages.append(("read the trace", time.process_time() - cpu))
    cpu = time.process_time()
    curve = run_reuse_study(trace, ReuseSettings(model=args.model, gpu=args.gpu, points=args.points))
    total_cpu = time.process_time() - start
    sizes = len(curve.points)
    stages.append((f"the study ({sizes} KV sizes, the never-evicting run, reuse distances)", time.process_time() - cpu))
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(f"CPU: {cpu_model()}")
    print(f"trace: {args.trace}, {len(trace.requests):,} requests, {curve.trace.prompt_tokens:,} prompt tokens")
    for what, seconds in stages:
        print(f"  {what}: {seconds:.2f} s CPU")
    print(
        f"total: {total_cpu:.2f} s CPU ({time.perf_counter() - wall:.2f} s wall), {total_cpu / sizes:.2f} s per KV "
        f"size; peak RSS {peak_mib:,.0f} MiB (goals: under 30 s for 20 sizes, under 1,024 MiB)"
    )
    print(f"never-evicting hit rate {curve.unbounded.hit_rate_pct:.2f}%")
    for point in curve.points:
        print(f"  {point.kv_bytes / 2**30:10.1f} GiB  {point.hit_rate_pct:6.2f}%  {point.label}")
    for line in curve.findings:
        print(f"- {line}")


if __name__ == "__main__":
    main()
