"""End-to-end engine benchmark: the paged engine vs ``transformers`` and vs the contiguous baseline, in one run.

Same model (the ``tiny`` preset, random weights from ``--seed``), same prompts, same CPU, side by side:

  a. paged engine vs ``generate()`` with a static cache (batched, greedy, no EOS)        goal >= 1.0x
  b. paged engine vs ``generate_batch()`` (transformers continuous batching, paged cache)  goal >= 5x
  c. paged vs contiguous engine at equal batch, both fit                                 goal within 5 %
  d. scheduler + block-table overhead as a share of step time at 50 running requests     goal < 10 %

Throughput is output tokens over the wall time of the whole call (prefill included), after one warm-up, the
contenders interleaved in rounds (order alternating). A ratio is the median over rounds of that round's
ratio: the two runs of a round sit next to each other in time, so load that drifts over the minutes (wall
times swing by +-50 % on a shared machine) cancels out; the best-of ratio is shown next to it. Each run's
process CPU time gives the same ratios on CPU time (``cpu``). ``generate_batch`` is timed the way transformers'
own example (examples/pytorch/continuous_batching.py) times it: the whole call, after a warm-up call; it is
interleaved with paged-engine runs of its own. The stricter ratio against its generation span alone (first
request created -> last token, leaving out its manager start/stop) is printed next to it. Greedy tokens are
cross-checked.

The overhead profile (d) times each per-step part of the engine loop in wall and thread-CPU time. The goal
counts the scheduler (admission, room for the next token, the loop's per-request bookkeeping) and the block
tables (packing the step's ids, positions, slots and tables; on decode steps that includes keeping the torch
kernels' gather index and mask, which ``DecodeBatch`` advances with the tables). Two stricter totals follow:
one that also counts the attention plans the runner makes itself (prefill steps; the Triton kernels
translate addresses inside and need none), and one that adds kvbench's own memory accounting (a snapshot per
step, the hindsight pass at the end).

    python benchmarks/bench_engine.py [--quick] [--out results.json] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import statistics
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kvbench import kernels
from kvbench.engine.config import EngineConfig
from kvbench.engine.decode_batch import DecodeBatch
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.engine.scheduler import Scheduler
from kvbench.engine.step_log import StepLog
from kvbench.fileio import write_json_atomic
from kvbench.studies.local_model import load_model

BLOCK_SIZE = 16


# ---------------------------------------------------------------------------------------------- contenders


@dataclass
class Timing:
    """Wall and CPU times of repeated runs of one contender, and the tokens of its last run."""

    name: str
    tokens_per_run: int
    seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    outputs: list[list[int]] | None = None
    extra: dict = field(default_factory=dict)

    @property
    def best_tps(self) -> float:
        return self.tokens_per_run / min(self.seconds)

    @property
    def cpu_tps(self) -> float:
        return self.tokens_per_run / min(self.cpu_seconds)

    @property
    def median_tps(self) -> float:
        return self.tokens_per_run / statistics.median(self.seconds)


class EngineRun:
    """All prompts at once through a fresh run of one engine; calling it returns (seconds, outputs)."""

    def __init__(self, model, engine: str, prompts: list[list[int]], output_len: int, max_len: int) -> None:
        per_request = -(-max_len // BLOCK_SIZE)
        config = EngineConfig(
            engine=engine,
            block_size=BLOCK_SIZE,
            num_blocks=len(prompts) * per_request + 1,
            max_len=max_len,
            reserve="max",
            max_num_seqs=max(256, len(prompts)),
        )
        self.engine = engine
        self.llm = LLMEngine(model, config)
        self.prompts = prompts
        self.params = SamplingParams(max_tokens=output_len, ignore_eos=True)

    def __call__(self) -> tuple[float, list[list[int]]]:
        requests = [make_request(i, p, self.params) for i, p in enumerate(self.prompts)]
        start = time.perf_counter()
        result = self.llm.run(requests, len(requests))
        seconds = time.perf_counter() - start
        if result.rejected or result.num_preemptions:
            raise RuntimeError(f"{self.engine}: {len(result.rejected)} rejected, {result.num_preemptions} preemptions")
        return seconds, [r.output_token_ids for r in requests]


def static_generate_runner(model, prompts: list[list[int]], output_len: int) -> Callable:
    """Batched ``generate()`` with a static cache, greedy, exactly ``output_len`` new tokens."""
    input_ids = torch.tensor(prompts)
    mask = torch.ones_like(input_ids)  # explicit: token 0 is also the pad id

    def run() -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                input_ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=output_len,
                min_new_tokens=output_len,
                cache_implementation="static",
                pad_token_id=0,
            )
        return time.perf_counter() - start, out[:, input_ids.shape[1] :].tolist()

    return run


class GenerateBatchRun:
    """``generate_batch()``: transformers' continuous batching with its own paged cache, sized for the workload.

    The cache is sized explicitly: left to itself on CPU it sizes from host memory and spent ~50 s before its
    first token here. Page size 64 was the fastest of 16/64/128/256 on this workload. Calling it returns the
    whole call's wall time and the outputs; each call's generation span goes to ``spans``.
    """

    PAGE_SIZE = 64

    def __init__(self, model, prompts: list[list[int]], output_len: int) -> None:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)  # psutil notices on CPU
        pages = len(prompts) * -(-(len(prompts[0]) + output_len) // self.PAGE_SIZE) + len(prompts)
        self.cb_config = ContinuousBatchingConfig(
            page_size=self.PAGE_SIZE,
            num_blocks=pages,
            max_batch_tokens=1024,
            max_requests_per_batch=len(prompts),
            use_cuda_graph=False,
        )
        self.gen_config = GenerationConfig(max_new_tokens=output_len, do_sample=False, eos_token_id=-1, pad_token_id=0)
        self.model = model
        self.prompts = prompts
        self.spans: list[float] = []

    def __call__(self) -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        results = self.model.generate_batch(
            self.prompts,
            generation_config=self.gen_config,
            continuous_batching_config=self.cb_config,
            warmup=False,
            record_timestamps=True,
        )
        wall = time.perf_counter() - start
        if len(results) != len(self.prompts):
            raise RuntimeError(f"generate_batch returned {len(results)} of {len(self.prompts)} requests")
        ordered = [results[f"req_{i}"] for i in range(len(self.prompts))]
        self.spans.append(max(o.timestamps[-1] for o in ordered) - min(o.created_time for o in ordered))
        return wall, [list(o.generated_tokens) for o in ordered]


def measure(contenders: dict[str, Callable], tokens: int, repeats: int, warmup: set[str]) -> dict[str, Timing]:
    """Interleave the contenders ``repeats`` times, order alternating (one untimed warm-up for those in ``warmup``)."""
    timings = {name: Timing(name, tokens) for name in contenders}
    for name in warmup:
        contenders[name]()
    order = list(contenders)
    for repeat in range(repeats):
        for name in order if repeat % 2 == 0 else order[::-1]:
            cpu_start = time.process_time()
            seconds, outputs = contenders[name]()
            timings[name].cpu_seconds.append(time.process_time() - cpu_start)
            timings[name].seconds.append(seconds)
            timings[name].outputs = outputs
    return timings


# ---------------------------------------------------------------------------------------------- overhead


class StepProfile:
    """Wall and thread-CPU time spent inside named callables (wrappers installed on one engine for one run)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn: Callable) -> Callable:
        def timed(*args, **kwargs):
            cpu_start, start = time.thread_time(), time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.perf_counter() - start
                self.cpu[name] += time.thread_time() - cpu_start
                self.calls[name] += 1

        return timed


# (category, label) per timed name. Only per-step calls are wrapped (a wrapper costs ~1 us; per-request calls
# would inflate what they measure); per-request work is the untimed rest of the loop. "forward:*" nest in forward.
# The attention plan the runner makes (the torch kernels' gather index and mask, for prefill steps; decode
# steps get theirs from DecodeBatch, timed with it) is taken out of the model's time and shown on its own.
OVERHEAD_PARTS = {
    "admit": ("scheduler", "scheduler.admit (FCFS admission + allocation)"),
    "prepare_decode": ("scheduler", "_make_room (room for the next token, preemption, CoW)"),
    "build_step": ("block tables", "build_step / DecodeBatch.step (pack ids, positions, slots, tables)"),
    "plan": (
        "kernel plan",
        "torch attention plan made by the runner (prefill steps; decode plans are kept by DecodeBatch)",
    ),
    "record": ("accounting", "StepLog.snapshot (kvbench's per-step memory snapshot)"),
    "result": ("accounting", "_result (kvbench's hindsight waste accounting, once per run)"),
    "sample": ("sampling", "runner.sample (argmax over the batch)"),
    "forward": ("model", "runner.forward (the model, its attention plan left out)"),
}
NESTED_PARTS = {
    "forward:attention": "  of which paged attention kernels (torch reference)",
    "forward:write_kv": "  of which write_kv",
}
LOOP_LABEL = "engine loop: chunk lists + block_table, per-request emit (finish, free, top-up)"
GOAL_CATEGORIES = ("scheduler", "block tables")


def _instrument(llm: LLMEngine, prof: StepProfile) -> Callable[[], None]:
    """Install timing wrappers on ``llm`` (and the module functions it calls); returns the undo."""
    saved = {
        "decode": kernels.paged_decode_attention,
        "prefill": kernels.paged_prefill_attention,
        "write_kv": kernels.write_kv,
        "decode_batch": DecodeBatch.step,
        "admit": Scheduler.admit,
        "snapshot": StepLog.snapshot,
    }
    Scheduler.admit = prof.wrap("admit", saved["admit"])
    StepLog.snapshot = prof.wrap("record", saved["snapshot"])
    llm._make_room = prof.wrap("prepare_decode", llm._make_room)
    llm._result = prof.wrap("result", llm._result)
    llm.runner._attention_plan = prof.wrap("plan", llm.runner._attention_plan)
    llm.runner.build_step = prof.wrap("build_step", llm.runner.build_step)
    DecodeBatch.step = prof.wrap("build_step", saved["decode_batch"])
    llm.runner.forward = prof.wrap("forward", llm.runner.forward)
    llm.runner.sample = prof.wrap("sample", llm.runner.sample)
    kernels.paged_decode_attention = prof.wrap("forward:attention", saved["decode"])
    kernels.paged_prefill_attention = prof.wrap("forward:attention", saved["prefill"])
    kernels.write_kv = prof.wrap("forward:write_kv", saved["write_kv"])

    def undo() -> None:
        kernels.paged_decode_attention = saved["decode"]
        kernels.paged_prefill_attention = saved["prefill"]
        kernels.write_kv = saved["write_kv"]
        DecodeBatch.step = saved["decode_batch"]
        Scheduler.admit = saved["admit"]
        StepLog.snapshot = saved["snapshot"]
        for name in ("_make_room", "_result"):
            vars(llm).pop(name, None)
        for name in ("build_step", "forward", "_attention_plan", "sample"):
            vars(llm.runner).pop(name, None)

    return undo


def profile_overhead(
    model,
    engine: str,
    num_requests: int,
    prompt_len: int,
    output_len: int,
    seed: int,
    vocab: int,
    repeats: int,
    cprofile: bool = False,
) -> dict:
    """Run ``num_requests`` at once with each step's parts timed; the run with least CPU time is kept.

    The goal's overhead is the scheduler and block-table parts (``GOAL_CATEGORIES``); kvbench's accounting is
    reported next to it, and the untimed rest of the loop counts as scheduler.
    """
    generator = torch.Generator().manual_seed(seed + 7)
    prompts = [torch.randint(0, vocab, (prompt_len,), generator=generator).tolist() for _ in range(num_requests)]
    run = EngineRun(model, engine, prompts, output_len, prompt_len + output_len)
    run()  # warm-up
    best: tuple[float, float, StepProfile] | None = None
    for _ in range(repeats):
        prof = StepProfile()
        undo = _instrument(run.llm, prof)
        try:
            cpu_start = time.thread_time()
            seconds, _ = run()
            cpu = time.thread_time() - cpu_start
        finally:
            undo()
        if best is None or cpu < best[1]:
            best = (seconds, cpu, prof)
    seconds, cpu, prof = best
    steps = prof.calls["forward"]
    for clock in (prof.seconds, prof.cpu):  # the plan runs inside forward: count it once, as block tables
        clock["forward"] -= clock["plan"]

    def part(category: str, label: str, part_seconds: float, part_cpu: float) -> dict:
        return {
            "category": category,
            "label": label,
            "seconds": part_seconds,
            "cpu_seconds": part_cpu,
            "share_pct": 100 * part_seconds / seconds,
            "cpu_share_pct": 100 * part_cpu / cpu,
        }

    parts = {
        name: part(category, label, prof.seconds[name], prof.cpu[name])
        for name, (category, label) in OVERHEAD_PARTS.items()
    }
    parts.update(
        {name: part("model", label, prof.seconds[name], prof.cpu[name]) for name, label in NESTED_PARTS.items()}
    )
    timed_wall = sum(prof.seconds[name] for name in OVERHEAD_PARTS)
    timed_cpu = sum(prof.cpu[name] for name in OVERHEAD_PARTS)
    parts["loop"] = part("scheduler", LOOP_LABEL, seconds - timed_wall, cpu - timed_cpu)
    goal = [p for p in parts.values() if p["category"] in GOAL_CATEGORIES]
    strict = [p for p in parts.values() if p["category"] in (*GOAL_CATEGORIES, "kernel plan")]
    not_model = [p for p in parts.values() if p["category"] not in ("model", "sampling")]
    report = {
        "engine": engine,
        "num_requests": num_requests,
        "prompt_len": prompt_len,
        "output_len": output_len,
        "run_seconds": seconds,
        "run_cpu_seconds": cpu,
        "steps": steps,
        "ms_per_step": 1000 * seconds / max(steps, 1),
        "cpu_ms_per_step": 1000 * cpu / max(steps, 1),
        "overhead_share_pct": sum(p["share_pct"] for p in goal),
        "overhead_cpu_share_pct": sum(p["cpu_share_pct"] for p in goal),
        "with_plan_share_pct": sum(p["share_pct"] for p in strict),
        "with_plan_cpu_share_pct": sum(p["cpu_share_pct"] for p in strict),
        "all_but_model_share_pct": sum(p["share_pct"] for p in not_model),
        "all_but_model_cpu_share_pct": sum(p["cpu_share_pct"] for p in not_model),
        "parts": parts,
    }
    if cprofile:  # a separate run: cProfile slows Python code far more than torch ops
        profiler = cProfile.Profile()
        profiler.enable()
        run()
        profiler.disable()
        report["cprofile"] = profiler
    return report


# ---------------------------------------------------------------------------------------------- report


def _agree(a: list[list[int]] | None, b: list[list[int]] | None) -> str:
    if a is None or b is None:
        return "-"
    same = sum(x == y for x, y in zip(a, b, strict=True))
    return f"{same}/{len(a)}"


def _round_ratio(ours: list[float], base: list[float]) -> float:
    """Median over rounds of one round's throughput ratio (base time / our time): the two runs of a round are
    next to each other in time, so load that drifts over the minutes cancels out of it."""
    return statistics.median(b / o for o, b in zip(ours, base, strict=True))


def _throughput_row(row: str, comparison: str, ours: Timing, base: Timing, goal: str, check) -> dict:
    ratio = _round_ratio(ours.seconds, base.seconds)
    cpu_ratio = _round_ratio(ours.cpu_seconds, base.cpu_seconds)
    return {
        "row": row,
        "comparison": comparison,
        "goal": goal,
        "ours_tps": ours.best_tps,
        "baseline_tps": base.best_tps,
        "ours_median_tps": ours.median_tps,
        "baseline_median_tps": base.median_tps,
        "ours_cpu_tps": ours.cpu_tps,
        "baseline_cpu_tps": base.cpu_tps,
        "ratio": ratio,
        "cpu_ratio": cpu_ratio,
        "best_ratio": ours.best_tps / base.best_tps,
        "met": check(ratio),
        "met_cpu": check(cpu_ratio),
        "tokens_match": _agree(ours.outputs, base.outputs),
    }


def build_rows(
    main: dict[str, Timing], cb_pair: dict[str, Timing] | None, cb_error: str | None, overhead: dict
) -> list[dict]:
    paged, static, contiguous = main["paged"], main["hf_static"], main["contiguous"]
    rows = [
        _throughput_row("a", "paged engine vs generate() static cache", paged, static, ">= 1.0x", lambda r: r >= 1.0)
    ]
    if cb_pair is not None:
        ours, cb = cb_pair["paged"], cb_pair["generate_batch"]
        row = _throughput_row(
            "b", "paged engine vs generate_batch() (whole call, warmed up)", ours, cb, ">= 5x", lambda r: r >= 5.0
        )
        span_tps = cb.tokens_per_run / min(cb.extra["spans"])
        row.update(baseline_span_tps=span_tps, ratio_span=ours.best_tps / span_tps)
        rows.append(row)
    else:
        rows.append(
            {
                "row": "b",
                "comparison": "paged engine vs generate_batch()",
                "skipped": cb_error,
                "goal": ">= 5x",
                "met": None,
                "met_cpu": None,
            }
        )
    rows.append(
        _throughput_row(
            "c",
            "paged vs contiguous engine (equal batch, both fit)",
            paged,
            contiguous,
            "within 5%",
            lambda r: abs(r - 1.0) <= 0.05,
        )
    )
    rows.append(
        {
            "row": "d",
            "comparison": f"scheduler + block-table share of step time ({overhead['num_requests']} running)",
            "goal": "< 10%",
            "share_pct": overhead["overhead_share_pct"],
            "cpu_share_pct": overhead["overhead_cpu_share_pct"],
            "met": overhead["overhead_share_pct"] < 10.0,
            "met_cpu": overhead["overhead_cpu_share_pct"] < 10.0,
            "ms_per_step": overhead["ms_per_step"],
            "cpu_ms_per_step": overhead["cpu_ms_per_step"],
            "with_plan_share_pct": overhead["with_plan_share_pct"],
            "with_plan_cpu_share_pct": overhead["with_plan_cpu_share_pct"],
            "all_but_model_share_pct": overhead["all_but_model_share_pct"],
            "all_but_model_cpu_share_pct": overhead["all_but_model_cpu_share_pct"],
        }
    )
    return rows


def _yes(value: bool | None) -> str:
    return {True: "[green]yes[/]", False: "[red]no[/]", None: "skipped"}[value]


def print_report(rows: list[dict], overheads: list[dict], meta: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    table = Table(
        title=f"kvbench engine benchmark — {meta['model']} on {meta['device']}, {meta['threads']} thread(s), "
        f"batch {meta['batch']}, prompt {meta['prompt_len']}, output {meta['output_len']}, "
        f"best of {meta['repeats']}"
    )
    columns = (
        "",
        "comparison",
        "ours tok/s",
        "baseline tok/s",
        "ratio (wall; best-of)",
        "ratio (cpu)",
        "goal",
        "met wall/cpu",
        "tokens equal",
    )
    for column in columns:
        table.add_column(column, justify="left" if column in ("", "comparison", "goal") else "right")
    for row in rows:
        met = f"{_yes(row['met'])}/{_yes(row['met_cpu'])}" if row["met"] is not None else "skipped"
        if row["row"] == "d":
            table.add_row(
                "d",
                row["comparison"],
                "",
                "",
                f"{row['share_pct']:.1f}%",
                f"{row['cpu_share_pct']:.1f}%",
                row["goal"],
                met,
                "",
            )
            table.add_row(
                "",
                "  + the torch attention plans the runner makes (prefill)",
                "",
                "",
                f"{row['with_plan_share_pct']:.1f}%",
                f"{row['with_plan_cpu_share_pct']:.1f}%",
                "",
                "",
                "",
            )
            table.add_row(
                "",
                "  all but model + sampling (incl. kvbench's accounting)",
                "",
                "",
                f"{row['all_but_model_share_pct']:.1f}%",
                f"{row['all_but_model_cpu_share_pct']:.1f}%",
                "",
                "",
                "",
            )
        elif "skipped" in row:
            table.add_row(row["row"], row["comparison"], "", "", "", "", row["goal"], met, row["skipped"][:60])
        else:
            ratio = f"{row['ratio']:.2f}x ({row['best_ratio']:.2f}x)"
            if "ratio_span" in row:
                ratio += f"; its span only {row['ratio_span']:.1f}x"
            table.add_row(
                row["row"],
                row["comparison"],
                f"{row['ours_tps']:.0f} ({row['ours_median_tps']:.0f})",
                f"{row['baseline_tps']:.0f} ({row['baseline_median_tps']:.0f})",
                ratio,
                f"{row['cpu_ratio']:.2f}x",
                row["goal"],
                met,
                row["tokens_match"],
            )
    console.print(table)
    console.print(
        "tok/s: best (median) wall-clock over the interleaved repeats, output tokens incl. prefill time; "
        "ratio: median over rounds of each round's ratio (two runs next to each other in time), the "
        "best-of ratio in brackets; cpu: the same on process CPU time; generate_batch is paired with "
        "paged runs of its own"
    )
    for overhead in overheads:
        detail = Table(
            title=f"where a step's time goes — {overhead['engine']} engine, {overhead['num_requests']} "
            f"running, prompt {overhead['prompt_len']}, output {overhead['output_len']}, "
            f"{overhead['steps']} steps, {overhead['ms_per_step']:.2f} ms/step wall, "
            f"{overhead['cpu_ms_per_step']:.2f} ms/step CPU"
        )
        for column in ("part", "category", "wall ms/step", "wall share", "cpu ms/step", "cpu share"):
            detail.add_column(column, justify="left" if column in ("part", "category") else "right")
        steps = overhead["steps"]
        for part in overhead["parts"].values():
            detail.add_row(
                part["label"],
                part["category"],
                f"{1000 * part['seconds'] / steps:.3f}",
                f"{part['share_pct']:.1f}%",
                f"{1000 * part['cpu_seconds'] / steps:.3f}",
                f"{part['cpu_share_pct']:.1f}%",
            )
        detail.add_row(
            "[bold]scheduler + block tables (the goal)[/]",
            "",
            "",
            f"[bold]{overhead['overhead_share_pct']:.1f}%[/]",
            "",
            f"[bold]{overhead['overhead_cpu_share_pct']:.1f}%[/]",
        )
        detail.add_row(
            "the goal + the runner's torch attention plans (prefill)",
            "",
            "",
            f"{overhead['with_plan_share_pct']:.1f}%",
            "",
            f"{overhead['with_plan_cpu_share_pct']:.1f}%",
        )
        detail.add_row(
            "all but model and sampling (+ kvbench's accounting)",
            "",
            "",
            f"{overhead['all_but_model_share_pct']:.1f}%",
            "",
            f"{overhead['all_but_model_cpu_share_pct']:.1f}%",
        )
        console.print(detail)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats, shorter overhead run")
    parser.add_argument("--out", default=None, help="write the results as JSON here")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--running", type=int, default=50, help="requests in flight for the overhead profile")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats (default 10, --quick 3)")
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: what load_model chose)")
    parser.add_argument("--skip-generate-batch", action="store_true")
    parser.add_argument("--profile", action="store_true", help="also print a cProfile of the overhead run")
    args = parser.parse_args()
    repeats = args.repeats or (3 if args.quick else 10)

    loaded = load_model("tiny", device="cpu", seed=args.seed)  # one thread for tiny models on CPU (load_model)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    model, shape = loaded.model, loaded.shape
    generator = torch.Generator().manual_seed(args.seed + 1)
    prompts = [
        torch.randint(0, shape.vocab_size, (args.prompt,), generator=generator).tolist() for _ in range(args.batch)
    ]
    max_len = args.prompt + args.output
    tokens = args.batch * args.output
    meta = {
        "model": shape.name,
        "device": "cpu",
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "batch": args.batch,
        "prompt_len": args.prompt,
        "output_len": args.output,
        "block_size": BLOCK_SIZE,
        "seed": args.seed,
        "torch": torch.__version__,
    }
    import transformers

    meta["transformers"] = transformers.__version__

    contenders = {
        "paged": EngineRun(model, "paged", prompts, args.output, max_len),
        "contiguous": EngineRun(model, "contiguous", prompts, args.output, max_len),
        "hf_static": static_generate_runner(model, prompts, args.output),
    }
    main_timings = measure(contenders, tokens, repeats, warmup=set(contenders))

    cb_pair, cb_error = None, None
    if args.skip_generate_batch:
        cb_error = "--skip-generate-batch"
    elif not hasattr(model, "generate_batch"):
        cb_error = f"transformers {transformers.__version__} has no generate_batch"
    else:
        try:
            cb_run = GenerateBatchRun(model, prompts, args.output)
            pair = {"paged": contenders["paged"], "generate_batch": cb_run}
            cb_pair = measure(pair, tokens, max(2, min(repeats, 4)), warmup=set(pair))
            cb_pair["generate_batch"].extra["spans"] = cb_run.spans[1:]  # the warm-up call left out
        except Exception as err:  # noqa: BLE001 - report why the row is skipped, keep the others
            cb_error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"

    overhead_output = 32 if args.quick else args.output
    overheads = [
        profile_overhead(
            model,
            engine,
            args.running,
            args.prompt,
            overhead_output,
            args.seed,
            shape.vocab_size,
            repeats=2 if args.quick else 5,
            cprofile=args.profile and engine == "paged",
        )
        for engine in ("paged", "contiguous")
    ]
    rows = build_rows(main_timings, cb_pair, cb_error, overheads[0])
    print_report(rows, overheads, meta)
    for overhead in overheads:
        profiler = overhead.pop("cprofile", None)
        if profiler is not None:
            print(f"\ncProfile of a separate {overhead['engine']} overhead run (top 25 by own time):")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    if args.out:
        runs = {
            name: {
                "seconds": t.seconds,
                "cpu_seconds": t.cpu_seconds,
                "best_tps": t.best_tps,
                "median_tps": t.median_tps,
                "cpu_tps": t.cpu_tps,
            }
            for name, t in main_timings.items()
        }
        if cb_pair is not None:
            cb = cb_pair["generate_batch"]
            runs["generate_batch"] = {
                "wall_seconds": cb.seconds,
                "span_seconds": cb.extra["spans"],
                "cpu_seconds": cb.cpu_seconds,
                "best_tps": cb.best_tps,
                "median_tps": cb.median_tps,
                "cpu_tps": cb.cpu_tps,
                "paired_paged_best_tps": cb_pair["paged"].best_tps,
            }
        write_json_atomic(args.out, {"meta": meta, "rows": rows, "runs": runs, "overhead": overheads})
        print(f"results written to {args.out}")


if __name__ == "__main__":
    main()
