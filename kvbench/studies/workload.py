"""What a run serves: its prompts (drawn lengths, a dataset, or a requests file) and how each request ends.

Two stop modes:

- ``length``: every request runs to an output length fixed in advance (drawn from a distribution, or a
  dataset's reference answer), ignoring EOS. Runs are exactly repeatable; any model will do.
- ``eos``: the answer ends when the model emits EOS (or a stop token), or at ``max_tokens`` =
  max-len - prompt, the most the context allows. Nobody knows the length in advance, so the contiguous
  baseline reserves for that worst case (``max``: prompt + max_tokens = max-len; ``pow2``: its next power of
  two), while paging grows with the answer. The simulator has no model: a request stops at its reference
  length (``eos_after``) while reservations still see only ``max_tokens``. ``oracle`` (a slab of exactly
  the real length) cannot run here; it is reported as a hindsight bound.

The default is ``eos`` for a model with real weights and a tokenizer, ``length`` otherwise.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.engine.request import Request, make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.errors import KvbenchError
from kvbench.models.tokenizers import has_tokenizer
from kvbench.workload.dataset import DatasetSample, TokenCounter, sample_dataset

STOP_MODES = ("eos", "length")


def default_stop(model: str, simulate: bool) -> str:
    """``eos`` when a real model with a tokenizer decides where answers end, else ``length``."""
    return "eos" if not simulate and has_tokenizer(model) else "length"


def stop_reason_text(stop: str, model: str, simulate: bool, chosen: bool) -> str:
    """Why this stop mode, in words (the run's intro and summary say it)."""
    if stop == "eos":
        if simulate:
            return ("eos: each answer ends at its reference length (simulated: no model) while reservations plan "
                    "for max_tokens = max-len - prompt")
        return ("eos: each answer ends where the model emits EOS, or at max_tokens = max-len - prompt"
                + ("" if chosen else " (default for a model with real weights and a tokenizer)"))
    why = "" if chosen else (" (default: simulated)" if simulate else
                             f" (default: {model} has no tokenizer and real weights to decide)")
    return "length: every request runs to its drawn or reference output length, EOS ignored" + why


def check_stop(stop: str, reserve: str) -> None:
    if stop not in STOP_MODES:
        raise KvbenchError(f"unknown stop mode {stop!r}; choose eos or length")
    if stop == "eos" and reserve == "oracle":
        raise KvbenchError("the oracle reservation needs each answer's real length before it is written, which no "
                           "engine has when answers end at EOS: reserve max or pow2 (the oracle is reported as a "
                           "hindsight bound)")


@dataclass
class Workload:
    """The prompts and reference lengths of a run, and how its requests end."""

    pairs: list[tuple[int, int]]  # (prompt length, reference output length)
    prompt_ids: list[list[int]] | None  # real prompts (dataset with a tokenizer, requests file); None: random ids
    stop: str
    max_len: int
    dataset: DatasetSample | None = None

    def requests(self, count: int, vocab_size: int, seed: int, lengths_only: bool) -> list[Request]:
        """The first ``count`` requests, fresh (every run mutates its requests); the same list for every engine.

        ``lengths_only``: no prompt token ids (the simulator), each request told where its answer ends.
        """
        pairs = self.pairs[:count]
        if lengths_only:
            if self.stop == "length":
                return [Request(i, p, o) for i, (p, o) in enumerate(pairs)]
            return [Request(i, p, self.max_len - p, eos_after=o) for i, (p, o) in enumerate(pairs)]
        ids = self.prompt_ids[:count] if self.prompt_ids is not None else random_prompts(pairs, vocab_size, seed)
        out = []
        for index, (prompt, (_, output)) in enumerate(zip(ids, pairs, strict=True)):
            if self.stop == "length":
                params = SamplingParams(max_tokens=output, ignore_eos=True)
            else:
                params = SamplingParams(max_tokens=self.max_len - len(prompt))
            out.append(make_request(index, prompt, params))
        return out


def token_requests(pairs: Sequence[tuple[int, int]], vocab_size: int, seed: int) -> list[Request]:
    """Greedy, EOS-ignoring requests with seeded random prompt tokens: the same list for every engine."""
    prompts = random_prompts(pairs, vocab_size, seed)
    return [make_request(index, prompt, SamplingParams(max_tokens=output_len, ignore_eos=True))
            for index, (prompt, (_, output_len)) in enumerate(zip(prompts, pairs, strict=True))]


def random_prompts(pairs: Sequence[tuple[int, int]], vocab_size: int, seed: int) -> list[list[int]]:
    """Seeded random prompt token ids of the pairs' prompt lengths (the same stream as ``token_requests``)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, prompt_len).tolist() for prompt_len, _ in pairs]


def dataset_workload(path: Path, tokenizer: Any | None, max_len: int, count: int, seed: int, stop: str,
                     model: str | None = None) -> Workload:
    """``count`` requests drawn from a dataset; with ``eos`` on a real model the answers' lengths are not needed."""
    counter = TokenCounter(tokenizer, model)
    sample = sample_dataset(path, counter, max_len, count, seed, need_output=stop == "length" or tokenizer is None)
    pairs = [(r.prompt_len, r.output_len if r.output_len is not None else max_len - r.prompt_len)
             for r in sample.requests]
    ids = [r.prompt_token_ids for r in sample.requests] if tokenizer is not None else None
    return Workload(pairs, ids, stop, max_len, sample)
