"""When requests arrive: an open-loop Poisson process (or its gamma generalisation with a burstiness, as
``vllm bench serve`` draws it), or the arrival times a trace or requests file records.

Open loop means arrivals do not wait for earlier requests to finish (the closed-loop client of ``sweep``
does): a fleet under a rate it cannot serve builds queues, as a real service does.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

import numpy as np

from kvbench.errors import KvbenchError
from kvbench.workload.jsonl import json_objects, read_text

TIME_KEYS = ("arrival_time", "timestamp")  # seconds; the first row's time is the run's start


def poisson_arrivals(count: int, rate: float, seed: int) -> list[float]:
    """``count`` arrival times (seconds from 0) of a Poisson process at ``rate`` requests per second."""
    if not (math.isfinite(rate) and rate > 0):
        raise KvbenchError(f"arrival rate must be a positive number of requests per second, got {rate}")
    if count < 1:
        raise KvbenchError(f"number of requests must be at least 1, got {count}")
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, count)
    times = np.cumsum(gaps) - gaps[0]  # the first request arrives at 0
    return [float(t) for t in times]


def gamma_arrivals(count: int, rate: float, burstiness: float, seed: int) -> list[float]:
    """``count`` arrival times (seconds from 0) at ``rate`` requests per second whose gaps follow a gamma
    distribution of shape ``burstiness`` and mean 1 / rate, as in ``vllm bench serve``: 1 is a Poisson process
    (the same draws as :func:`poisson_arrivals`), under 1 burstier, above 1 more even, infinity evenly spaced.
    An infinite rate sends everything at 0. Unlike vLLM's bench, the times are not rescaled to end at
    count / rate: the process is what it is, and the point reports the rate it reached."""
    if count < 1:
        raise KvbenchError(f"number of requests must be at least 1, got {count}")
    if (
        isinstance(burstiness, bool)
        or not isinstance(burstiness, (int, float))
        or math.isnan(burstiness)
        or burstiness <= 0
    ):
        raise KvbenchError(f"burstiness must be a positive number (1: Poisson), got {burstiness}")
    if rate == math.inf:
        return [0.0] * count
    if not (isinstance(rate, (int, float)) and math.isfinite(rate) and rate > 0):
        raise KvbenchError(f"arrival rate must be a positive number of requests per second, got {rate}")
    if burstiness == 1:
        return poisson_arrivals(count, rate, seed)
    if math.isinf(burstiness):
        return [index / rate for index in range(count)]
    gaps = np.random.default_rng(seed).gamma(burstiness, 1.0 / (rate * burstiness), count)
    times = np.cumsum(gaps) - gaps[0]
    return [float(t) for t in times]


def recorded_arrivals(path: str | Path) -> list[float] | None:
    """Arrival times recorded in a JSONL or CSV file (``arrival_time`` or ``timestamp`` per row), shifted so
    the first is 0; None when the file records none. Rows must all have one, in non-decreasing order."""
    source = Path(path)
    text = read_text(source, "arrivals file")
    if source.suffix.lower() == ".csv":
        rows = [(f"{source}:{number}", row) for number, row in enumerate(csv.DictReader(text.splitlines()), 2)]
    else:
        rows = json_objects(source, text)
    keyed = [(where, _time_of(row, where)) for where, row in rows]
    present = [t for _, t in keyed if t is not None]
    if not present:
        return None
    if len(present) != len(keyed):
        where = next(w for w, t in keyed if t is None)
        raise KvbenchError(f"{where}: no arrival_time, though other rows have one; give every row one or none")
    timed = [(where, t) for where, t in keyed if t is not None]  # every row: each has a time now
    for (where, t), (_, before) in zip(timed[1:], timed, strict=False):
        if t < before:
            raise KvbenchError(f"{where}: arrival_time {t} is earlier than the row before ({before}); sort the file")
    first = present[0]
    return [t - first for t in present]


def _time_of(row: dict, where: str) -> float | None:
    for key in TIME_KEYS:
        value = row.get(key)
        if value is None or value == "":
            continue
        try:
            number = float(value)
        except (TypeError, ValueError):
            raise KvbenchError(f"{where}: {key} must be a number of seconds, got {value!r}") from None
        if isinstance(value, bool) or not math.isfinite(number) or number < 0:
            raise KvbenchError(f"{where}: {key} must be a non-negative number of seconds, got {value!r}")
        return number
    return None
