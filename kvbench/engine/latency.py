"""Latency statistics in the names vLLM's benchmark prints (``p99_ttft_ms`` ...)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

LATENCY_KINDS = ("ttft", "tpot", "itl", "e2el")
LATENCY_STATS = ("mean", "p50", "p90", "p99")


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float) -> float:
    """The q-th percentile (0-100) of values repeated by integer-like weights (lower interpolation)."""
    order = np.argsort(values, kind="stable")
    values, weights = values[order], weights[order]
    cumulative = np.cumsum(weights)
    target = q / 100.0 * cumulative[-1]
    index = int(np.searchsorted(cumulative, target, side="left"))
    return float(values[min(index, len(values) - 1)])


def summarise(name: str, values_s: Sequence[float] | np.ndarray, weights: Iterable[float] | None = None) -> dict[str, float | None]:
    """mean/p50/p90/p99 of ``values_s`` (seconds) as ``{stat}_{name}_ms``; None where there is no value."""
    values = np.asarray(values_s, dtype=float)
    keys = [f"{stat}_{name}_ms" for stat in ("mean", "p50", "p90", "p99")]
    if values.size == 0:
        return dict.fromkeys(keys, None)
    w = np.ones_like(values) if weights is None else np.asarray(list(weights) if not isinstance(weights, np.ndarray) else weights, dtype=float)
    mean = float(np.average(values, weights=w))
    stats = [mean] + [weighted_percentile(values, w, q) for q in (50, 90, 99)]
    return {key: 1000.0 * value for key, value in zip(keys, stats, strict=True)}


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
