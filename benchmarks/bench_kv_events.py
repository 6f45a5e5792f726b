"""Prefix reuse on a live server: what listening to KV events costs, and how the figures hold against vLLM.

1. The listener's own speed: a ZMQ publisher in this process sends batches of BlockStored events as fast as it
   can; the subscriber decodes and keeps them (events per second of one core).
2. What publishing costs the server: ``kvbench serve`` with and without ``--kv-events`` under the same
   ``sweep --target`` point (``--prefix-hit-rate 0.5``, closed loop), alternating A B A B, output tok/s.
3. With ``--vllm-python``: a vLLM CPU server (prefix caching, per-request cached tokens, KV events to kvbench on
   127.0.0.1 with its replay socket; a two-layer random Llama made here), ``sweep --target`` at target hit rates
   0, 0.5 and 0.9, and at one KV size small enough to evict: the rate achieved against the target, the answers'
   cached tokens against the counters, and the blocks the events rebuilt.

    python benchmarks/bench_kv_events.py [--vllm-python /path/to/vllm-venv/bin/python]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

from kvbench.cli import main as kvbench
from kvbench.endpoint.kv_event_subscriber import KvEventSubscriber
from kvbench.measure.kv_events import BlockStored, EventBatch, encode_batch, sequence_bytes

ROOT = Path(__file__).resolve().parents[1]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def listener_speed(batches: int = 4000, per_batch: int = 64) -> dict:
    context = zmq.Context()
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.SNDHWM, 0)
    address = f"tcp://127.0.0.1:{_free_port()}"
    pub.bind(address)
    listener = KvEventSubscriber(address, max_events=batches * per_batch + 1).start()
    payloads = [
        encode_batch(
            EventBatch(time.time(), [BlockStored([b * per_batch + i], None, [1] * 16, 16) for i in range(per_batch)])
        )
        for b in range(batches)
    ]
    started = time.perf_counter()
    cpu = time.process_time()
    for seq, payload in enumerate(payloads):
        pub.send_multipart((b"", sequence_bytes(seq), payload))
    while len(listener.log.batches) < batches and time.perf_counter() - started < 60:
        time.sleep(0.01)
    elapsed = time.perf_counter() - started
    log = listener.stop(drain_s=0.0)
    pub.close(0)
    context.term()
    return {
        "batches": len(log.batches),
        "events": log.events,
        "lost_batches": log.lost_batches,
        "seconds": round(elapsed, 3),
        "events_per_s": round(log.events / elapsed),
        "process_cpu_s": round(time.process_time() - cpu, 3),
    }


def _serve(*extra: str) -> tuple[subprocess.Popen, str]:
    command = [sys.executable, "-m", "kvbench.cli", "serve", "--port", "0", "--kv-memory", "16MiB", "--threads", "1"]
    process = subprocess.Popen([*command, "--log-interval", "0", *extra], stderr=subprocess.PIPE, text=True, cwd=ROOT)
    assert process.stderr is not None
    for line in process.stderr:
        found = re.search(r"serving on (http://\S+)", line)
        if found:
            return process, found.group(1)
    raise SystemExit(f"kvbench serve did not start: {process.stderr.read()}")


def _sweep(url: str, out: Path, *extra: str) -> dict:
    args = ["sweep", "--target", f"t={url}", "--requests", "48", "--concurrency", "4", "--prefix-hit-rate", "0.5"]
    code = kvbench([*args, "--reset-prefix-cache", "--out", str(out), *extra])
    if code != 0:
        raise SystemExit(f"kvbench sweep exited {code}")
    (point,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    return point


def publishing_cost(work: Path, rounds: int = 2) -> dict:
    events = f"ipc://{work}/events"
    plain, plain_url = _serve()
    publishing, publishing_url = _serve("--kv-events", events)
    speeds: dict[str, list[float]] = {"without": [], "with": []}
    try:
        for round_ in range(rounds):
            for name, url, extra in (("without", plain_url, ()), ("with", publishing_url, ("--kv-events", events))):
                point = _sweep(url, work / f"cost-{name}-{round_}", *extra)
                speeds[name].append(point["output_throughput"])
    finally:
        for process in (plain, publishing):
            process.terminate()
            process.wait(60)
    without, with_ = statistics.median(speeds["without"]), statistics.median(speeds["with"])
    return {
        "out_tok_s_without": speeds["without"],
        "out_tok_s_with": speeds["with"],
        "ratio": round(with_ / without, 3),
    }


def against_vllm(python: str, work: Path) -> list[dict]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from reuse_vs_vllm import BLOCK, BLOCK_BYTES, tiny_llama

    model = tiny_llama(work / "model")
    rows = []
    for kv_blocks, rates in ((2000, (0.0, 0.5, 0.9)), (120, (0.9,))):
        port, events, replay = _free_port(), f"tcp://127.0.0.1:{_free_port()}", f"tcp://127.0.0.1:{_free_port()}"
        config = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": events, "replay_endpoint": replay}
        command = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--host", "127.0.0.1"]
        command += ["--port", str(port), "--dtype", "float32", "--enforce-eager", "--skip-tokenizer-init"]
        command += ["--max-model-len", "2048", "--block-size", str(BLOCK), "--enable-prefix-caching"]
        command += ["--kv-cache-memory-bytes", str(kv_blocks * BLOCK_BYTES), "--enable-prompt-tokens-details"]
        command += ["--served-model-name", "tiny", "--kv-events-config", json.dumps(config)]
        env = {k: v for k, v in os.environ.items() if k != "VLLM_CPU_KVCACHE_SPACE"} | {"VLLM_SERVER_DEV_MODE": "1"}
        log = work / f"vllm-{kv_blocks}.log"
        with open(log, "wb") as out:
            server = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 600
            while True:
                try:
                    subprocess.run(["curl", "-sf", f"{url}/health"], check=True, capture_output=True)
                    break
                except subprocess.CalledProcessError:
                    if server.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"vLLM did not start; see {log}") from None
                    time.sleep(1)
            for rate in rates:
                args = ["--prefix-hit-rate", str(rate), "--kv-events", events, "--kv-events-bind"]
                args += ["--kv-events-replay", replay, "--scrape-interval", "0.2"]
                point = _sweep(url, work / f"vllm-{kv_blocks}-{rate}", *args)
                reuse, kv = point["prefix_reuse"], point["kv_events"]
                rows.append(
                    {
                        "kv_blocks": kv_blocks,
                        "target": rate,
                        "achieved_requests": reuse["hit_rate_requests"],
                        "achieved_counters": reuse["hit_rate_counters"],
                        "tolerance": reuse["target"]["tolerance"],
                        "met": reuse["target"]["met"],
                        "difference_tokens": reuse["difference_tokens"],
                        "stored": kv["kv_blocks_stored"],
                        "removed": kv["kv_blocks_removed"],
                        "thrash_share": kv["kv_thrash_share"],
                        "history_complete": kv["history_complete"],
                        "lost_batches": kv["lost_batches"],
                        "out_tok_s": point["output_throughput"],
                    }
                )
        finally:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(60)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vllm-python", help="a Python that imports vllm (vllm-cpu): also measure against vLLM")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kvbench-kv-events-") as folder:
        work = Path(folder)
        print("listener:", json.dumps(listener_speed()))
        print("publishing:", json.dumps(publishing_cost(work)))
        if args.vllm_python:
            for row in against_vllm(args.vllm_python, work):
                print("vllm:", json.dumps(row))


if __name__ == "__main__":
    main()
