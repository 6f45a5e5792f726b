"""End-to-end engine benchmark: the paged engine vs ``transformers`` and vs the contiguous baseline, in one run.

Same model (the ``tiny`` preset, random weights from ``--seed``), same prompts, same CPU, side by side:

  a. paged engine vs ``generate()`` with a static cache (batched, greedy, no EOS)        goal >= 1.0x
  b. paged engine vs ``generate_batch()`` (transformers continuous batching, paged cache)  goal >= 5x
  c. paged vs contiguous engine at equal batch, both fit                                 goal within 5 %
  d. scheduler + block-table overhead as a share of step time at 50 running requests     goal < 10 %

Throughput is output tokens over the wall time of the whole call (prefill included), best of ``--repeats``
runs after one warm-up, the contenders interleaved (order alternating); the median is shown too. Each run's
process CPU time is measured as well: on a shared, loaded machine wall times swing by +-50 % while CPU times
stay put, so every ratio is also given on CPU time (``cpu``). For ``generate_batch`` the wall ratio uses its
generation span (first request created -> last token), which leaves out its manager start/stop: the
conservative choice; its full wall-clock ratio is printed next to it. Greedy tokens are cross-checked.
The overhead profile (d) times each per-step part of the engine loop in wall and thread-CPU time.

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

import kvbench.engine.llm_engine as llm_engine_module
from kvbench import kernels
from kvbench.engine.build import load_model
from kvbench.engine.llm_engine import EngineConfig, LLMEngine, make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.fileio import write_json_atomic

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
        config = EngineConfig(engine=engine, block_size=BLOCK_SIZE, num_blocks=len(prompts) * per_request + 1,
                              max_len=max_len, reserve="max", max_num_seqs=max(256, len(prompts)))
        self.engine = engine
        self.llm = LLMEngine(model, config)
        self.prompts = prompts
        self.params = SamplingParams(max_tokens=output_len, ignore_eos=True)

    def __call__(self) -> tuple[float, list[list[int]]]:
        requests = [make_request(i, p, self.params) for i, p in enumerate(self.prompts)]
        start = time.perf_counter()
        result = self.llm.run(requests, concurrency=len(requests))
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
            out = model.generate(input_ids, attention_mask=mask, do_sample=False, max_new_tokens=output_len,
                                 min_new_tokens=output_len, cache_implementation="static", pad_token_id=0)
        return time.perf_counter() - start, out[:, input_ids.shape[1]:].tolist()

    return run


class GenerateBatchRun:
    """``generate_batch()``: transformers' continuous batching with its own paged cache, sized for the workload.

    The cache is sized explicitly: left to itself on CPU it sizes from host memory and spent ~50 s before its
    first token here. Page size 64 was the fastest of 16/64/128/256 on this workload. Calling it returns the
    generation span (first request created -> last token) and the outputs; wall times go to ``walls``.
    """

    PAGE_SIZE = 64

    def __init__(self, model, prompts: list[list[int]], output_len: int) -> None:
        from transformers import GenerationConfig
        from transformers.generation.configuration_utils import ContinuousBatchingConfig

        logging.getLogger("ContinuousBatchingLogger").setLevel(logging.CRITICAL)  # psutil notices on CPU
        pages = len(prompts) * -(-(len(prompts[0]) + output_len) // self.PAGE_SIZE) + len(prompts)
        self.cb_config = ContinuousBatchingConfig(page_size=self.PAGE_SIZE, num_blocks=pages, max_batch_tokens=1024,
                                                  max_requests_per_batch=len(prompts), use_cuda_graph=False)
        self.gen_config = GenerationConfig(max_new_tokens=output_len, do_sample=False, eos_token_id=-1,
                                           pad_token_id=0)
        self.model = model
        self.prompts = prompts
        self.walls: list[float] = []

    def __call__(self) -> tuple[float, list[list[int]]]:
        start = time.perf_counter()
        results = self.model.generate_batch(self.prompts, generation_config=self.gen_config,
                                            continuous_batching_config=self.cb_config, warmup=False,
                                            record_timestamps=True)
        self.walls.append(time.perf_counter() - start)
        if len(results) != len(self.prompts):
            raise RuntimeError(f"generate_batch returned {len(results)} of {len(self.prompts)} requests")
        ordered = [results[f"req_{i}"] for i in range(len(self.prompts))]
        span = max(o.timestamps[-1] for o in ordered) - min(o.created_time for o in ordered)
        return span, [list(o.generated_tokens) for o in ordered]


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
OVERHEAD_PARTS = {
    "admit": ("scheduler", "scheduler.admit (FCFS admission + allocation)"),
    "prepare_decode": ("scheduler", "_prepare_decode (room for the next token, preemption, CoW)"),
    "record": ("scheduler", "_record (per-step accounting snapshot)"),
    "build_step": ("block tables", "runner.build_step / build_decode_step (pack ids, positions, slots, tables)"),
    "sample": ("sampling", "sample (argmax over the batch)"),
    "forward": ("model", "runner.forward (the model)"),
}
NESTED_PARTS = {
    "forward:attention": "  of which paged attention kernels (torch reference)",
    "forward:write_kv": "  of which write_kv",
}
LOOP_LABEL = "engine loop: chunk lists + block_table, _emit per request (finish, free, top-up)"


def _instrument(llm: LLMEngine, prof: StepProfile) -> Callable[[], None]:
    """Install timing wrappers on ``llm`` (and the module functions it calls); returns the undo."""
    saved = {
        "sample": llm_engine_module.sample,
        "decode": kernels.paged_decode_attention,
        "prefill": kernels.paged_prefill_attention,
        "write_kv": kernels.write_kv,
    }
    new_scheduler = llm._new_scheduler

    def instrumented_scheduler():
        scheduler = new_scheduler()
        scheduler.admit = prof.wrap("admit", scheduler.admit)
        return scheduler

    llm._new_scheduler = instrumented_scheduler
    llm._prepare_decode = prof.wrap("prepare_decode", llm._prepare_decode)
    llm._record = prof.wrap("record", llm._record)
    llm.runner.build_step = prof.wrap("build_step", llm.runner.build_step)
    llm.runner.build_decode_step = prof.wrap("build_step", llm.runner.build_decode_step)
    llm.runner.forward = prof.wrap("forward", llm.runner.forward)
    llm_engine_module.sample = prof.wrap("sample", saved["sample"])
    kernels.paged_decode_attention = prof.wrap("forward:attention", saved["decode"])
    kernels.paged_prefill_attention = prof.wrap("forward:attention", saved["prefill"])
    kernels.write_kv = prof.wrap("forward:write_kv", saved["write_kv"])

    def undo() -> None:
        llm_engine_module.sample = saved["sample"]
        kernels.paged_decode_attention = saved["decode"]
        kernels.paged_prefill_attention = saved["prefill"]
        kernels.write_kv = saved["write_kv"]
        for name in ("_new_scheduler", "_prepare_decode", "_record"):
            vars(llm).pop(name, None)
        for name in ("build_step", "build_decode_step", "forward"):
            vars(llm.runner).pop(name, None)

    return undo


def profile_overhead(model, engine: str, num_requests: int, prompt_len: int, output_len: int, seed: int,
                     vocab: int, repeats: int, cprofile: bool = False) -> dict:
    """Run ``num_requests`` at once with each step's parts timed; the run with least CPU time is kept.

    Everything that is neither the model forward nor sampling is scheduler + block-table overhead.
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

    def part(category: str, label: str, part_seconds: float, part_cpu: float) -> dict:
        return {"category": category, "label": label, "seconds": part_seconds, "cpu_seconds": part_cpu,
                "share_pct": 100 * part_seconds / seconds, "cpu_share_pct": 100 * part_cpu / cpu}

    parts = {name: part(category, label, prof.seconds[name], prof.cpu[name])
             for name, (category, label) in OVERHEAD_PARTS.items()}
    parts.update({name: part("model", label, prof.seconds[name], prof.cpu[name]) for name, label in NESTED_PARTS.items()})
    timed_wall = sum(prof.seconds[name] for name in OVERHEAD_PARTS)
    timed_cpu = sum(prof.cpu[name] for name in OVERHEAD_PARTS)
    parts["loop"] = part("scheduler", LOOP_LABEL, seconds - timed_wall, cpu - timed_cpu)
    not_overhead = ("forward", "sample")
    overhead_wall = seconds - sum(prof.seconds[name] for name in not_overhead)
    overhead_cpu = cpu - sum(prof.cpu[name] for name in not_overhead)
    report = {
        "engine": engine, "num_requests": num_requests, "prompt_len": prompt_len, "output_len": output_len,
        "run_seconds": seconds, "run_cpu_seconds": cpu, "steps": steps,
        "ms_per_step": 1000 * seconds / max(steps, 1), "cpu_ms_per_step": 1000 * cpu / max(steps, 1),
        "overhead_share_pct": 100 * overhead_wall / seconds, "overhead_cpu_share_pct": 100 * overhead_cpu / cpu,
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


def _throughput_row(row: str, comparison: str, ours: Timing, base: Timing, goal: str, check) -> dict:
    ratio, cpu_ratio = ours.best_tps / base.best_tps, ours.cpu_tps / base.cpu_tps
    return {
        "row": row, "comparison": comparison, "goal": goal,
        "ours_tps": ours.best_tps, "baseline_tps": base.best_tps,
        "ours_median_tps": ours.median_tps, "baseline_median_tps": base.median_tps,
        "ours_cpu_tps": ours.cpu_tps, "baseline_cpu_tps": base.cpu_tps,
        "ratio": ratio, "cpu_ratio": cpu_ratio, "met": check(ratio), "met_cpu": check(cpu_ratio),
        "tokens_match": _agree(ours.outputs, base.outputs),
    }


def build_rows(main: dict[str, Timing], cb: Timing | None, cb_error: str | None, overhead: dict) -> list[dict]:
    paged, static, contiguous = main["paged"], main["hf_static"], main["contiguous"]
    rows = [_throughput_row("a", "paged engine vs generate() static cache", paged, static, ">= 1.0x",
                            lambda r: r >= 1.0)]
    if cb is not None:
        row = _throughput_row("b", "paged engine vs generate_batch() (its span)", paged, cb, ">= 5x",
                              lambda r: r >= 5.0)
        wall_tps = cb.tokens_per_run / min(cb.extra["walls"])
        row.update(baseline_wall_tps=wall_tps, ratio_wall=paged.best_tps / wall_tps)
        rows.append(row)
    else:
        rows.append({"row": "b", "comparison": "paged engine vs generate_batch()", "skipped": cb_error,
                     "goal": ">= 5x", "met": None, "met_cpu": None})
    rows.append(_throughput_row("c", "paged vs contiguous engine (equal batch, both fit)", paged, contiguous,
                                "within 5%", lambda r: abs(r - 1.0) <= 0.05))
    rows.append({
        "row": "d", "comparison": f"scheduler + block-table share of step time ({overhead['num_requests']} running)",
        "goal": "< 10%", "share_pct": overhead["overhead_share_pct"], "cpu_share_pct": overhead["overhead_cpu_share_pct"],
        "met": overhead["overhead_share_pct"] < 10.0, "met_cpu": overhead["overhead_cpu_share_pct"] < 10.0,
        "ms_per_step": overhead["ms_per_step"], "cpu_ms_per_step": overhead["cpu_ms_per_step"],
    })
    return rows


def _yes(value: bool | None) -> str:
    return {True: "[green]yes[/]", False: "[red]no[/]", None: "skipped"}[value]


def print_report(rows: list[dict], overheads: list[dict], meta: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console(width=160)
    table = Table(title=f"kvbench engine benchmark — {meta['model']} on {meta['device']}, {meta['threads']} thread(s), "
                        f"batch {meta['batch']}, prompt {meta['prompt_len']}, output {meta['output_len']}, "
                        f"best of {meta['repeats']}")
    columns = ("", "comparison", "ours tok/s", "baseline tok/s", "ratio (wall)", "ratio (cpu)", "goal",
               "met wall/cpu", "tokens equal")
    for column in columns:
        table.add_column(column, justify="left" if column in ("", "comparison", "goal") else "right")
    for row in rows:
        met = f"{_yes(row['met'])}/{_yes(row['met_cpu'])}" if row["met"] is not None else "skipped"
        if row["row"] == "d":
            table.add_row("d", row["comparison"], "", "", f"{row['share_pct']:.1f}%", f"{row['cpu_share_pct']:.1f}%",
                          row["goal"], met, "")
        elif "skipped" in row:
            table.add_row(row["row"], row["comparison"], "", "", "", "", row["goal"], met, row["skipped"][:60])
        else:
            ratio = f"{row['ratio']:.2f}x"
            if "ratio_wall" in row:
                ratio += f" (full call {row['ratio_wall']:.1f}x)"
            table.add_row(row["row"], row["comparison"], f"{row['ours_tps']:.0f} ({row['ours_median_tps']:.0f})",
                          f"{row['baseline_tps']:.0f} ({row['baseline_median_tps']:.0f})", ratio,
                          f"{row['cpu_ratio']:.2f}x", row["goal"], met, row["tokens_match"])
    console.print(table)
    console.print("tok/s: best (median) wall-clock over the interleaved repeats, output tokens incl. prefill time; "
                  "ratio (cpu): best process CPU time (steadier on a loaded machine; for generate_batch the whole "
                  "call, manager start/stop included)")
    for overhead in overheads:
        detail = Table(title=f"where a step's time goes — {overhead['engine']} engine, {overhead['num_requests']} "
                             f"running, prompt {overhead['prompt_len']}, output {overhead['output_len']}, "
                             f"{overhead['steps']} steps, {overhead['ms_per_step']:.2f} ms/step wall, "
                             f"{overhead['cpu_ms_per_step']:.2f} ms/step CPU")
        for column in ("part", "category", "wall ms/step", "wall share", "cpu ms/step", "cpu share"):
            detail.add_column(column, justify="left" if column in ("part", "category") else "right")
        steps = overhead["steps"]
        for part in overhead["parts"].values():
            detail.add_row(part["label"], part["category"], f"{1000 * part['seconds'] / steps:.3f}",
                           f"{part['share_pct']:.1f}%", f"{1000 * part['cpu_seconds'] / steps:.3f}",
                           f"{part['cpu_share_pct']:.1f}%")
        detail.add_row("[bold]scheduler + block tables (all but forward and sample)[/]", "", "",
                       f"[bold]{overhead['overhead_share_pct']:.1f}%[/]", "",
                       f"[bold]{overhead['overhead_cpu_share_pct']:.1f}%[/]")
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
    prompts = [torch.randint(0, shape.vocab_size, (args.prompt,), generator=generator).tolist()
               for _ in range(args.batch)]
    max_len = args.prompt + args.output
    tokens = args.batch * args.output
    meta = {
        "model": shape.name, "device": "cpu", "threads": torch.get_num_threads(), "repeats": repeats,
        "batch": args.batch, "prompt_len": args.prompt, "output_len": args.output, "block_size": BLOCK_SIZE,
        "seed": args.seed, "torch": torch.__version__,
    }
    import transformers

    meta["transformers"] = transformers.__version__

    contenders = {
        "paged": EngineRun(model, "paged", prompts, args.output, max_len),
        "contiguous": EngineRun(model, "contiguous", prompts, args.output, max_len),
        "hf_static": static_generate_runner(model, prompts, args.output),
    }
    main_timings = measure(contenders, tokens, repeats, warmup=set(contenders))

    cb_timing, cb_error = None, None
    if args.skip_generate_batch:
        cb_error = "--skip-generate-batch"
    elif not hasattr(model, "generate_batch"):
        cb_error = f"transformers {transformers.__version__} has no generate_batch"
    else:
        try:
            cb_run = GenerateBatchRun(model, prompts, args.output)
            cb_timing = measure({"generate_batch": cb_run}, tokens, max(1, min(repeats, 2)), warmup=set())[
                "generate_batch"]
            cb_timing.extra["walls"] = cb_run.walls
        except Exception as err:  # noqa: BLE001 - report why the row is skipped, keep the others
            cb_error = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"

    overhead_output = 32 if args.quick else args.output
    overheads = [
        profile_overhead(model, engine, args.running, args.prompt, overhead_output, args.seed, shape.vocab_size,
                         repeats=2 if args.quick else 5, cprofile=args.profile and engine == "paged")
        for engine in ("paged", "contiguous")
    ]
    rows = build_rows(main_timings, cb_timing, cb_error, overheads[0])
    print_report(rows, overheads, meta)
    for overhead in overheads:
        profiler = overhead.pop("cprofile", None)
        if profiler is not None:
            print(f"\ncProfile of a separate {overhead['engine']} overhead run (top 25 by own time):")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
    if args.out:
        runs = {name: {"seconds": t.seconds, "cpu_seconds": t.cpu_seconds, "best_tps": t.best_tps,
                       "median_tps": t.median_tps, "cpu_tps": t.cpu_tps} for name, t in main_timings.items()}
        if cb_timing is not None:
            runs["generate_batch"] = {"span_seconds": cb_timing.seconds, "wall_seconds": cb_timing.extra["walls"],
                                      "cpu_seconds": cb_timing.cpu_seconds, "best_tps": cb_timing.best_tps,
                                      "median_tps": cb_timing.median_tps, "cpu_tps": cb_timing.cpu_tps}
        write_json_atomic(args.out, {"meta": meta, "rows": rows, "runs": runs, "overhead": overheads})
        print(f"results written to {args.out}")


if __name__ == "__main__":
    main()
