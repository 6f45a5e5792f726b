"""Engine speed on real model shapes, side by side: kvbench paged and contiguous, transformers generate() with a
static cache, and vLLM's CPU engine when a Python that has it is given.

Each engine runs in its own process on the same checkpoint (random weights with the shape of SmolLM2-135M or
TinyLlama-1.1B, written once to a temporary directory, their values bfloat16 numbers as in the published
checkpoints unless --weights fp32; or a real checkpoint with --checkpoint) and the same prompt
token ids; rounds alternate the engines' order, and the ratios reported are medians of per-round ratios (the runs
of a round are minutes apart at most, so load drifting over the benchmark cancels out), with the spread. Every
engine is warmed up on a batch of the same shape (other prompt tokens, so a prefix cache could not serve the timed
run; vLLM's is off as kvbench's is; 2 output tokens) before the timed run and runs with torch's
transparent huge pages on (as kvbench sets them for itself; THP_MEM_ALLOC_ENABLE=0 turns them off for all), and
every engine's greedy tokens are checked against kvbench paged's.

    python benchmarks/bench_real_shapes.py                                   # both shapes, both workloads
    python benchmarks/bench_real_shapes.py --shapes smollm2 --workloads 16x128x64 --rounds 3
    python benchmarks/bench_real_shapes.py --vllm-python /path/to/vllm-venv/bin/python
    python benchmarks/bench_real_shapes.py --checkpoint DIR --shapes checkpoint   # a real model (HF directory)
    python benchmarks/bench_real_shapes.py --threads 1,2                     # the thread policy, measured

Goals: paged >= 1.0x vLLM CPU (moonshot 1.5x), paged >= 0.97x contiguous at equal batch, >= 1.3x transformers static.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHAPES = {
    # name: (layers, hidden, heads, kv heads, intermediate, vocab, max positions, tied embeddings, rope theta)
    "smollm2": (30, 576, 9, 3, 1536, 49152, 8192, True, 100000.0),
    "tinyllama": (22, 2048, 32, 4, 5632, 32000, 2048, False, 10000.0),
}
ENGINES = ("paged", "contiguous", "hf-static", "vllm")
WARMUP_TOKENS = 2  # every engine is warmed up on all the prompts with this many output tokens, then timed


# -- workers (one process per engine run) ------------------------------------------------------------------------
def run_kvbench(job: dict) -> dict:
    import torch

    from kvbench.engine.config import EngineConfig
    from kvbench.engine.request import make_request
    from kvbench.engine.sampling import SamplingParams
    from kvbench.studies.local_model import build_engine, load_model

    loaded = load_model(job["checkpoint"], device="cpu", dtype=job["dtype"], threads=job["threads"])
    prompts, output_len = job["prompts"], job["output_len"]
    length = max(map(len, prompts)) + output_len
    blocks = len(prompts) * -(-length // 16) + 16  # equal batch: both engines hold every request at once
    engine = build_engine(loaded, EngineConfig(engine=job["engine"], block_size=16, num_blocks=blocks, max_len=length,
                                               max_num_seqs=len(prompts)))

    def requests(count: int, out: int) -> list:
        return [make_request(i, p, SamplingParams(max_tokens=out, ignore_eos=True)) for i, p in enumerate(prompts[:count])]

    # warm-up on a batch of the measured shape (2 tokens): oneDNN builds its matmul kernels per row count, so the
    # prefill and decode shapes of the timed run must have been seen once
    warm = [make_request(i, p, SamplingParams(max_tokens=job["warmup_tokens"], ignore_eos=True))
            for i, p in enumerate(job["warmup_prompts"])]
    engine.run(warm, len(warm))
    start = time.perf_counter()
    result = engine.run(requests(len(prompts), output_len), len(prompts))
    seconds = time.perf_counter() - start
    tokens = [r.output_token_ids for r in sorted(result.requests, key=lambda r: r.request_id)]
    return {"seconds": seconds, "tokens": tokens, "threads": torch.get_num_threads()}


def run_hf_static(job: dict) -> dict:
    import torch
    from transformers import LlamaForCausalLM

    torch.set_num_threads(job["threads"] or 1)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[job["dtype"]]
    model = LlamaForCausalLM.from_pretrained(job["checkpoint"], dtype=dtype).eval()
    prompts, output_len = job["prompts"], job["output_len"]
    ids = torch.tensor(prompts)  # equal prompt lengths: one batch, no padding
    warm = torch.tensor(job["warmup_prompts"])

    def generate(batch: torch.Tensor, new: int) -> torch.Tensor:
        with torch.inference_mode():
            return model.generate(batch, max_new_tokens=new, min_new_tokens=new, do_sample=False, num_beams=1,
                                  cache_implementation="static", pad_token_id=0, eos_token_id=None)

    generate(warm, job["warmup_tokens"])  # the measured batch's shapes, as for every engine
    start = time.perf_counter()
    out = generate(ids, output_len)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "tokens": out[:, ids.shape[1]:].tolist(), "threads": torch.get_num_threads()}


def worker(job_file: str) -> None:
    job = json.loads(Path(job_file).read_text())
    result = run_kvbench(job) if job["engine"] in ("paged", "contiguous") else run_hf_static(job)
    print("RESULT " + json.dumps(result))


# -- the parent -------------------------------------------------------------------------------------------------
def write_checkpoint(shape: str, dtype: str, weights: str, folder: Path) -> Path:
    """A random-weight Llama of ``shape`` (kvbench's seeded initialisation), saved as a plain HF checkpoint; with
    ``weights="bf16"`` its values are rounded to bfloat16 numbers first, as a published checkpoint's are."""
    import torch

    from kvbench.models.hf_model import build_random_model, round_weights_to_bf16_
    from kvbench.models.shapes import ModelShape

    layers, hidden, heads, kv_heads, inter, vocab, positions, tied, theta = SHAPES[shape]
    spec = ModelShape(f"{shape}-shape", layers, hidden, heads, kv_heads, inter, vocab, positions, rope_theta=theta,
                      tie_word_embeddings=tied, dtype=dtype)
    model = build_random_model(spec, seed=0, dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[dtype])
    if weights == "bf16" and dtype == "fp32":
        round_weights_to_bf16_(model)
    path = folder / f"{shape}-{dtype}-{weights}"
    model.save_pretrained(path, safe_serialization=True)
    return path


def vocab_of(checkpoint: Path) -> int:
    return json.loads((checkpoint / "config.json").read_text())["vocab_size"]


def launch(engine: str, job: dict, args, scratch: Path) -> dict:
    job_file = scratch / f"job-{engine}.json"
    job_file.write_text(json.dumps({**job, "engine": engine}))
    # THP_MEM_ALLOC_ENABLE: kvbench turns torch's transparent huge pages on for itself (kvbench/__init__.py); every
    # engine gets the same, so the ratios compare engines, not page sizes
    env = {**os.environ, "OMP_NUM_THREADS": str(job["threads"] or 1), "TOKENIZERS_PARALLELISM": "false",
           "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE", "1")}
    if engine == "vllm":
        env.update(VLLM_CPU_OMP_THREADS_BIND="nobind", VLLM_CPU_KVCACHE_SPACE="4", VLLM_LOGGING_LEVEL="ERROR")
        command = [args.vllm_python, str(HERE / "vllm_worker.py"), str(job_file)]
    else:
        command = [sys.executable, str(Path(__file__).resolve()), "--worker", str(job_file)]
    # cwd outside the repository: vLLM inspects models in a `python -m` subprocess, which puts its cwd on sys.path,
    # and nothing of this checkout should shadow what vLLM imports
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=args.timeout, cwd=scratch)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
        raise RuntimeError(f"{engine} failed (exit {done.returncode}): " + " | ".join(tail))
    return json.loads(lines[-1].removeprefix("RESULT "))


def agreement(tokens: list[list[int]], reference: list[list[int]]) -> float:
    pairs = [(a, b) for x, y in zip(tokens, reference, strict=True) for a, b in zip(x, y, strict=True)]
    return sum(a == b for a, b in pairs) / len(pairs)


def bench(label: str, checkpoint: Path, workload: str, engines: list[str], threads: int | None, args, scratch: Path):
    import numpy as np

    count, prompt_len, output_len = (int(x) for x in workload.split("x"))
    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(0, vocab_of(checkpoint), (count, prompt_len)).tolist()
    warmup_prompts = rng.integers(0, vocab_of(checkpoint), (count, prompt_len)).tolist()  # other tokens: no cache hit
    job = {"checkpoint": str(checkpoint), "prompts": prompts, "warmup_prompts": warmup_prompts,
           "warmup_tokens": WARMUP_TOKENS, "output_len": output_len, "dtype": args.dtype, "threads": threads}
    rates: dict[str, list[float]] = {e: [] for e in engines}
    reference = None
    agreements: dict[str, float] = {}
    for round_index in range(args.rounds):
        order = engines[round_index % len(engines):] + engines[:round_index % len(engines)]  # rotate the order
        for engine in order:
            result = launch(engine, job, args, scratch)
            rates[engine].append(count * output_len / result["seconds"])
            if engine == "paged" and reference is None:
                reference = result["tokens"]
            agreements.setdefault(engine, 1.0)
            agreements[engine] = min(agreements[engine], agreement(result["tokens"], reference or result["tokens"]))
        print(f"  {label} {workload} threads={threads or 'auto'} round {round_index + 1}: "
              + ", ".join(f"{e} {rates[e][-1]:.1f}" for e in engines) + " tok/s", flush=True)
    return rates, agreements


def ratio_line(rates: dict[str, list[float]], a: str, b: str) -> str:
    ratios = [x / y for x, y in zip(rates[a], rates[b], strict=True)]
    return (f"{a}/{b} = {statistics.median(ratios):.2f}x (per-round median; min {min(ratios):.2f}, max "
            f"{max(ratios):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--shapes", default="smollm2,tinyllama", help="smollm2, tinyllama and/or checkpoint")
    parser.add_argument("--checkpoint", type=Path, help="a real HF checkpoint directory (with --shapes checkpoint)")
    parser.add_argument("--workloads", default="16x128x64,50x128x128", help="requests x prompt x output tokens")
    parser.add_argument("--engines", default="paged,contiguous,hf-static,vllm")
    parser.add_argument("--vllm-python", help="a Python that can import vllm (vllm-cpu); without it vLLM is skipped")
    parser.add_argument("--threads", default="1", help="comma-separated thread counts to run at, or auto")
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--weights", default="bf16", choices=("bf16", "fp32"),
                        help="the values the random weights hold: bf16 numbers, as SmolLM2's and TinyLlama's "
                             "published checkpoints store them (kvbench's AMX path applies), or any float32")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--timeout", type=int, default=1800, help="seconds per engine run")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    engines = [e for e in args.engines.split(",") if e != "vllm" or args.vllm_python]
    if "vllm" in args.engines and not args.vllm_python:
        print("vLLM skipped: give --vllm-python (a Python with vllm-cpu installed)")
    thread_counts = [None if t == "auto" else int(t) for t in args.threads.split(",")]
    with tempfile.TemporaryDirectory(prefix="kvbench-shapes-") as tmp:
        scratch = Path(tmp)
        for shape in args.shapes.split(","):
            checkpoint = args.checkpoint if shape == "checkpoint" else write_checkpoint(shape, args.dtype, args.weights,
                                                                                        scratch)
            if checkpoint is None:
                raise SystemExit("--shapes checkpoint needs --checkpoint DIR")
            for workload in args.workloads.split(","):
                for threads in thread_counts:
                    rates, agree = bench(shape, checkpoint, workload, engines, threads, args, scratch)
                    weights = "checkpoint's" if shape == "checkpoint" else args.weights
                    print(f"{shape} ({weights} weights) {workload} threads={threads or 'auto'} {args.dtype}: "
                          + ", ".join(f"{e} {statistics.median(r):.1f} tok/s" for e, r in rates.items()))
                    for other in engines[1:]:
                        print("   " + ratio_line(rates, "paged", other))
                    print("   token agreement with kvbench paged: "
                          + ", ".join(f"{e} {100 * a:.1f}%" for e, a in agree.items()), flush=True)


if __name__ == "__main__":
    main()
