"""Routing policies across real servers: two ``kvbench serve`` replicas with small KV pools, a shared-prefix
workload, every policy on the same arrivals (``kvbench fleet --target``), and the simulator against the run.

What it prints, per policy: the cluster's prefix hit rate and preemptions (each against round-robin), p50/p99
TTFT, each replica's share of the requests; then the simulator's share, hit rate and preemptions beside the real
ones. The questions: does prefix affinity raise the hit rate, does most-free-blocks cut preemptions, and is the
simulator within 5 points of the real fleet?

    python benchmarks/bench_fleet_servers.py [--out reports/bench-fleet-servers] [--requests 400] [--rate 12]
        [--model tiny | PATH.gguf] [--kv-memory 2MiB | 1MiB,3MiB] [--groups 12 --prefix 384 --tail 32 --output 32:384]
        [--policies round-robin,most-free-blocks]

Everything listens on 127.0.0.1; the replicas are stopped however the run ends.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

POLICIES = "round-robin,least-requests,most-free-blocks,prefix-affinity,approx-prefix,precise-prefix"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_replica(model: str, kv_memory: str, max_len: int) -> tuple[subprocess.Popen, str, str]:
    events = f"tcp://127.0.0.1:{free_port()}"
    command = [sys.executable, "-m", "kvbench.cli", "serve", "--model", model, "--port", "0", "--kv-memory", kv_memory]
    command += ["--max-len", str(max_len), "--threads", "1", "--log-interval", "0", "--kv-events", events]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    deadline = time.time() + 180
    while time.time() < deadline:
        line = process.stderr.readline()
        found = re.search(r"serving on (http://\S+)", line)
        if found:
            return process, found.group(1), events
        if not line and process.poll() is not None:
            break
    process.kill()
    raise SystemExit(f"kvbench serve did not start: {process.stderr.read()}")


def span(text: str) -> tuple[int, int]:
    low, _, high = text.partition(":")
    return int(low), int(high or low)


def write_requests(path: Path, args: argparse.Namespace) -> None:
    """``--groups`` prefixes of ``--prefix`` tokens (each group its own length), each prompt one of them plus a
    ``--tail`` of its own,
    outputs drawn from ``--output``, Poisson arrivals at ``--rate``; popular groups more often (Zipf 1.1)."""
    rng = np.random.default_rng(args.seed)
    weights = 1.0 / np.arange(1, args.groups + 1) ** 1.1
    groups = rng.choice(args.groups, size=args.requests, p=weights / weights.sum())
    low, high = span(args.output)
    tail_low, tail_high = span(args.tail)
    prefix_low, prefix_high = span(args.prefix)
    lengths = np.random.default_rng([args.seed, 2]).integers(prefix_low, prefix_high + 1, args.groups)
    times = np.cumsum(rng.exponential(1.0 / args.rate, args.requests))
    times -= times[0]
    with path.open("w") as out:
        for index, group in enumerate(groups):
            prefix = np.random.default_rng(1000 + int(group)).integers(5, 400, int(lengths[group])).tolist()
            tail = rng.integers(5, 400, int(rng.integers(tail_low, tail_high + 1))).tolist()
            row = {
                "prompt_token_ids": prefix + tail,
                "output_len": int(rng.integers(low, high + 1)),
                "arrival_time": float(times[index]),
            }
            out.write(json.dumps(row) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="reports/bench-fleet-servers")
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--rate", type=float, default=12.0)
    parser.add_argument("--groups", type=int, default=12)
    parser.add_argument("--prefix", default="384", help="tokens of each group's shared prefix, N or LOW:HIGH")
    parser.add_argument("--tail", default="32", help="tokens of each prompt after its prefix, N or LOW:HIGH")
    parser.add_argument("--output", default="32:384", help="output lengths, LOW:HIGH")
    parser.add_argument("--kv-memory", default="2MiB", help="each replica's KV pool, or A,B for pools of two sizes")
    parser.add_argument("--model", default="tiny", help="what each replica serves: a preset or a checkpoint")
    parser.add_argument("--load-weight", default="0.2")
    parser.add_argument("--scrape-interval", default="0.1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policies", default=POLICIES, help="the policies to run, round-robin among them")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    requests = out / "requests.jsonl"
    write_requests(requests, args)
    replicas = []
    try:
        pools = args.kv_memory.split(",")
        if len(pools) > 2:
            parser.error("--kv-memory takes one pool for both replicas, or two")
        longest = span(args.prefix)[1] + span(args.tail)[1] + span(args.output)[1]
        for pool in pools * 2 if len(pools) == 1 else pools:
            replicas.append(start_replica(args.model, pool, longest))
        command = [sys.executable, "-m", "kvbench.cli", "fleet", "--requests-file", str(requests)]
        for name, (_, url, events) in zip("ab", replicas, strict=True):
            command += ["--target", f"{name}={url}", "--kv-events", f"{name}={events}"]
        run = out / f"run-{time.strftime('%Y%m%d-%H%M%S')}"
        command += ["--policies", args.policies, "--scrape-interval", args.scrape_interval]
        command += ["--load-weight", args.load_weight, "--out", str(run)]
        started = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - started
    finally:
        for process, _, _ in replicas:
            process.terminate()
        for process, _, _ in replicas:
            process.wait(60)
    if done.returncode != 0:
        raise SystemExit(f"fleet failed ({done.returncode}): {done.stderr[-2000:]}")
    report(run, wall, args)


def report(run: Path, wall: float, args: argparse.Namespace) -> None:
    summary = json.loads((run / "summary.json").read_text())
    points = {p["policy"]: p for p in summary["points"]}
    check = {row["policy"]: row for row in json.loads((run / "simulator-check.json").read_text())["policies"]}
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), "?")
    print(
        f"CPU: {model}; {args.requests} requests at {args.rate:g} req/s, {args.groups} prefix groups of "
        f"{args.prefix} tokens, tails {args.tail}, outputs {args.output}, {args.model} with KV {args.kv_memory} per "
        f"replica; {wall:.0f} s wall"
    )
    base = points["round-robin"]
    print("policy             hit  vs RR  preempt vs RR  p50/p99 TTFT ms  share a/b | simulated: share hit preempt ok")
    for name, p in points.items():
        routed = [i["routed"] for i in p["instances"]]
        share = "/".join(f"{100 * r / (sum(routed) or 1):.0f}" for r in routed)
        row = check.get(name, {})
        sim_share = "/".join(f"{100 * s:.0f}" for s in row.get("share_simulated", []))
        hit, gain = 100 * p["prefix_hit_rate"], 100 * (p["prefix_hit_rate"] - base["prefix_hit_rate"])
        ttft = f"{p['p50_ttft_ms']:.0f}/{p['p99_ttft_ms']:.0f}"
        sim_hit = 100 * row.get("hit_rate_simulated", float("nan"))
        print(
            f"{name:17} {hit:4.0f}% {gain:+5.1f} {p['preemptions']:7d} {p['preemptions'] - base['preemptions']:+5d}"
            f" {ttft:>16} {share:>10} | {sim_share:>15} {sim_hit:3.0f}% {row.get('preemptions_simulated', '-'):>7}"
            f" {row.get('agrees')}"
        )
    print(f"run directory: {run}")


if __name__ == "__main__":
    main()
