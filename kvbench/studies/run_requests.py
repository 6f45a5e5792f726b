"""What a run serves: its requests (drawn from the scenario, a dataset, a trace or a requests file, resolved once
by :func:`resolve_requests` for every study) and how each request ends.

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.engine.request import Request, make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.errors import KvbenchError
from kvbench.models.tokenizers import has_tokenizer, load_tokenizer
from kvbench.workload.admissible import Skipped, within_max_len
from kvbench.workload.arrivals import recorded_arrivals
from kvbench.workload.dataset import DatasetSample, TokenCounter, sample_dataset
from kvbench.workload.lengths import TokenRange, sized_pairs
from kvbench.workload.request_trace import trace_lengths
from kvbench.workload.requests_file import load_requests_jsonl
from kvbench.workload.scenario import Scenario

STOP_MODES = ("eos", "length")


def default_stop(model: str, simulate: bool) -> str:
    """``eos`` when a real model with a tokenizer decides where answers end, else ``length``."""
    return "eos" if not simulate and has_tokenizer(model) else "length"


def stop_reason_text(stop: str, model: str, simulate: bool, chosen: bool) -> str:
    """Why this stop mode, in words (the run's intro and summary say it)."""
    if stop == "eos":
        if simulate:
            return (
                "eos: each answer ends at its reference length (simulated: no model) while reservations plan "
                "for max_tokens = max-len - prompt"
            )
        return "eos: each answer ends where the model emits EOS, or at max_tokens = max-len - prompt" + (
            "" if chosen else " (default for a model with real weights and a tokenizer)"
        )
    why = (
        ""
        if chosen
        else (
            " (default: simulated)" if simulate else f" (default: {model} has no tokenizer and real weights to decide)"
        )
    )
    return "length: every request runs to its drawn or reference output length, EOS ignored" + why


def server_stop_text(stop: str) -> str:
    """The stop mode as a server over HTTP is asked for it (its model, not kvbench's, decides EOS)."""
    if stop == "eos":
        return "eos: each answer ends where the served model stops it, or at max_tokens = max-len - prompt"
    return (
        "length: each request asks for its drawn output length (max_tokens, with ignore_eos where the server takes it)"
    )


def check_stop(stop: str, reserve: str) -> None:
    if stop not in STOP_MODES:
        raise KvbenchError(f"unknown stop mode {stop!r}; choose eos or length")
    if stop == "eos" and reserve == "oracle":
        raise KvbenchError(
            "the oracle reservation needs each answer's real length before it is written, which no "
            "engine has when answers end at EOS: reserve max or pow2 (the oracle is reported as a "
            "hindsight bound)"
        )


@dataclass
class Workload:
    """The prompts and reference lengths of a run, and how its requests end."""

    pairs: list[tuple[int, int]]  # (prompt length, reference output length)
    prompt_ids: list[list[int]] | None  # real prompts (dataset with a tokenizer, requests file); None: random ids
    stop: str
    max_len: int
    dataset: DatasetSample | None = None
    skipped: Skipped | None = None  # records of a file left out (longer than max-len)
    arrival_times: list[float] | None = None  # recorded in the file, from 0; None: none recorded
    source: Path | None = None  # the file the requests come from (a requests file, a trace or a dataset)

    def check_vocabulary(self, vocab_size: int) -> None:
        """Refuse a prompt token id the model does not have (a requests file's or a tokenized dataset's)."""
        if self.prompt_ids is not None and any(token >= vocab_size for ids in self.prompt_ids for token in ids):
            raise KvbenchError(f"{self.source}: a prompt token id is outside the model's vocabulary of {vocab_size}")

    def first(self, count: int) -> Workload:
        """The first ``count`` requests (of a file, in its order)."""
        return replace(
            self,
            pairs=self.pairs[:count],
            prompt_ids=self.prompt_ids[:count] if self.prompt_ids is not None else None,
            arrival_times=self.arrival_times[:count] if self.arrival_times is not None else None,
        )

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


def sized_workload(workload: Workload, prompt: TokenRange | None, output: TokenRange | None, seed: int) -> Workload:
    """The drawn requests with their prompt and answer lengths as asked (seeded, random token ids), like
    ``vllm bench serve``'s random dataset; prompt and answer together must fit max-len."""
    if workload.prompt_ids is not None or workload.dataset is not None or workload.source is not None:
        raise KvbenchError("prompt and answer lengths size drawn requests, not a file's or a dataset's: choose one")
    pairs = sized_pairs(workload.pairs, prompt, output, seed + 2)
    longest = max(p + o for p, o in pairs)
    if longest > workload.max_len:
        raise KvbenchError(
            f"a prompt and its answer reach {longest:,} tokens, past the max-len of {workload.max_len:,}: "
            "shorten them or raise max-len to the server's context"
        )
    return replace(workload, pairs=pairs)


def token_requests(pairs: Sequence[tuple[int, int]], vocab_size: int, seed: int) -> list[Request]:
    """Greedy, EOS-ignoring requests with seeded random prompt tokens: the same list for every engine."""
    prompts = random_prompts(pairs, vocab_size, seed)
    return [
        make_request(index, prompt, SamplingParams(max_tokens=output_len, ignore_eos=True))
        for index, (prompt, (_, output_len)) in enumerate(zip(prompts, pairs, strict=True))
    ]


def random_prompts(pairs: Sequence[tuple[int, int]], vocab_size: int, seed: int) -> list[list[int]]:
    """Seeded random prompt token ids of the pairs' prompt lengths (the same stream as ``token_requests``)."""
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab_size, prompt_len).tolist() for prompt_len, _ in pairs]


def dataset_workload(
    path: Path, tokenizer: Any | None, max_len: int, count: int, seed: int, stop: str, model: str | None = None
) -> Workload:
    """``count`` requests drawn from a dataset; with ``eos`` on a real model the answers' lengths are not needed."""
    counter = TokenCounter(tokenizer, model)
    sample = sample_dataset(path, counter, max_len, count, seed, need_output=stop == "length" or tokenizer is None)
    pairs = [
        (r.prompt_len, r.output_len if r.output_len is not None else max_len - r.prompt_len) for r in sample.requests
    ]
    ids = None
    if tokenizer is not None:  # a tokenizer encodes every prompt
        ids = [r.prompt_token_ids for r in sample.requests if r.prompt_token_ids is not None]
        assert len(ids) == len(pairs)
    return Workload(pairs, ids, stop, max_len, sample, source=sample.path)


@dataclass(frozen=True)
class RequestChoice:
    """Where a run's requests come from, as asked: at most one file; else the dataset asked for, else the
    scenario's dataset, else lengths drawn from the scenario."""

    requests_file: Path | None = None  # exact prompt token ids and output lengths (and arrival times)
    trace: Path | None = None  # lengths (and arrival times)
    dataset: str | None = None  # a dataset file or a shipped name

    @property
    def file(self) -> Path | None:
        return self.requests_file or self.trace

    def dataset_of(self, spec: Scenario) -> str | Path | None:
        """The dataset the prompts come from: the one asked for, else the scenario's when no file is given."""
        return self.dataset or (spec.dataset_path() if spec.dataset and self.file is None else None)


def resolve_requests(
    choice: RequestChoice,
    spec: Scenario,
    model: str,
    count: int,
    seed: int,
    stop: str,
    status: Callable[[str], Any] | None = None,
    arrivals: bool = False,
) -> tuple[Workload, Any]:
    """The run's requests, and the tokenizer loaded to count a dataset (None otherwise), handed on to the model
    loader. ``count`` is how many to draw from the scenario or the dataset; a file gives all its records that
    fit max-len, in its order, with the arrival times it records when ``arrivals`` (an open loop) asks."""
    max_len = spec.lengths.max_len
    if choice.requests_file is not None and choice.trace is not None:
        raise KvbenchError("a requests file and a trace both give the requests: choose one")
    dataset = choice.dataset_of(spec)
    if dataset is not None and choice.file is not None:
        what = "requests file" if choice.requests_file is not None else "trace"
        raise KvbenchError(f"a dataset and a {what} both give the requests: choose one")
    if choice.requests_file is not None:  # exact prompts (token ids) and output lengths
        replay = load_requests_jsonl(choice.requests_file)
        kept, skipped = within_max_len(
            [(len(ids), out) for ids, out in replay], max_len, f"records of {choice.requests_file}"
        )
        times = recorded_arrivals(choice.requests_file) if arrivals else None
        return Workload(
            [(len(replay[i][0]), replay[i][1]) for i in kept],
            [replay[i][0] for i in kept],
            stop,
            max_len,
            None,
            skipped,
            [times[i] for i in kept] if times is not None else None,
            choice.requests_file,
        ), None
    if choice.trace is not None:  # lengths only
        lengths, recorded = trace_lengths(choice.trace)
        kept, skipped = within_max_len(lengths, max_len, f"records of {choice.trace}")
        times = recorded if arrivals else None
        return Workload(
            [lengths[i] for i in kept],
            None,
            stop,
            max_len,
            None,
            skipped,
            [times[i] for i in kept] if times is not None else None,
            choice.trace,
        ), None
    if dataset is None:
        return Workload(spec.lengths.sample(count, seed), None, stop, max_len), None
    if status is not None:
        status(f"reading the tokenizer of {model}...")
    tokenizer = load_tokenizer(model)
    if status is not None:
        status(f"reading dataset {dataset}...")
    return dataset_workload(Path(dataset), tokenizer, max_len, count, seed, stop, model), tokenizer
