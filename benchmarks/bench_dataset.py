"""Dataset loading speed: read, tokenize, filter and draw 10,000 ShareGPT records.

    python benchmarks/bench_dataset.py [--records 10000] [--model PATH_TO_GGUF_OR_CHECKPOINT_DIR]

The records are built from kvbench's shipped sample (each prompt with two answers joined, about the size of a
ShareGPT first exchange) and written to a temporary ShareGPT file. Timed side by side: word counts (no
tokenizer) and, with --model, the model's tokenizer through its chat template; the tokenizer's own loading
is timed apart. Goal: under 10 s for 10,000 records on 2 CPU cores.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from kvbench.workload.dataset import TokenCounter, builtin_datasets, read_dataset, sample_dataset


def write_records(path: Path, count: int, seed: int = 0) -> None:
    sample = read_dataset(builtin_datasets()["real-chat"]).records
    answers = [r.answer for r in sample if r.answer]
    rng = np.random.default_rng(seed)
    items = []
    for index in range(count):
        prompt = sample[index % len(sample)].prompt
        first, second = rng.choice(len(answers), 2)
        items.append(
            {
                "id": f"bench-{index}",
                "conversations": [
                    {"from": "human", "value": f"{prompt} (request {index})"},
                    {"from": "gpt", "value": f"{answers[first]}\n\n{answers[second]}"},
                ],
            }
        )
    path.write_text(json.dumps(items))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--model", default=None, help="a GGUF file or checkpoint directory whose tokenizer counts")
    parser.add_argument("--max-len", type=int, default=2048)
    args = parser.parse_args()
    table = Table(title=f"Loading and tokenizing {args.records:,} ShareGPT records (max-len {args.max_len})")
    for column in (
        "counted by",
        "tokenizer load s",
        "read + count + filter + draw s",
        "records / s",
        "mean prompt / answer tokens",
        "goal < 10 s",
    ):
        table.add_column(column, justify="right")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "sharegpt.json"
        write_records(path, args.records)
        counters = [("words (no tokenizer)", None, 0.0)]
        if args.model:
            from kvbench.models.tokenizers import load_tokenizer

            start = time.perf_counter()
            tokenizer = load_tokenizer(args.model)
            counters.append((f"tokenizer of {Path(args.model).name}", tokenizer, time.perf_counter() - start))
        for label, tokenizer, load_s in counters:
            start = time.perf_counter()
            sample = sample_dataset(path, TokenCounter(tokenizer, args.model), args.max_len, args.records, seed=0)
            wall = time.perf_counter() - start
            prompts = np.mean([r.prompt_len for r in sample.requests])
            answers = np.mean([r.output_len for r in sample.requests])
            table.add_row(
                label,
                f"{load_s:.2f}",
                f"{wall:.2f}",
                f"{args.records / wall:,.0f}",
                f"{prompts:.0f} / {answers:.0f}",
                "yes" if wall < 10 else "NO",
            )
    Console(width=140).print(table)


if __name__ == "__main__":
    main()
