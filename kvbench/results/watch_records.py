"""The lines of the timeline ``kvbench watch`` records (and a server point keeps in its format): a header with the
run's provenance, then one line per engine instance per scrape, appended and flushed one by one.

A line is ``{"elapsed_s", "time", "url", "state"}`` (``state``: a :class:`ServerState` record), or a scrape
that failed, ``{"elapsed_s", "time", "url", "error"}``. The first line is a header (``"kind":
"kvbench-watch"``, with the run's ``meta``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench import json_input
from kvbench.fileio import append_jsonl
from kvbench.results.run_meta import run_meta
from kvbench.results.servers import ServerState
from kvbench.values import is_number

KIND = "kvbench-watch"
VERSION = 1
TIMELINE_FILE = "timeline.jsonl"


MAX_HEADER_CHARS = 1 << 20  # the header's line is read up to this long
MAX_ELAPSED_S = 1e9  # about 30 years: a watch that long was not recorded


@dataclass(frozen=True)
class WatchHeader:
    """The first line: what was watched, how often, and the run's provenance (command, versions, host).
    A field an older header lacks reads None (``meta``: empty)."""

    url: str | None = None
    interval_s: float | None = None  # seconds between scrapes
    started: float | None = None  # epoch seconds
    meta: Mapping[str, Any] = field(default_factory=dict)  # results.run_meta.run_meta
    version: int | None = VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": KIND,
            "version": self.version,
            "url": self.url,
            "interval_s": self.interval_s,
            "started": self.started,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_json(cls, data: Any) -> WatchHeader | None:
        """The header a line holds; None when the line is not one (a scrape, another tool's record)."""
        if not isinstance(data, dict) or data.get("kind") != KIND:
            return None
        meta = data.get("meta")
        return cls(
            data.get("url"),
            data.get("interval_s"),
            data.get("started"),
            meta if isinstance(meta, dict) else {},
            data.get("version"),
        )


def header_record(url: str, interval_s: float) -> dict[str, Any]:
    return WatchHeader(url, interval_s, time.time(), run_meta()).to_json()


def read_header(path: Path) -> WatchHeader | None:
    """The timeline's header: its first line, when that is the header kvbench watch writes."""
    if not path.is_file():
        return None
    try:
        with open(path, encoding="utf-8") as lines:
            first = json_input.loads(lines.readline(MAX_HEADER_CHARS) or "{}")
    except (OSError, ValueError):
        return None
    return WatchHeader.from_json(first)


@dataclass(frozen=True)
class WatchScrape:
    """A line after the header: one engine instance at one scrape, or a scrape that failed (``error``)."""

    elapsed_s: float  # seconds since the watch's first scrape
    time: float  # epoch seconds
    url: str
    state: ServerState | None = None
    error: str | None = None  # why the scrape failed (then no state)

    def to_json(self) -> dict[str, Any]:
        line: dict[str, Any] = {"elapsed_s": self.elapsed_s, "time": self.time, "url": self.url}
        if self.state is not None:
            line["state"] = self.state.record()
        else:
            line["error"] = self.error
        return line

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WatchScrape:
        """A scrape line; ValueError when it is none (no elapsed time, neither a state nor an error) or when a
        state's time is no finite number of seconds (a failed scrape is counted whatever its time)."""
        if "elapsed_s" not in data or ("state" not in data and "error" not in data):
            raise ValueError("not a scrape: it needs elapsed_s and a state or an error")
        elapsed, error = data["elapsed_s"], data.get("error")
        failed = "error" in data
        if not failed and (not is_number(elapsed, finite=True) or abs(elapsed) > MAX_ELAPSED_S):
            raise ValueError("elapsed_s is not a finite number of seconds")  # before the load: negative
        return cls(
            elapsed,
            data.get("time", 0.0),
            str(data.get("url", "")),
            None if failed else ServerState.from_record(data["state"]),
            None if error is None else str(error),
        )


def sample_records(elapsed_s: float, url: str, states: Iterable[ServerState]) -> list[dict[str, Any]]:
    now = time.time()
    return [WatchScrape(elapsed_s, now, url, state).to_json() for state in states]


def error_record(elapsed_s: float, url: str, error: str) -> dict[str, Any]:
    return WatchScrape(elapsed_s, time.time(), url, error=error).to_json()


def append_records(path: Path, records: Iterable[dict[str, Any]]) -> None:
    for record in records:
        append_jsonl(path, record)
