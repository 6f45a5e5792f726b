"""One-shot GPU check of the KV kernels (run by ``benchmarks/gpu_check.sh`` on a CUDA machine).

1. Triton vs torch reference on CUDA in fp32, fp16 and bf16: decode (plain, split-KV forced and automatic),
   prefill, write_kv and copy_blocks over block sizes 1/8/16/32, GQA ratios 1/4/8 and ragged contexts.
2. The decode benchmark on Llama-2-13B's attention shape (its heads, batch 1/8/64, context 512/2048/4096,
   fp16) with the measured copy bandwidth, and the two goals at batch 64, context 2048: paged decode at
   >= 70% of copy bandwidth, and at most 1.15x the time of contiguous decode.
3. A small tile sweep (BLOCK_N x num_warps) at the goal point and at a split-KV point, to guide tuning.

Prints tables and writes ``gpu_check.json`` into ``--out``. Meant to finish in well under 5 minutes.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import os
import sys
import time
import traceback
from pathlib import Path

SMOKE = "--smoke" in sys.argv  # a quick CPU run of this script's logic under the Triton interpreter
if SMOKE:
    os.environ["TRITON_INTERPRET"] = "1"  # before triton_ops is imported

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "kernels"))  # kv_cases: the test suite's case builder

import torch  # noqa: E402
from kv_cases import make_case, query_start_loc, rel_error  # noqa: E402

from kvbench.kernels import reference, triton_ops  # noqa: E402
from kvbench.studies.kernel_bench import (  # noqa: E402
    HEAD_SHAPES,
    DecodeShape,
    build_inputs,
    copy_bandwidth_gbps,
    run_decode_point,
    time_ms,
)

DEVICE = torch.device("cpu" if SMOKE else "cuda")
TOLERANCE = {torch.float32: 1e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}
# dtype -> (block sizes, GQA ratios) checked: the full grid in fp16, spot checks elsewhere (each combination
# of dtype, block-size class (1 / 8 / multiple of 16), group and split is one more kernel compile).
GRID = (
    {torch.float32: ((1, 16), (1, 4))}
    if SMOKE
    else {
        torch.float16: ((1, 8, 16, 32), (1, 4, 8)),
        torch.bfloat16: ((16,), (1, 8)),
        torch.float32: ((16,), (1, 4)),
    }
)
HEAD_DIM = 16 if SMOKE else 128
LENS = [1, 17, 70] if SMOKE else [1, 15, 16, 17, 300, 1000]
Q_LENS = [1, 5, 20] if SMOKE else [1, 15, 5, 17, 33, 200]
BENCH_MODEL = "tiny" if SMOKE else "llama-2-13b"
BATCHES, CONTEXTS, GOAL = ((1, 2), (64,), (2, 64)) if SMOKE else ((1, 8, 64), (512, 2048, 4096), (64, 2048))
SPLIT_POINT = (1, 512) if SMOKE else (1, 4096)
REPS = 2 if SMOKE else 20
# (BLOCK_N, num_warps, num_stages); None = Triton's default stages
SWEEP = (
    [(32, 4, None)]
    if SMOKE
    else [
        (32, 4, None),
        (64, 2, None),
        (64, 4, None),
        (64, 8, None),
        (128, 4, None),
        (128, 8, None),
        (64, 4, 2),
        (64, 4, 4),
    ]
)


def check_correctness() -> list[dict]:
    rows = []
    for dtype, (block_sizes, groups) in GRID.items():
        tolerance = TOLERANCE[dtype]
        for block_size in block_sizes:
            for group in groups:
                case = make_case(
                    LENS, block_size, 2, HEAD_DIM, seed=block_size * 31 + group, dtype=dtype, device=DEVICE
                )
                gen = torch.Generator().manual_seed(group)
                query = torch.randn(len(LENS), 2 * group, HEAD_DIM, generator=gen).to(DEVICE, dtype)
                args = (case.k_cache, case.v_cache, case.block_tables, case.context_lens, HEAD_DIM**-0.5)
                expected = reference.paged_decode_attention(query, *args)
                for splits in (1, 3, None):
                    out = torch.full_like(query, float("nan"))
                    triton_ops.paged_decode_attention(query, *args, out=out, num_splits=splits)
                    rows.append(_row("decode", dtype, block_size, group, splits, rel_error(out, expected), tolerance))
                chunk = torch.randn(sum(Q_LENS), 2 * group, HEAD_DIM, generator=gen).to(DEVICE, dtype)
                starts = query_start_loc(Q_LENS, DEVICE)
                pre_args = (case.k_cache, case.v_cache, case.block_tables, starts, case.context_lens, HEAD_DIM**-0.5)
                expected = reference.paged_prefill_attention(chunk, *pre_args)
                out = torch.full_like(chunk, float("nan"))
                triton_ops.paged_prefill_attention(chunk, *pre_args, out=out)
                rows.append(_row("prefill", dtype, block_size, group, None, rel_error(out, expected), tolerance))
        rows.append(_row("write_kv", dtype, 16, 1, None, _write_kv_error(dtype), 0.0))
        rows.append(_row("copy_blocks", dtype, 16, 1, None, _copy_blocks_error(dtype), 0.0))
    return rows


def _row(op: str, dtype: torch.dtype, block_size: int, group: int, splits, error: float, tolerance: float) -> dict:
    return {
        "op": op, "dtype": str(dtype).removeprefix("torch."), "block_size": block_size, "group": group,
        "splits": "auto" if splits is None else splits, "rel_error": error, "ok": error <= tolerance,
    }  # fmt: skip


def _write_kv_error(dtype: torch.dtype) -> float:
    k_cache = torch.randn(64, 16, 8, HEAD_DIM, device=DEVICE).to(dtype)
    v_cache = torch.randn_like(k_cache)
    slots = torch.randperm(64 * 16, device=DEVICE)[:300]
    slots[::7] = -1
    key = torch.randn(300, 8, HEAD_DIM, device=DEVICE).to(dtype)
    value = torch.randn_like(key)
    expected_k, expected_v = k_cache.clone(), v_cache.clone()
    reference.write_kv(key, value, expected_k, expected_v, slots)
    triton_ops.write_kv(key, value, k_cache, v_cache, slots)
    return 0.0 if torch.equal(k_cache, expected_k) and torch.equal(v_cache, expected_v) else 1.0


def _copy_blocks_error(dtype: torch.dtype) -> float:
    k_caches = [torch.randn(128, 16, 8, HEAD_DIM, device=DEVICE).to(dtype) for _ in range(4)]
    v_caches = [torch.randn(128, 16, 8, HEAD_DIM, device=DEVICE).to(dtype) for _ in range(4)]
    expected_k, expected_v = [c.clone() for c in k_caches], [c.clone() for c in v_caches]
    perm = torch.randperm(128, device=DEVICE)
    src, dst = perm[:40], perm[40:80]
    reference.copy_blocks(expected_k, expected_v, src, dst)
    triton_ops.copy_blocks(k_caches, v_caches, src, dst)
    same = all(torch.equal(a, b) for a, b in zip(k_caches + v_caches, expected_k + expected_v, strict=True))
    return 0.0 if same else 1.0


def benchmark(copy_gbps: float) -> list[dict]:
    """The benchmark grid (fp16, block 16), then the goal point in bf16 and with blocks of 8 and 32."""
    heads, kv_heads, head_dim = HEAD_SHAPES[BENCH_MODEL]
    cases = [(torch.float16, 16, b, c) for b in BATCHES for c in CONTEXTS]
    cases += [(torch.bfloat16, 16, *GOAL), (torch.float16, 32, *GOAL), (torch.float16, 8, *GOAL)]
    points = []
    for dtype, block_size, batch, context in cases:
        dtype = torch.float32 if SMOKE else dtype  # the interpreter has no bf16
        shape = DecodeShape(batch, context, heads, kv_heads, head_dim, block_size)
        point = run_decode_point(shape, dtype, DEVICE, "triton", warmup=2, reps=REPS, copy_gbps=copy_gbps)
        points.append({"dtype": str(dtype).removeprefix("torch."), "block_size": block_size, **point.to_json()})
    return points


def tile_sweep(copy_gbps: float) -> list[dict]:
    """Decode time per (BLOCK_N, num_warps, num_stages) at the goal point (no split) and a split-KV point."""
    heads, kv_heads, head_dim = HEAD_SHAPES[BENCH_MODEL]
    dtype = torch.float32 if SMOKE else torch.float16
    rows = []
    for (batch, context), splits in ((GOAL, 1), (SPLIT_POINT, None)):
        shape = DecodeShape(batch, context, heads, kv_heads, head_dim, 16)
        inputs = build_inputs(shape, dtype, DEVICE)
        args = (inputs.query, inputs.k_cache, inputs.v_cache, inputs.block_tables, inputs.context_lens, head_dim**-0.5)
        out = torch.empty_like(inputs.query)
        moved = shape.bytes_moved(inputs.query.element_size())
        for block_n, num_warps, num_stages in SWEEP:
            run = functools.partial(
                triton_ops.paged_decode_attention, *args, out=out, num_splits=splits, max_context_len=context,
                block_n=block_n, num_warps=num_warps, num_stages=num_stages,
            )  # fmt: skip
            row = {"batch": batch, "context": context, "block_n": block_n, "num_warps": num_warps,
                   "num_stages": num_stages}  # fmt: skip
            try:
                ms = time_ms(run, DEVICE, warmup=2, reps=max(REPS // 2, 1))
            except Exception as err:  # a config that does not compile or fit: note it, go on
                rows.append({**row, "error": repr(err)[:100]})
                continue
            gbps = moved / (ms * 1e-3) / 1e9
            rows.append({**row, "ms": ms, "gbps": gbps, "pct_of_copy": 100 * gbps / copy_gbps})
            print(f"  sweep {rows[-1]}", flush=True)  # partial progress survives a timeout
        del inputs
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def _print_table(title: str, rows: list[dict]) -> None:
    print(f"\n== {title}")
    if not rows:
        return
    keys = list(dict.fromkeys(k for row in rows for k in row))
    cells = [[_cell(row.get(k)) for k in keys] for row in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    print("  ".join(k.rjust(w) for k, w in zip(keys, widths, strict=True)))
    for c in cells:
        print("  ".join(v.rjust(w) for v, w in zip(c, widths, strict=True)))


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if (value != 0 and (abs(value) < 0.01 or abs(value) >= 1e5)) else f"{value:.3f}"
    return "-" if value is None else str(value)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=Path("/tmp/kvbench-gpu-check"))
    parser.add_argument("--skip-sweep", action="store_true")
    parser.add_argument("--smoke", action="store_true", help="tiny CPU run under the Triton interpreter")
    opts = parser.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    if not SMOKE and not torch.cuda.is_available():
        print("no CUDA device: nothing to check (--smoke runs the logic on CPU)")
        return 2
    import triton

    report: dict = {"device": "cpu (smoke)" if SMOKE else torch.cuda.get_device_name(), "torch": torch.__version__,
                    "triton": triton.__version__}  # fmt: skip
    if not SMOKE:
        report["multiprocessors"] = torch.cuda.get_device_properties(DEVICE).multi_processor_count
    print(json.dumps(report))
    failed = False
    sections = [("correctness", check_correctness), ("copy_bandwidth_gbps", lambda: copy_bandwidth_gbps(DEVICE))]
    for name, step in sections:
        started = time.perf_counter()
        try:
            report[name] = step()
        except Exception:
            traceback.print_exc()
            report[name] = "error"
            failed = True
        print(f"[{name}: {time.perf_counter() - started:.1f}s]", flush=True)
    if isinstance(report["correctness"], list):
        _print_table("Triton vs torch reference (rel_error = max |diff| / max |ref|)", report["correctness"])
        bad = [row for row in report["correctness"] if not row["ok"]]
        print(f"correctness: {len(report['correctness']) - len(bad)} ok, {len(bad)} failed")
        failed |= bool(bad)
    copy_gbps = report["copy_bandwidth_gbps"] if isinstance(report["copy_bandwidth_gbps"], float) else math.nan
    print(f"device copy bandwidth (read + write): {copy_gbps:.0f} GB/s")
    steps = [("benchmark", lambda: benchmark(copy_gbps))]
    if not opts.skip_sweep:
        steps.append(("tile_sweep", lambda: tile_sweep(copy_gbps)))
    for name, step in steps:
        started = time.perf_counter()
        try:
            report[name] = step()
            _print_table(name, report[name])
        except Exception:
            traceback.print_exc()
            report[name] = "error"
            failed = True
        print(f"[{name}: {time.perf_counter() - started:.1f}s]", flush=True)
        (opts.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    if isinstance(report.get("benchmark"), list):
        goal = next(
            (p for p in report["benchmark"] if (p["batch"], p["context"], p["block_size"]) == (*GOAL, 16)), None
        )
        if goal and goal["status"] == "ok":
            print(f"\ngoal point (batch {GOAL[0]}, context {GOAL[1]}, {goal['dtype']}): "
                  f"{goal['pct_of_copy_bandwidth']:.1f}% of copy bandwidth (goal >= 70), "
                  f"paged/contiguous {goal['paged_over_contiguous']:.3f} (goal <= 1.15)")  # fmt: skip
    (opts.out / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
