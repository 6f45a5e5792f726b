"""Is the endpoint load generator ever the bottleneck? Its own cost against a server that streams instantly.

The instant server (``benchmarks/instant_server.py``) runs in its own process pinned to one CPU, this client on
another, so one core drives the load. Per configuration (tokens per response, the server writing the stream at
once or event by event), rounds alternate between configurations and the medians are reported:

- streamed requests per second (closed loop, ``--concurrency`` in flight), and the client's CPU use (busy share
  of its core: near 100% means the client, not the server, sets the pace);
- the client's CPU per request and per token, and the per-token cost as the slope between a short and a long
  response (what each token event adds: reading the clock, decoding the event, parsing its JSON);
- the same per-event path timed alone (no network), as a floor;
- with ``--vllm-python`` (a Python with vLLM installed), ``vllm bench serve`` against the same server on the
  same core for comparison.

Goals: >= 1,000 streamed requests/s on one core, < 50 us per token.

    python benchmarks/bench_endpoint_client.py [--requests 3000] [--rounds 3] [--vllm-python PY --tokenizer DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kvbench.endpoint.client import Target
from kvbench.endpoint.conversation import Conversation, Turn
from kvbench.endpoint.load import ClosedLoop
from kvbench.endpoint.openai import parse_event
from kvbench.endpoint.run_point import PointSettings, run_point_sync
from kvbench.endpoint.sse import SSEDecoder

HERE = Path(__file__).parent
# `vllm bench serve` without the `vllm` script (a vLLM CPU install may lack the distribution metadata it reads)
VLLM_BENCH = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; p = FlexibleArgumentParser(); "
    "add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)
SHORT, LONG = 16, 256


def start_server(tokens: int, write: str, cpu: int | None) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, str(HERE / "instant_server.py"), "--tokens", str(tokens), "--write", write]
    if cpu is not None:
        command += ["--cpu", str(cpu)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
    port = int(process.stdout.readline().split()[1])
    return process, f"http://127.0.0.1:{port}"


def client_round(url: str, tokens: int, requests: int, concurrency: int) -> dict:
    conversations = [Conversation(i, (Turn((1, 2, 3, 4, 5, 6, 7, 8), tokens),)) for i in range(requests)]
    warm = [Conversation(i, (Turn((1, 2, 3, 4), tokens),)) for i in range(concurrency)]
    settings = PointSettings(ClosedLoop(concurrency), warmup=warm, scrape=False)
    cpu = time.process_time()
    point = run_point_sync(Target(url, model="instant"), conversations, settings)
    cpu = time.process_time() - cpu
    m = point.metrics.to_json()
    assert m["completed"] == requests and m["total_output_tokens"] == requests * tokens, m
    served = requests + concurrency  # the warm-up's requests cost the client too
    return {
        "req_s": m["request_throughput"],
        "cpu_busy": cpu / (point.duration_s + 1e-9),
        "cpu_us_per_request": cpu / served * 1e6,
        "cpu_us_per_token": cpu / (served * tokens) * 1e6,
        "mean_ttft_ms": m["mean_ttft_ms"],
    }


def event_path_us(tokens: int = LONG, repeat: int = 200) -> float:
    """The client's per-token work alone: the clock, the SSE decoder and the event's JSON, per token event."""
    from instant_server import stream_chunks  # noqa: PLC0415 - the benchmark's own helper

    bodies = [chunk.split(b"\r\n", 1)[1][:-2] for chunk in stream_chunks(tokens)[:-1]]
    clock = time.perf_counter
    began = time.perf_counter()
    for _ in range(repeat):
        decoder = SSEDecoder()
        times: list[float] = []
        parts: list[str] = []
        for body in bodies:
            now = clock()
            for data in decoder.feed(body):
                event = parse_event(data)
                if event.text is not None:
                    times.append(now)
                    parts.append(event.text)
    return (time.perf_counter() - began) / (repeat * len(bodies)) * 1e6


def vllm_round(
    python: str, url: str, tokenizer: str, tokens: int, requests: int, concurrency: int, cpu: int | None
) -> float | None:
    command = [
        python,
        "-c",
        VLLM_BENCH,
        "--base-url",
        url,
        "--endpoint",
        "/v1/completions",
        "--model",
        "instant",
        "--tokenizer",
        tokenizer,
        "--dataset-name",
        "random",
        "--random-input-len",
        "8",
        "--random-output-len",
        str(tokens),
        "--num-prompts",
        str(requests),
        "--max-concurrency",
        str(concurrency),
        "--request-rate",
        "inf",
        "--num-warmups",
        str(concurrency),
        "--disable-tqdm",
        "--ignore-eos",
    ]
    if cpu is not None:
        command = ["taskset", "-c", str(cpu), *command]
    out = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd="/tmp")
    found = re.search(r"Request throughput \(req/s\):\s+([\d.]+)", out.stdout)
    if not found:
        print(out.stdout[-2000:], out.stderr[-2000:], file=sys.stderr)
        return None
    return float(found.group(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--long-requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--vllm-python", default=None)
    parser.add_argument("--tokenizer", default=None, help="a tokenizer directory for vllm bench's random dataset")
    args = parser.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    client_cpu, server_cpu = (cpus[0], cpus[1]) if len(cpus) > 1 else (cpus[0], None)
    os.sched_setaffinity(0, {client_cpu})
    sys.path.insert(0, str(HERE))
    configs = [(SHORT, "together"), (SHORT, "separate"), (LONG, "together"), (LONG, "separate")]
    results: dict[tuple, list[dict]] = {c: [] for c in configs}
    vllm: dict[tuple, list[float]] = {c: [] for c in configs}
    servers = {c: start_server(c[0], c[1], server_cpu) for c in configs}
    try:
        for round_ in range(args.rounds):
            for config in configs:
                tokens, _ = config
                count = args.requests if tokens == SHORT else args.long_requests
                results[config].append(client_round(servers[config][1], tokens, count, args.concurrency))
                if args.vllm_python and args.tokenizer:
                    value = vllm_round(
                        args.vllm_python,
                        servers[config][1],
                        args.tokenizer,
                        tokens,
                        count,
                        args.concurrency,
                        client_cpu,
                    )
                    if value is not None:
                        vllm[config].append(value)
            print(f"round {round_ + 1}/{args.rounds} done", file=sys.stderr)
    finally:
        for process, _ in servers.values():
            process.kill()
            process.wait()
    print(
        f"client on CPU {client_cpu}, server on CPU {server_cpu}; {args.concurrency} in flight; medians of "
        f"{args.rounds} alternating rounds"
    )
    print(
        f"{'tokens':>6} {'write':>9} {'req/s':>8} {'client CPU busy':>16} {'CPU us/req':>11} {'CPU us/token':>13}"
        + (f" {'vllm bench req/s':>17}" if any(vllm.values()) else "")
    )
    med = {c: {k: statistics.median(r[k] for r in results[c]) for k in results[c][0]} for c in configs}
    for config in configs:
        row = med[config]
        line = (
            f"{config[0]:>6} {config[1]:>9} {row['req_s']:>8.0f} {row['cpu_busy']:>15.0%} "
            f"{row['cpu_us_per_request']:>11.0f} {row['cpu_us_per_token']:>13.1f}"
        )
        if vllm[config]:
            line += f" {statistics.median(vllm[config]):>17.0f}"
        print(line)
    for write in ("together", "separate"):
        slope = (med[(LONG, write)]["cpu_us_per_request"] - med[(SHORT, write)]["cpu_us_per_request"]) / (LONG - SHORT)
        print(f"per-token client CPU ({write}): {slope:.1f} us (slope between {SHORT} and {LONG} tokens)")
    print(f"per-event path alone (clock + SSE + JSON): {event_path_us():.1f} us")


if __name__ == "__main__":
    main()
