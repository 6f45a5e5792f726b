"""Describe a dataset before running it: the lengths of its prompts and answers, and what they would waste.

The analytic estimates are taken at each request's final length (prompt + answer), as ``capacity`` does:
a slab of max-len (the article's ``(max_len - actual) / max_len``, averaged over the requests), of the next
power of two, or blocks of a paged cache. They bound what a run can show; ``kvbench waste --dataset`` and
``kvbench sweep --dataset`` measure it under load.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from kvbench.kv.block_pool import blocks_for
from kvbench.kv.contiguous import next_pow2
from kvbench.results.dataset_result import (
    AnalyticWaste,
    DatasetMeta,
    DatasetResult,
    LengthStats,
    WasteEstimate,
)
from kvbench.results.length_histogram import LengthHistogram
from kvbench.results.run_meta import run_meta
from kvbench.workload.dataset import TokenCounter, sample_dataset

HISTOGRAM_BINS = 12


@dataclass(frozen=True)
class DatasetSettings:
    path: str
    model: str = "tiny"  # whose tokenizer counts the tokens (presets: words and punctuation)
    max_len: int = 2048
    requests: int | None = None  # None: every usable record
    seed: int = 0
    block_sizes: tuple[int, ...] = (16,)


def length_stats(values: np.ndarray) -> LengthStats:
    return LengthStats(
        count=int(values.size),
        mean=float(values.mean()),
        p50=float(np.percentile(values, 50)),
        p90=float(np.percentile(values, 90)),
        p99=float(np.percentile(values, 99)),
        min=int(values.min()),
        max=int(values.max()),
    )


def histogram(values: np.ndarray, top: int) -> LengthHistogram:
    edges = np.linspace(0, max(top, 1), HISTOGRAM_BINS + 1)
    counts, _ = np.histogram(np.clip(values, 0, top), bins=edges)
    return LengthHistogram([float(e) for e in edges], [int(c) for c in counts])


def waste_estimates(totals: np.ndarray, max_len: int, block_sizes: tuple[int, ...]) -> list[WasteEstimate]:
    """Share of what each strategy holds at a request's end that is never written, over all requests."""
    written = float(totals.sum())
    held = {
        "contiguous-max": float(max_len) * totals.size,
        "contiguous-pow2": float(sum(min(next_pow2(int(t)), max_len) for t in totals)),
    }
    for block_size in block_sizes:
        held[f"paged-{block_size}"] = float(sum(blocks_for(int(t), block_size) * block_size for t in totals))
    return [WasteEstimate(name, slots, written, 100.0 * (1 - written / slots)) for name, slots in held.items()]


def describe_dataset(settings: DatasetSettings, tokenizer: Any | None) -> DatasetResult:
    """The summary document (``kind: dataset``) of the requests a run of this dataset would draw."""
    sample = sample_dataset(
        settings.path,
        TokenCounter(tokenizer, settings.model),
        settings.max_len,
        settings.requests,
        settings.seed,
        need_output=True,
    )
    prompts = np.array([r.prompt_len for r in sample.requests])
    outputs = np.array([r.output_len for r in sample.requests])
    totals = prompts + outputs
    top = int(totals.max())
    mean_total = float(totals.mean())
    meta = DatasetMeta.from_json(
        run_meta(
            scenario="dataset",
            dataset=sample.as_dict(),
            model=settings.model,
            max_len=settings.max_len,
            seed=settings.seed,
            note=sample.note(),
        )
    )
    analytic = AnalyticWaste(
        "(max_len - actual_len) / max_len", mean_total, 100.0 * (settings.max_len - mean_total) / settings.max_len
    )
    lengths = {"prompt": length_stats(prompts), "output": length_stats(outputs), "total": length_stats(totals)}
    histograms = {
        "prompt": histogram(prompts, int(prompts.max())),
        "output": histogram(outputs, int(outputs.max())),
        "total": histogram(totals, max(top, settings.max_len)),
    }
    points = waste_estimates(totals, settings.max_len, settings.block_sizes)
    return DatasetResult(meta, lengths, histograms, analytic, points)
