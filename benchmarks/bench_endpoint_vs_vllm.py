"""Do kvbench's endpoint figures agree with ``vllm bench serve`` on the same server and the same requests?

Both clients send the same request list to the same running vLLM server, alternately (ABBA order over the
rounds, so drift and the machine's noise hit both), each run preceded by a prefix-cache reset so neither finds
the other's prompts cached (the server needs ``VLLM_SERVER_DEV_MODE=1``; without it the script says the cache
could not be reset). The requests: the prompts of a dataset (kvbench's ``real-chat`` by default) through the
model's chat template, sent as text to ``/v1/completions`` (to vLLM's bench as a ShareGPT file read with
``--disable-shuffle``: its ``custom`` dataset needs pandas, which a vLLM CPU install may lack; each answer is
written as " a" repeated, which SmolLM2's and Llama's tokenizers count one token per repeat, so vLLM's bench
asks for exactly the same lengths), each run to its reference answer length clipped to
[``--min-output``, ``--max-output``] with ``ignore_eos``; closed loop of ``--concurrency`` (vLLM:
``--max-concurrency`` at an infinite rate), ``--warmups`` uncounted copies of the first request before each run.

After the first round, vLLM's own ``calculate_metrics`` is run on kvbench's request records
(``kvbench/endpoint/vllm_oracle.py``): the definitions must give the same figures to 1e-9.

With ``--client sweep`` kvbench's side is the command users run, ``kvbench sweep --target URL`` (a requests
file of the same prompts as token ids, tokenized as vLLM tokenizes a text prompt, each to the same length with
EOS ignored; its own warm-up), instead of the library's point.

Reported: the medians over rounds of mean TTFT, mean TPOT and output throughput for each client and their
ratio (goal: within 5%), and each client's mean TTFT against the server's own TTFT histogram over the same run
(``vllm:time_to_first_token_seconds``, scraped before and after: the client's includes HTTP and detokenizing,
so it should be a little larger).

    VLLM_SERVER_DEV_MODE=1 python -m vllm.entrypoints.openai.api_server --model DIR ...   # a server, elsewhere
    python benchmarks/bench_endpoint_vs_vllm.py --url http://127.0.0.1:8000 --model-dir DIR \\
        --vllm-python /path/to/vllm-venv/bin/python [--requests 48 --concurrency 8 --rounds 4]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from kvbench.endpoint.cache_reset import reset_prefix_cache
from kvbench.endpoint.client import Target, open_session
from kvbench.endpoint.conversation import Conversation, Turn
from kvbench.endpoint.load import ClosedLoop
from kvbench.endpoint.run_point import PointSettings, run_point_sync
from kvbench.endpoint.scraper import fetch_metrics
from kvbench.endpoint.vllm_oracle import differences, vllm_metrics
from kvbench.results.servers import read_states
from kvbench.workload.dataset import TokenCounter, sample_dataset

VLLM_BENCH = (
    "import sys; from vllm.benchmarks.serve import add_cli_args, main; "
    "from vllm.utils.argparse_utils import FlexibleArgumentParser; p = FlexibleArgumentParser(); "
    "add_cli_args(p); main(p.parse_args(sys.argv[1:]))"
)


def request_list(model_dir: str, dataset: str, count: int, low: int, high: int) -> list[tuple[str, int]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    counter = TokenCounter(tokenizer, model_dir)
    sample = sample_dataset(dataset, counter, max_len=1024, count=count, seed=0)
    texts = counter.prompt_texts([r.prompt for r in sample.requests])
    return [(text, max(low, min(high, r.output_len))) for text, r in zip(texts, sample.requests, strict=True)]


async def _server_ttft(url: str) -> tuple[float, float]:
    async with open_session() as session:
        states = read_states(await fetch_metrics(session, url + "/metrics", 10.0), url)
    return sum(s.ttft_sum_s or 0 for s in states), sum(s.ttft_count or 0 for s in states)


async def _reset(url: str) -> dict:
    async with open_session() as session:
        return await reset_prefix_cache(session, url, "vllm")


def server_mean_ttft_ms(before: tuple[float, float], after: tuple[float, float]) -> float | None:
    count = after[1] - before[1]
    return (after[0] - before[0]) / count * 1000 if count else None


def run_vllm(args, model: str, requests: list[tuple[str, int]], work: Path, round_: int) -> dict:
    dataset = work / "requests.json"
    result = work / f"vllm-{round_}.json"
    command = [
        args.vllm_python,
        "-c",
        VLLM_BENCH,
        "--base-url",
        args.url,
        "--endpoint",
        "/v1/completions",
        "--model",
        model,
        "--tokenizer",
        args.model_dir,
        "--dataset-name",
        "sharegpt",
        "--dataset-path",
        str(dataset),
        "--disable-shuffle",
        "--num-prompts",
        str(len(requests)),
        "--max-concurrency",
        str(args.concurrency),
        "--request-rate",
        "inf",
        "--num-warmups",
        str(args.warmups),
        "--ignore-eos",
        "--disable-tqdm",
        "--save-result",
        "--save-detailed",
        "--result-dir",
        str(work),
        "--result-filename",
        result.name,
    ]
    before = asyncio.run(_server_ttft(args.url))
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, cwd=tempfile.gettempdir())
    after = asyncio.run(_server_ttft(args.url))
    if done.returncode != 0 or not result.exists():
        sys.exit(f"vllm bench serve failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    data = json.loads(result.read_text())
    wanted = [output for _, output in requests]
    if data["output_lens"] != wanted:
        sys.exit(
            "vllm bench serve's requests did not produce the same output lengths: check that the tokenizer counts ' a' "
            "as one token"
        )
    # the server's histogram also saw vLLM bench's ready check and warm-up requests: they are left out by
    # taking the server's count and sum over the measured requests only when the counts match
    return {
        "mean_ttft_ms": data["mean_ttft_ms"],
        "mean_tpot_ms": data["mean_tpot_ms"],
        "output_throughput": data["output_throughput"],
        "completed": data["completed"],
        "failed": data.get("failed", 0),
        "total_output_tokens": data["total_output_tokens"],
        "server_ttft_ms_incl_warmup": server_mean_ttft_ms(before, after),
        "server_ttft_requests": after[1] - before[1],
        "ttfts_ms": [t * 1000 for t in data["ttfts"]],
    }


def run_ours(args, model: str, requests: list[tuple[str, int]], check_definitions: bool = False) -> dict:
    conversations = [Conversation(i, (Turn(text, out, ignore_eos=True),)) for i, (text, out) in enumerate(requests)]
    first = requests[0]
    warmup = [Conversation(i, (Turn(first[0], first[1], ignore_eos=True),)) for i in range(args.warmups + 1)]
    scrape = args.scrape_interval > 0
    point = run_point_sync(
        Target(args.url, model=model),
        conversations,
        PointSettings(
            ClosedLoop(args.concurrency),
            warmup=warmup,
            scrape=scrape,
            scrape_interval_s=args.scrape_interval if scrape else 0.5,
        ),
    )
    m = point.metrics.to_json()
    s = point.server.to_json() if point.server else {}
    if check_definitions:
        found = differences(m, vllm_metrics(args.vllm_python, point.records, point.duration_s))
        print(
            "vLLM's calculate_metrics on kvbench's records: "
            + ("the same figures" if not found else f"DIFFERENT {found}"),
            file=sys.stderr,
        )
    return {
        "mean_ttft_ms": m["mean_ttft_ms"],
        "mean_tpot_ms": m["mean_tpot_ms"],
        "output_throughput": m["output_throughput"],
        "completed": m["completed"],
        "failed": m["failed"],
        "total_output_tokens": m["total_output_tokens"],
        "server_ttft_ms": s.get("server_mean_ttft_ms"),
        "server_ttft_requests": s.get("server_ttft_count"),
        "kv_usage_peak": s.get("kv_usage_peak"),
        "running_peak": s.get("running_peak"),
        "prefix_cache_hit_rate": s.get("prefix_cache_hit_rate"),
        "ttfts_ms": [r.ttft * 1000 if r.ttft is not None else None for r in point.records],
    }


def run_sweep_command(args, model: str, requests: list[tuple[str, int]], work: Path, round_: int) -> dict:
    """kvbench's side through ``kvbench sweep --target``: its results.jsonl point."""
    from transformers import AutoTokenizer

    lines = work / "sweep-requests.jsonl"
    if not lines.exists():
        tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
        lines.write_text(
            "".join(
                json.dumps({"prompt_token_ids": tokenizer(text)["input_ids"], "output_len": out}) + "\n"
                for text, out in requests
            ),
            encoding="utf-8",
        )
    out = work / f"sweep-{round_}"
    command = [
        sys.executable,
        "-m",
        "kvbench.cli",
        "sweep",
        "--target",
        f"vllm={args.url}",
        "--model",
        args.model_dir,
        "--model-name",
        model,
        "--requests-file",
        str(lines),
        "--stop",
        "length",
        "--concurrency",
        str(args.concurrency),
        "--out",
        str(out),
    ]
    if args.scrape_interval > 0:
        command += ["--scrape-interval", str(args.scrape_interval)]
    else:
        command += ["--no-scrape"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=1800, env={**os.environ, "KVBENCH_REPORT": "0"}
    )
    if done.returncode != 0:
        sys.exit(f"kvbench sweep --target failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    (point,) = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines() if line.strip()]
    if point["total_output_tokens"] != sum(o for _, o in requests):
        sys.exit("kvbench sweep --target did not produce the same output lengths")
    return {
        "mean_ttft_ms": point["mean_ttft_ms"],
        "mean_tpot_ms": point["mean_tpot_ms"],
        "output_throughput": point["output_throughput"],
        "completed": point["completed"],
        "failed": point["failed"],
        "total_output_tokens": point["total_output_tokens"],
        "server_ttft_ms": point.get("server_mean_ttft_ms"),
        "kv_usage_peak": point.get("kv_usage_peak"),
        "total_input_tokens": point["total_input_tokens"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--model-dir", required=True, help="the served checkpoint (tokenizer and chat template)")
    parser.add_argument("--model", default=None, help="the served model name (default: the model directory)")
    parser.add_argument("--vllm-python", required=True)
    parser.add_argument("--dataset", default="real-chat")
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--warmups", type=int, default=2)
    parser.add_argument("--min-output", type=int, default=16)
    parser.add_argument("--max-output", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--scrape-interval", type=float, default=0.5, help="kvbench's /metrics scraping; 0: off")
    parser.add_argument("--out", default=None, help="write every round as JSON here")
    parser.add_argument(
        "--client",
        choices=("point", "sweep"),
        default="point",
        help="kvbench's side: the library's point, or the command `kvbench sweep --target`",
    )
    args = parser.parse_args()
    model = args.model or args.model_dir
    requests = request_list(args.model_dir, args.dataset, args.requests, args.min_output, args.max_output)
    rows: dict[str, list[dict]] = {"kvbench": [], "vllm": []}
    with tempfile.TemporaryDirectory() as folder:
        work = Path(folder)
        (work / "requests.json").write_text(
            json.dumps(
                [
                    {"conversations": [{"from": "human", "value": text}, {"from": "gpt", "value": " a" * output}]}
                    for text, output in requests
                ]
            ),
            encoding="utf-8",
        )
        for round_ in range(args.rounds):
            order = ("vllm", "kvbench") if round_ % 2 == 0 else ("kvbench", "vllm")
            for who in order:
                reset = asyncio.run(_reset(args.url))
                if reset["reset"] is not True:
                    print(f"warning: prefix cache not reset ({reset['detail']})", file=sys.stderr)
                began = time.perf_counter()
                if who == "vllm":
                    row = run_vllm(args, model, requests, work, round_)
                elif args.client == "sweep":
                    row = run_sweep_command(args, model, requests, work, round_)
                else:
                    row = run_ours(args, model, requests, check_definitions=round_ == 0)
                row["wall_s"] = time.perf_counter() - began
                rows[who].append(row)
                print(
                    f"round {round_ + 1} {who}: "
                    + json.dumps(
                        {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items() if k != "ttfts_ms"}
                    ),
                    file=sys.stderr,
                )
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rounds": rows}, indent=2))
    print(
        f"{len(requests)} requests ({sum(o for _, o in requests)} output tokens), concurrency {args.concurrency}, "
        f"{args.rounds} rounds, medians"
    )
    print(f"{'metric':<28} {'kvbench':>10} {'vllm bench':>11} {'ratio':>7} {'ratio per round (median, range)':>34}")
    for key in ("mean_ttft_ms", "mean_tpot_ms", "output_throughput"):
        ours = statistics.median(r[key] for r in rows["kvbench"])
        theirs = statistics.median(r[key] for r in rows["vllm"])
        # each round's two runs are adjacent in time, so their ratio sees the least drift of a shared machine
        pairs = [a[key] / b[key] for a, b in zip(rows["kvbench"], rows["vllm"], strict=True)]
        print(
            f"{key:<28} {ours:>10.2f} {theirs:>11.2f} {ours / theirs:>7.3f} "
            f"{statistics.median(pairs):>14.3f} ({min(pairs):.3f}-{max(pairs):.3f})"
        )
    if args.scrape_interval > 0:
        ours_server = statistics.median(r["server_ttft_ms"] for r in rows["kvbench"])
        ours_client = statistics.median(r["mean_ttft_ms"] for r in rows["kvbench"])
        print(
            f"kvbench mean TTFT {ours_client:.2f} ms vs the server's histogram over the same requests "
            f"{ours_server:.2f} ms (client - server {ours_client - ours_server:+.2f} ms)"
        )
    theirs_server = statistics.median(r["server_ttft_ms_incl_warmup"] for r in rows["vllm"])
    print(
        f"vllm bench mean TTFT {statistics.median(r['mean_ttft_ms'] for r in rows['vllm']):.2f} ms vs the "
        f"server's histogram {theirs_server:.2f} ms (its window includes its ready check and warm-ups)"
    )


if __name__ == "__main__":
    main()
