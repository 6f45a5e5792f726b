"""The lines of the timeline ``kvbench watch`` records (and a server point keeps in its format): a header with the
run's provenance, then one line per engine instance per scrape, appended and flushed one by one.

A line is ``{"elapsed_s", "time", "url", "state"}`` (``state``: a :class:`ServerState` record), or a scrape
that failed, ``{"elapsed_s", "time", "url", "error"}``. The first line is a header (``"kind":
"kvbench-watch"``, with the run's ``meta``).
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvbench.fileio import append_jsonl
from kvbench.results.run_meta import run_meta
from kvbench.results.servers import ServerState

KIND = "kvbench-watch"
VERSION = 1
TIMELINE_FILE = "timeline.jsonl"


def header_record(url: str, interval_s: float) -> dict[str, Any]:
    """The first line: what was watched, how often, and the run's provenance (command, versions, host)."""
    return {
        "kind": KIND,
        "version": VERSION,
        "url": url,
        "interval_s": interval_s,
        "started": time.time(),
        "meta": run_meta(),
    }


def sample_records(elapsed_s: float, url: str, states: Iterable[ServerState]) -> list[dict[str, Any]]:
    now = time.time()
    return [{"elapsed_s": elapsed_s, "time": now, "url": url, "state": state.record()} for state in states]


def error_record(elapsed_s: float, url: str, error: str) -> dict[str, Any]:
    return {"elapsed_s": elapsed_s, "time": time.time(), "url": url, "error": error}


def append_records(path: Path, records: Iterable[dict[str, Any]]) -> None:
    for record in records:
        append_jsonl(path, record)
