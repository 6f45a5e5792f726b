"""Client-side metrics of a point, with ``vllm bench serve``'s names and definitions so the two line up.

Over the completed requests (a failed one counts only in ``failed``, by kind):

- ``duration``: seconds from the first request's release to the last one's end; ``request_throughput`` =
  completed / duration, ``output_throughput`` = output tokens / duration, ``total_token_throughput`` = (input +
  output tokens) / duration.
- TTFT: start to the first token event. E2EL: start to the last token event. TPOT: (E2EL - TTFT) / (output
  tokens - 1), for requests of 2 tokens or more. ITL: every gap between consecutive token events, pooled.
- For each: ``mean_``, ``median_``, ``std_`` (population, as numpy's default) and ``p<q>_`` (linear
  interpolation, numpy's default) in milliseconds.
- ``request_goodput``: completed requests per second that met every objective of the SLO (``ttft``, ``tpot``,
  ``e2el`` in ms; a request of one token has TPOT 0 here, as in vLLM).

Where a figure has no meaning (no completed request, no request of 2 tokens, input counts unknown), it is None,
never 0.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from kvbench.endpoint.record import RequestRecord
from kvbench.errors import KvbenchError

SLO_KEYS = ("ttft", "tpot", "e2el")
DEFAULT_PERCENTILES = (90.0, 99.0)


def parse_slo(text: str) -> dict[str, float]:
    """``ttft=500,tpot=50`` (milliseconds) as ``{"ttft": 500.0, "tpot": 50.0}``; a one-line error otherwise."""
    slo: dict[str, float] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep:
            key, sep, value = part.partition(":")  # vLLM's spelling, ttft:500
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise KvbenchError(
                f"SLO {text!r}: expected KEY=MILLISECONDS pairs with keys {', '.join(SLO_KEYS)}, e.g. ttft=500,tpot=50"
            )
        try:
            number = float(value)
        except ValueError:
            raise KvbenchError(f"SLO {key}={value!r}: not a number of milliseconds") from None
        if not math.isfinite(number) or number <= 0:
            raise KvbenchError(f"SLO {key}={value}: must be a positive number of milliseconds")
        if key in slo:
            raise KvbenchError(f"SLO {text!r} names {key} twice")
        slo[key] = number
    if not slo:
        raise KvbenchError(f"SLO {text!r} names no objective; e.g. ttft=500,tpot=50")
    return slo


def percentile_name(q: float) -> str:
    return f"p{int(q)}" if float(q).is_integer() else f"p{q:g}"


def _stats(name: str, values_s: Sequence[float], percentiles: Sequence[float]) -> dict[str, float | None]:
    if not values_s:
        out: dict[str, float | None] = {f"{stat}_{name}_ms": None for stat in ("mean", "median", "std")}
        out.update({f"{percentile_name(q)}_{name}_ms": None for q in percentiles})
        return out
    ms = np.asarray(values_s, dtype=float) * 1000.0
    out = {
        f"mean_{name}_ms": float(ms.mean()),
        f"median_{name}_ms": float(np.median(ms)),
        f"std_{name}_ms": float(ms.std()),
    }
    for q, value in zip(percentiles, np.percentile(ms, list(percentiles)), strict=True):
        out[f"{percentile_name(q)}_{name}_ms"] = float(value)
    return out


def client_metrics(
    records: Sequence[RequestRecord],
    duration_s: float,
    slo: Mapping[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
    stopped_kinds: frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """The point's client metrics (see the module docstring). Token counts must be filled in first.
    Requests whose error kind is in ``stopped_kinds`` were cut by the point's own time limit: counted as
    ``stopped``, not ``failed``."""
    if not (math.isfinite(duration_s) and duration_s > 0):
        raise ValueError(f"a point's duration must be positive, got {duration_s}")
    done = [r for r in records if r.ok]
    stopped = [r for r in records if not r.ok and r.error_kind in stopped_kinds]
    failed = [r for r in records if not r.ok and r.error_kind not in stopped_kinds]
    if any(r.output_tokens is None for r in done):
        raise ValueError("output token counts are missing: fill them in first (tokens.fill_token_counts)")
    ttfts = [t for r in done if (t := r.ttft) is not None]  # both set on every completed request
    e2els = [t for r in done if (t := r.latency) is not None]
    tpots = [t for r in done if (t := r.tpot) is not None]
    itls = [gap for r in done for gap in r.itl]
    total_output = sum(r.output_tokens or 0 for r in done)  # none is None, checked above
    inputs = [n for r in done if (n := r.prompt_tokens) is not None]
    total_input = sum(inputs) if len(inputs) == len(done) else None
    out: dict[str, Any] = {
        "requests": len(records),
        "completed": len(done),
        "failed": len(failed),
        "stopped": len(stopped),
        "failed_by_kind": dict(Counter(r.error_kind for r in failed)),
        "failure_examples": _examples(failed),
        "duration": duration_s,
        "total_input_tokens": total_input,
        "total_output_tokens": total_output,
        "request_throughput": len(done) / duration_s,
        "request_goodput": None,
        "output_throughput": total_output / duration_s,
        "total_token_throughput": None if total_input is None else (total_input + total_output) / duration_s,
        "input_tokens_from": dict(Counter(r.prompt_tokens_from or "unknown" for r in done)),
        "output_tokens_from": dict(Counter(r.output_tokens_from for r in done)),
    }
    if slo:
        out["slo_ms"] = dict(slo)
        out["request_goodput"] = sum(_meets(r, slo) for r in done) / duration_s
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        out.update(_stats(name, values, percentiles))
    return out


def _meets(record: RequestRecord, slo: Mapping[str, float]) -> bool:
    assert record.ttft is not None and record.latency is not None  # set on every completed request
    return meets_slo(record.ttft, record.tpot or 0.0, record.latency, slo)


def meets_slo(ttft_s: float, tpot_s: float, e2el_s: float, slo: Mapping[str, float]) -> bool:
    """Every objective of ``slo`` (milliseconds by ttft, tpot, e2el) met by a request's times in seconds."""
    observed = {"ttft": ttft_s, "tpot": tpot_s, "e2el": e2el_s}
    return all(observed[key] * 1000.0 <= limit for key, limit in slo.items())


def _examples(failed: Sequence[RequestRecord], per_kind: int = 2) -> list[str]:
    """A few failure reasons, each kind represented, for the summary."""
    seen: Counter = Counter()
    examples = []
    for record in failed:
        if seen[record.error_kind] < per_kind:
            seen[record.error_kind] += 1
            examples.append(f"request {record.conversation}.{record.turn}: {record.reason()}")
    return examples
