"""What the HTTP path costs: output tok/s through `kvbench serve` vs the same engine in process, interleaved.

    python benchmarks/bench_serve.py [--concurrency 30] [--requests 120] [--rounds 3] [--engine paged] [--pin]
    python benchmarks/bench_serve.py --model CHECKPOINT_DIR --kv-memory 1GiB --requests 60

Both sides run the same engine (model, seed, KV budget, block size, threads) on the same request list: prompts
of random token ids and output lengths drawn from the article scenario, greedy, EOS ignored, exactly C requests
in flight (closed loop). The server is a `kvbench serve` process on 127.0.0.1 driven by an aiohttp client in this
process (streamed completions with `stream_options.include_usage`, as `vllm bench serve` sends them); the
in-process side is `LLMEngine.run` here. Output tok/s = output tokens / wall time from the first request sent to
the last answer. Streamed and non-streamed answers are measured as two sides. One uncounted warm-up each, then
rounds alternating the order of the sides; reported: medians, the median of per-round ratios (goal: serve / in
process >= 0.9), and CPU seconds per 1,000 output tokens, all processes together and split into the client (this
process), the server's front end and its engine process (on a machine whose cores are all busy, throughput follows
CPU time, and the HTTP path's own work shows there). ``--pin`` puts the engine (in process, or the server's engine
process) on the first CPU and the front end and client on the others.

Every round also checks that the server's tokens equal the in-process engine's, request by request (greedy).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import aiohttp

from kvbench.engine.config import EngineConfig
from kvbench.studies.local_model import build_engine, load_model
from kvbench.studies.run_requests import token_requests
from kvbench.workload.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]


def start_server(args) -> tuple[subprocess.Popen, str, int]:
    """The server process, its URL and the pid of its engine process (a child it starts)."""
    command = [
        sys.executable,
        "-m",
        "kvbench.cli",
        "serve",
        "--engine",
        args.engine,
        "--model",
        args.model,
        "--port",
        "0",
        "--threads",
        str(args.threads),
        "--kv-memory",
        args.kv_memory,
        "--log-interval",
        "0",
    ]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, cwd=ROOT)
    deadline = time.time() + 180
    engine_pid = None
    for line in process.stderr:
        found = re.search(r"engine process (\d+)", line)
        if found:
            engine_pid = int(found.group(1))
        match = re.search(r"serving on (http://\S+)", line)
        if match and engine_pid is not None:
            return process, match.group(1), engine_pid
        if time.time() > deadline:
            break
    process.kill()
    raise SystemExit(f"the server did not start: {process.stderr.read()}")


async def one_request(
    session: aiohttp.ClientSession, url: str, prompt: list[int], max_tokens: int, stream: bool
) -> list[int]:
    payload = {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
        "return_token_ids": True,
    }
    if stream:
        payload["stream_options"] = {"include_usage": True}
    async with session.post(url + "/v1/completions", json=payload) as response:
        if response.status != 200:
            raise SystemExit(f"HTTP {response.status}: {await response.text()}")
        if not stream:
            body = await response.json()
            tokens, usage = body["choices"][0]["token_ids"], body["usage"]
        else:
            tokens, usage, buffer = [], None, b""
            async for chunk in response.content.iter_any():
                buffer += chunk
                while b"\n\n" in buffer:
                    event, buffer = buffer.split(b"\n\n", 1)
                    data = event.removeprefix(b"data: ")
                    if data == b"[DONE]":
                        continue
                    body = json.loads(data)
                    if body["choices"]:
                        tokens += body["choices"][0]["token_ids"]
                    elif body.get("usage"):
                        usage = body["usage"]
    if usage is None or usage["completion_tokens"] != len(tokens) or len(tokens) != max_tokens:
        raise SystemExit(f"usage {usage} does not match the {len(tokens)} tokens received (asked {max_tokens})")
    return tokens


async def http_round(url: str, prompts: list[list[int]], outputs: list[int], concurrency: int, stream: bool):
    results: list[list[int] | None] = [None] * len(prompts)
    queue = list(range(len(prompts)))[::-1]
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=3600)) as session:

        async def worker():
            while queue:
                index = queue.pop()
                results[index] = await one_request(session, url, prompts[index], outputs[index], stream)

        start = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - start
    return results, seconds


def process_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--concurrency", type=int, default=30)
    parser.add_argument("--requests", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--engine", default="paged")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--kv-memory", default="64MiB")
    parser.add_argument("--modes", default="stream,complete", help="stream and/or complete (non-streamed)")
    parser.add_argument(
        "--pin",
        action="store_true",
        help="the engine (in process, or the server's engine process) on the first CPU, the HTTP "
        "front end and the client on the others: the HTTP path on cores of its own, as a "
        "server with a spare core runs it",
    )
    args = parser.parse_args()

    spec = load_scenario("article")
    pairs = spec.lengths.sample(args.requests, spec.seed)
    loaded = load_model(args.model, "cpu", None, 0, max_len=spec.lengths.max_len, threads=args.threads)
    from kvbench.commands._options import parse_size

    num_blocks = parse_size(args.kv_memory) // (loaded.shape.bytes_per_token * 16)
    engine = build_engine(
        loaded,
        EngineConfig(
            engine=args.engine,
            block_size=16,
            num_blocks=num_blocks,
            max_len=2048 if args.model == "tiny" else spec.lengths.max_len,
        ),
    )
    vocab = loaded.shape.vocab_size
    prompts = [r.prompt_token_ids for r in token_requests(pairs, vocab, 1)]
    outputs = [o for _, o in pairs]

    def in_process() -> tuple[list[list[int]], float]:
        requests = token_requests(pairs, vocab, 1)
        start = time.perf_counter()
        engine.run(requests, args.concurrency)
        return [r.output_token_ids for r in requests], time.perf_counter() - start

    process, url, engine_pid = start_server(args)
    cpus = sorted(os.sched_getaffinity(0))
    if args.pin:
        if len(cpus) < 2:
            raise SystemExit("--pin needs at least 2 CPUs")
        engine_cpus, http_cpus = {cpus[0]}, set(cpus[1:])
        os.sched_setaffinity(engine_pid, engine_cpus)
        os.sched_setaffinity(process.pid, http_cpus)  # the front end's event loop thread
    log_tail: list[str] = []  # the server's stderr, read on so that it never blocks on a full pipe
    threading.Thread(target=lambda: log_tail.extend(process.stderr), daemon=True).start()
    sides = ["in-process", *(f"serve-{mode}" for mode in args.modes.split(","))]
    rates: dict[str, list[float]] = {side: [] for side in sides}
    # CPU seconds per 1,000 output tokens: all processes together, and each one's (this process is the client,
    # or the engine itself when in process)
    cpu: dict[str, list[float]] = {side: [] for side in sides}
    parts: dict[str, dict[str, list[float]]] = {side: {"client": [], "front end": [], "engine": []} for side in sides}
    try:
        total = sum(outputs)
        print(
            f"{args.requests} requests, {total:,} output tokens, C={args.concurrency}, engine {args.engine}, "
            f"model {args.model}, {args.threads} thread(s); server {url} (engine process {engine_pid})"
            + (
                f"; engine pinned to CPU {cpus[0]}, the HTTP path and the client to {sorted(http_cpus)}"
                if args.pin
                else ""
            )
        )
        warm = min(8, len(prompts))
        for stream in (False, True):
            asyncio.run(http_round(url, prompts[:warm], [4] * warm, warm, stream))
        engine.generate(prompts[:warm], token_requests(pairs[:warm], vocab, 1)[0].sampling)
        mismatched = 0
        for index in range(args.rounds):
            order = sides if index % 2 == 0 else sides[::-1]
            tokens = {}
            for side in order:
                if args.pin:  # this process: the engine when in process, else the client
                    os.sched_setaffinity(0, engine_cpus if side == "in-process" else http_cpus)
                before = (time.process_time(), process_cpu_seconds(process.pid), process_cpu_seconds(engine_pid))
                if side == "in-process":
                    tokens[side], seconds = in_process()
                else:
                    tokens[side], seconds = asyncio.run(
                        http_round(url, prompts, outputs, args.concurrency, side == "serve-stream")
                    )
                after = (time.process_time(), process_cpu_seconds(process.pid), process_cpu_seconds(engine_pid))
                client, front, core = (1000 * (b - a) / total for a, b in zip(before, after, strict=True))
                if side == "in-process":  # this process ran the engine; the idle server's ticks are not its cost
                    client, front, core = 0.0, 0.0, client
                rates[side].append(total / seconds)
                cpu[side].append(client + front + core)
                for name, value in zip(("client", "front end", "engine"), (client, front, core), strict=True):
                    parts[side][name].append(value)
            mismatched += sum(tokens[side] != tokens["in-process"] for side in sides[1:])
            print(
                f"round {index + 1} (load {os.getloadavg()[0]:.1f}): "
                + ", ".join(f"{side} {rates[side][-1]:,.0f} tok/s" for side in sides)
            )
        base = rates["in-process"]
        for side in sides:
            ratio = statistics.median(r / b for r, b in zip(rates[side], base, strict=True))
            goal = (
                ""
                if side == "in-process"
                else (
                    f"; / in process: median of per-round ratios {ratio:.3f} "
                    f"({'meets' if ratio >= 0.9 else 'MISSES'} the 0.9 goal)"
                )
            )
            split = ", ".join(f"{name} {statistics.median(values):.3f}" for name, values in parts[side].items())
            print(
                f"{side:>15}: median {statistics.median(rates[side]):,.0f} output tok/s; CPU "
                f"{statistics.median(cpu[side]):.3f} s per 1k tokens ({split}){goal}"
            )
        print(
            f"greedy tokens through the server equal the in-process engine's: "
            f"{'yes' if mismatched == 0 else f'NO ({mismatched} request lists differ)'} "
            f"({args.rounds} rounds x {args.requests} requests x {len(sides) - 1} mode(s))"
        )
    finally:
        process.terminate()
        code = process.wait(timeout=60)
        if code != 0:
            print(f"the server exited with {code}: {''.join(log_tail)[-2000:]}")


if __name__ == "__main__":
    main()
