"""Latency statistics in the names vLLM's benchmark (``vllm bench serve``) writes: ``mean_ttft_ms``,
``median_ttft_ms``, ``std_ttft_ms``, ``p99_ttft_ms`` ...

They are computed as it computes them, so a kvbench row and a vLLM row line up column by column: percentiles
interpolate linearly between the closest ranks (numpy's default), and the standard deviation is the population
one (numpy's ``std``). TPOT excludes the first token; ITL is every gap between two tokens of a request.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

LATENCY_KINDS = ("ttft", "tpot", "itl", "e2el")
LATENCY_STATS = ("mean", "median", "std", "p50", "p90", "p99")
PERCENTILES = {"median": 50.0, "p50": 50.0, "p90": 90.0, "p99": 99.0}


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-th percentile (0-100) of ``values`` each repeated ``weights`` times (integer-like counts), linearly
    interpolated between the closest ranks: ``np.percentile(np.repeat(values, weights), q)`` without the copy."""
    order = np.argsort(values, kind="stable")
    values, weights = values[order], weights[order]
    cumulative = np.cumsum(weights)
    count = cumulative[-1]
    position = q / 100.0 * (count - 1)  # 0-based rank, as numpy's "linear" method places it
    low = math.floor(position)
    high = min(low + 1, count - 1)
    low_value = values[min(int(np.searchsorted(cumulative, low, side="right")), len(values) - 1)]
    high_value = values[min(int(np.searchsorted(cumulative, high, side="right")), len(values) - 1)]
    return float(low_value + (position - low) * (high_value - low_value))


def summarise(
    name: str, values_s: Sequence[float] | np.ndarray, weights: Iterable[float] | None = None
) -> dict[str, float | None]:
    """:data:`LATENCY_STATS` of ``values_s`` (seconds) as ``{stat}_{name}_ms``; None where there is no value.

    ``weights`` counts how many times each value occurred (the simulator's spans of equal gaps)."""
    values = np.asarray(values_s, dtype=float)
    keys = {stat: f"{stat}_{name}_ms" for stat in LATENCY_STATS}
    w = (
        np.ones_like(values)
        if weights is None
        else np.asarray(list(weights) if not isinstance(weights, np.ndarray) else weights, dtype=float)
    )
    values, w = values[w > 0], w[w > 0]  # a value that occurred no time is no sample
    if values.size == 0:
        return dict.fromkeys(keys.values())
    mean = float(np.average(values, weights=w))
    stats = {"mean": mean, "std": math.sqrt(float(np.average((values - mean) ** 2, weights=w)))}
    stats.update({stat: weighted_percentile(values, w, q) for stat, q in PERCENTILES.items()})
    return {key: 1000.0 * stats[stat] for stat, key in keys.items()}


def request_latencies(requests: Iterable) -> dict[str, list[float]]:
    """Per-request TTFT, TPOT and E2E latency in seconds. TPOT excludes the first token."""
    ttft, tpot, e2el = [], [], []
    for request in requests:
        if request.first_token_time is None or request.finish_time is None:
            continue
        first = request.first_token_time - request.arrival_time
        total = request.finish_time - request.arrival_time
        ttft.append(first)
        e2el.append(total)
        if request.num_outputs > 1:
            tpot.append((total - first) / (request.num_outputs - 1))
    return {"ttft": ttft, "tpot": tpot, "e2el": e2el}


def latency_fields(requests: Iterable, itl_values_s: np.ndarray, itl_weights: np.ndarray | None) -> dict:
    per_request = request_latencies(requests)
    fields: dict = {}
    for kind in LATENCY_KINDS:
        if kind == "itl":
            fields.update(summarise("itl", itl_values_s, itl_weights))
        else:
            fields.update(summarise(kind, per_request[kind]))
    return fields
