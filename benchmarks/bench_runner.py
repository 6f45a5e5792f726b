"""Micro benchmark: the model runner's decode throughput vs ``transformers`` ``generate()`` with a static cache.

Same random weights, prompts and device, measured side by side in one run (best of ``--repeats``). Decode time
is the time of the 2nd..Nth output token of the whole batch: for the runner the decode steps, for
``generate()`` the full call minus a one-token call (its prefill).

    python benchmarks/bench_runner.py --batch 16 --prompt 64 --output 64
"""

from __future__ import annotations

import argparse
import time

import torch

from kvbench.engine.sampling import SamplingParams
from kvbench.models.hf_model import build_random_model, resolve_torch_device, resolve_torch_dtype
from kvbench.models.resolve import resolve_model
from kvbench.models.runner import ModelRunner
from kvbench.models.sampler import sample


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def run_runner(runner: ModelRunner, prompts: list[list[int]], output_len: int) -> tuple[float, float, list[list[int]]]:
    """Prefill all prompts in one step, decode in batched steps; (prefill s, decode s, tokens)."""
    bs = runner.block_size
    per_request = -(-(len(prompts[0]) + output_len) // bs)
    tables = [list(range(i * per_request, (i + 1) * per_request)) for i in range(len(prompts))]
    greedy = [SamplingParams()] * len(prompts)
    no_generators = [None] * len(prompts)
    start = time.perf_counter()
    logits = runner.forward(runner.build_step([(p, 0, t) for p, t in zip(prompts, tables, strict=True)]))
    outputs = [[token] for token in sample(logits, greedy, no_generators)]
    _sync(runner.device)
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(output_len - 1):
        chunks = [([o[-1]], len(p) + len(o) - 1, t) for p, o, t in zip(prompts, outputs, tables, strict=True)]
        tokens = sample(runner.forward(runner.build_step(chunks)), greedy, no_generators)
        for out, token in zip(outputs, tokens, strict=True):
            out.append(token)
    _sync(runner.device)
    return prefill, time.perf_counter() - start, outputs


def run_generate(model, input_ids: torch.Tensor, new_tokens: int) -> tuple[float, torch.Tensor]:
    """One ``generate()`` call with a static cache, greedy, no EOS stop; (seconds, new tokens)."""
    mask = torch.ones_like(input_ids)
    _sync(input_ids.device)
    start = time.perf_counter()
    out = model.generate(
        input_ids,
        attention_mask=mask,
        do_sample=False,
        max_new_tokens=new_tokens,
        min_new_tokens=new_tokens,
        cache_implementation="static",
        eos_token_id=None,
        pad_token_id=0,
    )
    _sync(input_ids.device)
    return time.perf_counter() - start, out[:, input_ids.shape[1] :]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=64)
    parser.add_argument("--output", type=int, default=64)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    device = resolve_torch_device(args.device)
    dtype = resolve_torch_dtype(args.dtype, device)
    shape = resolve_model(args.model)
    model = build_random_model(shape, seed=0, device=device, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    input_ids = torch.randint(0, shape.vocab_size, (args.batch, args.prompt), generator=gen).to(device)
    prompts = input_ids.tolist()
    per_request = -(-(args.prompt + args.output) // args.block_size)
    runner = ModelRunner(model, num_blocks=args.batch * per_request, block_size=args.block_size)

    run_runner(runner, prompts, 4)  # warm-up
    run_generate(model, input_ids, 4)
    best = {
        "runner_prefill": float("inf"),
        "runner_decode": float("inf"),
        "hf_total": float("inf"),
        "hf_prefill": float("inf"),
    }
    for _ in range(args.repeats):
        prefill, decode, ours = run_runner(runner, prompts, args.output)
        hf_total, theirs = run_generate(model, input_ids, args.output)
        hf_prefill, _ = run_generate(model, input_ids, 1)
        for key, value in zip(best, (prefill, decode, hf_total, hf_prefill), strict=True):
            best[key] = min(best[key], value)

    decode_tokens = args.batch * (args.output - 1)
    total_tokens = args.batch * args.output
    ours_decode_tps = decode_tokens / best["runner_decode"]
    hf_decode = max(best["hf_total"] - best["hf_prefill"], 1e-9)
    hf_decode_tps = decode_tokens / hf_decode
    ours_total_tps = total_tokens / (best["runner_prefill"] + best["runner_decode"])
    hf_total_tps = total_tokens / best["hf_total"]
    same = ours == theirs.tolist()
    print(
        f"model {shape.name} on {device} ({dtype}), torch threads {torch.get_num_threads()}, batch {args.batch},"
        f" prompt {args.prompt}, output {args.output}, block size {args.block_size}, best of {args.repeats}"
    )
    print(f"{'':26}{'runner':>12}{'generate(static)':>18}{'ratio':>8}")
    print(f"{'decode tokens/s':26}{ours_decode_tps:12.0f}{hf_decode_tps:18.0f}{ours_decode_tps / hf_decode_tps:8.2f}")
    print(f"{'end-to-end tokens/s':26}{ours_total_tps:12.0f}{hf_total_tps:18.0f}{ours_total_tps / hf_total_tps:8.2f}")
    print(
        f"{'decode ms/step':26}{1e3 * best['runner_decode'] / (args.output - 1):12.2f}"
        f"{1e3 * hf_decode / (args.output - 1):18.2f}"
    )
    print(f"{'prefill ms':26}{1e3 * best['runner_prefill']:12.1f}{1e3 * best['hf_prefill']:18.1f}")
    print(f"greedy tokens identical: {same}")


if __name__ == "__main__":
    main()
