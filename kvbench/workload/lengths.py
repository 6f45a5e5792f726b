"""Request lengths: seeded distributions of total length, split into prompt and output, or a trace file."""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from kvbench import json_input
from kvbench.errors import KvbenchError
from kvbench.workload.jsonl import json_objects, read_text

DISTRIBUTIONS = ("fixed", "uniform", "exponential", "lognormal")


MAX_SIGMA = 10.0  # a lognormal spread of e**10 already puts nearly every length at 1 or max-len


@dataclass(frozen=True)
class LengthSpec:
    """Total lengths (prompt + output) with the given mean, clipped to [2, max_len], split by prompt_ratio."""

    mean_len: int = 500
    max_len: int = 2048
    distribution: str = "lognormal"
    prompt_ratio: float = 0.5
    sigma: float = 0.6  # lognormal shape; uniform spans mean*(1 +- sigma)

    def __post_init__(self) -> None:
        if self.distribution not in DISTRIBUTIONS:
            raise KvbenchError(
                f"unknown length distribution {self.distribution!r}; choose one of {', '.join(DISTRIBUTIONS)}"
            )
        if self.max_len < 2:
            raise KvbenchError(f"max-len must be at least 2, got {self.max_len}")
        if not 2 <= self.mean_len <= self.max_len:
            raise KvbenchError(f"mean length must be between 2 and max-len ({self.max_len}), got {self.mean_len}")
        if not 0.0 < self.prompt_ratio < 1.0:
            raise KvbenchError(f"prompt ratio must be between 0 and 1 (exclusive), got {self.prompt_ratio}")
        if not 0 <= self.sigma <= MAX_SIGMA:  # NaN fails too
            raise KvbenchError(f"sigma must be between 0 and {MAX_SIGMA:g}, got {self.sigma}")

    def sample(self, count: int, seed: int) -> list[tuple[int, int]]:
        """``count`` (prompt_len, output_len) pairs, each at least 1, summing to at most max_len."""
        if count < 1:
            raise KvbenchError(f"number of requests must be at least 1, got {count}")
        rng = np.random.default_rng(seed)
        mean = float(self.mean_len)
        if self.distribution == "fixed":
            totals = np.full(count, mean)
        elif self.distribution == "uniform":
            totals = rng.uniform(mean * (1 - self.sigma), mean * (1 + self.sigma), count)
        elif self.distribution == "exponential":
            totals = rng.exponential(mean, count)
        else:
            mu = np.log(mean) - self.sigma**2 / 2  # so that the unclipped mean is `mean`
            totals = rng.lognormal(mu, self.sigma, count)
        totals = np.clip(np.rint(totals), 2, self.max_len).astype(int)
        prompts = np.clip(np.rint(totals * self.prompt_ratio), 1, totals - 1).astype(int)
        return [(int(p), int(t - p)) for p, t in zip(prompts, totals, strict=True)]


@dataclass(frozen=True)
class TokenRange:
    """A length fixed (``N``) or drawn uniformly from ``LO:HI`` inclusive, as ``vllm bench serve``'s random
    dataset sizes its prompts and answers."""

    low: int
    high: int

    @classmethod
    def parse(cls, text: str, what: str) -> TokenRange:
        low_text, sep, high_text = text.strip().partition(":")
        try:
            low = int(low_text)
            high = int(high_text) if sep else low
        except ValueError:
            raise KvbenchError(f"{what} {text!r}: give a token count N or a range LO:HI") from None
        if low < 1 or high < low:
            raise KvbenchError(f"{what} {text!r}: lengths are at least 1 token, LO no more than HI")
        return cls(low, high)

    def draw(self, rng: np.random.Generator, count: int) -> list[int]:
        return [int(v) for v in rng.integers(self.low, self.high + 1, count)]

    def __str__(self) -> str:
        return str(self.low) if self.low == self.high else f"{self.low}:{self.high}"


def sized_pairs(
    pairs: list[tuple[int, int]], prompt: TokenRange | None, output: TokenRange | None, seed: int
) -> list[tuple[int, int]]:
    """``pairs`` with their prompt and/or output lengths drawn from the given ranges (seeded), the rest kept."""
    rng = np.random.default_rng(seed)
    prompts = prompt.draw(rng, len(pairs)) if prompt is not None else [p for p, _ in pairs]
    outputs = output.draw(rng, len(pairs)) if output is not None else [o for _, o in pairs]
    return list(zip(prompts, outputs, strict=True))


def load_trace(path: str | Path) -> list[tuple[int, int]]:
    """Read (prompt_len, output_len) pairs from a CSV or JSONL trace.

    Columns/keys: ``prompt_len`` (or ``prompt_token_ids``, a list) and ``output_len`` (or ``max_tokens``).
    """
    trace = Path(path)
    if not trace.exists():
        raise KvbenchError(f"trace file not found: {trace}")
    if not trace.is_file():
        raise KvbenchError(f"trace file {trace} is not a regular file")
    text = read_text(trace, "trace file")
    if trace.suffix.lower() == ".csv":
        rows = list(csv.DictReader(text.splitlines()))
    else:
        rows = [row for _, row in json_objects(trace, text)]
    if not rows:
        raise KvbenchError(f"trace {trace} holds no requests")
    return [_trace_row(trace, number, row) for number, row in enumerate(rows, 1)]


def _trace_row(trace: Path, number: int, row: dict) -> tuple[int, int]:
    where = f"{trace}: request {number}"
    if "prompt_token_ids" in row and row["prompt_token_ids"] not in (None, ""):
        ids = row["prompt_token_ids"]
        if isinstance(ids, str):
            try:
                ids = json_input.loads(ids)
            except json.JSONDecodeError:
                raise KvbenchError(f"{where}: prompt_token_ids is not a list") from None
        if not isinstance(ids, list):
            raise KvbenchError(f"{where}: prompt_token_ids is not a list")
        prompt = len(ids)
    else:
        prompt = _positive_int(row.get("prompt_len"), f"{where}: prompt_len")
    output = _positive_int(row.get("output_len", row.get("max_tokens")), f"{where}: output_len")
    if prompt < 1:
        raise KvbenchError(f"{where}: empty prompt")
    return prompt, output


def _positive_int(value, what: str) -> int:
    if value is None or value == "":
        raise KvbenchError(f"{what} is missing")
    if isinstance(value, bool):  # JSON true is no length (Python would count it as 1)
        raise KvbenchError(f"{what} must be a positive integer, got {str(value).lower()}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise KvbenchError(f"{what} must be a positive integer, got {value!r}") from None
    if not math.isfinite(number) or number != int(number) or number < 1:
        raise KvbenchError(f"{what} must be a positive integer, got {value!r}")
    return int(number)
