"""Measurements of this machine, made once and kept in kvbench's private cache folder.

The CPU choices (threads, which matmul path at which row count) are measured at start-up on the machine that runs,
never carried over as constants from another CPU. Measuring takes from a fraction of a second to a few seconds on
a 1B model, so the result is kept per machine and model shape: a JSON file named by a digest of everything the
measurement depends on (the ``descriptor``: CPU model and flags, torch version, shapes, dtype, threads, the paths
compared). A later run with the same descriptor reads it instead of measuring; ``KVBENCH_REMEASURE=1`` measures
again. The file lives in :mod:`kvbench.private_cache` (``0700``, nothing another user could write is read); a file
that does not parse or does not fit is measured again with a one-line note, never a traceback. Every record keeps
when it was measured and the load average then, so a choice made on a busy machine says so; and a choice made
while the machine was oversubscribed (1-minute load of 1.5 or more per CPU) is measured again once the load has
halved, since what wins on cores taken by other work (fewer threads, a path that waits less) may lose on a quiet
machine.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench import env_settings, private_cache

REMEASURE_ENV = "KVBENCH_REMEASURE"
VERSION = 1
BUSY_LOAD_PER_CPU = 1.5  # a measurement taken at this 1-minute load per CPU or more was taken on a busy machine


@dataclass(frozen=True)
class Measured:
    """A measurement's result and where it came from."""

    record: dict
    measured_at: str  # local time, ISO 8601, to the minute
    load: str  # the 1-, 5- and 15-minute load averages when it was measured
    cached: bool  # read from the cache rather than measured by this process
    path: Path | None  # the cache file (None when the cache folder could not be used)

    def provenance(self) -> str:
        """How the figures came to be, for the line that prints them."""
        if self.cached:
            return f"cached, measured {self.measured_at} at load {self.load}; {REMEASURE_ENV}=1 measures again"
        return f"measured now at load {self.load}"

    def as_dict(self) -> dict:
        return {
            "measured_at": self.measured_at,
            "load": self.load,
            "cached": self.cached,
            "cache_file": str(self.path) if self.path else None,
        }


def _load_average() -> str:
    try:
        return " ".join(f"{value:.2f}" for value in os.getloadavg())
    except OSError:
        return "unknown"


def busier_then(recorded_load: str, now_load: str, cpus: int | None = None) -> bool:
    """Whether a measurement taken at ``recorded_load`` (the load averages as stored) was taken on a busy machine
    that is at most half as busy ``now``: then it is measured again."""
    cpus = cpus or os.cpu_count() or 1
    try:
        then, now = float(recorded_load.split()[0]) / cpus, float(now_load.split()[0]) / cpus
    except (ValueError, IndexError):
        return False  # "unknown": nothing to judge by
    return then >= BUSY_LOAD_PER_CPU and now <= then / 2


def _digest(descriptor: dict) -> str:
    return private_cache.sha256_hex(json.dumps(descriptor, sort_keys=True).encode())[:16]


def measured(kind: str, descriptor: dict, measure: Callable[[], dict], check: Callable[[dict], Any]) -> Measured:
    """``measure()``'s record for this ``descriptor``, from the cache when it holds one that ``check`` accepts
    (``check`` raises ValueError, KeyError or TypeError on a record that does not fit), else measured now and
    stored."""
    descriptor = {"version": VERSION, "kind": kind, **descriptor}
    path: Path | None = None
    try:
        path = private_cache.private_dir() / f"{kind}-{_digest(descriptor)}.json"
        data = None if env_settings.switch(REMEASURE_ENV, False) else private_cache.read_bytes(path)
    except private_cache.UnsafeCache as error:
        private_cache.note(f"measuring the CPU choices without caching them: {error}")
        path, data = None, None
    if data is not None and path is not None:  # data is only ever read from a path
        try:
            stored = json.loads(data.decode("utf-8"))
            if stored["descriptor"] != descriptor:
                raise ValueError("it was measured for something else")
            check(stored["record"])
            now = _load_average()
            if not busier_then(str(stored["load"]), now):
                return Measured(stored["record"], str(stored["measured_at"]), str(stored["load"]), True, path)
            private_cache.note(
                f"measuring the CPU choices again: the cached ones were measured on a busy machine "
                f"(load {stored['load']}; now {now})"
            )
        except (ValueError, KeyError, TypeError, UnicodeDecodeError) as error:
            private_cache.note(f"measuring the CPU choices again: the cached {path.name} does not fit ({error})")
    load = _load_average()
    record = measure()
    result = Measured(record, time.strftime("%Y-%m-%d %H:%M"), load, False, path)
    if path is not None:
        text = json.dumps(
            {"descriptor": descriptor, "measured_at": result.measured_at, "load": load, "record": record},
            indent=1,
            sort_keys=True,
        )
        try:
            private_cache.write_bytes(path, (text + "\n").encode())
        except OSError as error:
            private_cache.note(f"could not keep the CPU choices in {path}: {error.strerror or error}")
            result = Measured(record, result.measured_at, load, False, None)
    return result
