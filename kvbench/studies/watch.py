"""Watch a live engine (kvbench, vLLM or SGLang): scrape its metrics every interval and append each scrape to
a timeline (JSONL), until the duration is over or the user stops it (Ctrl-C reaches the caller).

The first scrape must work (a URL that is down or is not a metrics page is bad input); a later one that fails
is recorded as a failed scrape and the watch goes on, since a server under load may miss a scrape.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.results.exposition import scrape
from kvbench.results.servers import ServerState, read_states
from kvbench.results.watch_records import append_records, error_record, header_record, sample_records


@dataclass(frozen=True)
class WatchSettings:
    url: str
    interval_s: float
    duration_s: float | None  # None: until stopped
    timeline: Path  # the JSONL file to append to


@dataclass
class Scrape:
    elapsed_s: float
    states: list[ServerState] = field(default_factory=list)
    error: str | None = None


def read_endpoint(url: str, timeout_s: float = 5.0) -> list[ServerState]:
    """One scrape of ``url`` read into engine states; a one-line error when it cannot be."""
    return read_states(scrape(url, timeout_s), url)


_sleep = time.sleep  # the pause between scrapes (tests replace it, and the clock, with a virtual one)
_clock = time.monotonic


def watch(
    settings: WatchSettings,
    first: list[ServerState],
    on_scrape: Callable[[Scrape], None],
    clock: Callable[[], float] | None = None,
    sleep: Callable[[float], None] | None = None,
) -> int:
    """Record ``first`` (the scrape that checked the URL) and then one scrape per interval; returns how many
    were recorded. Scrapes are due at fixed ticks from the start, so a slow one does not shift the rest."""
    sleep = sleep or _sleep
    clock = clock or _clock
    start = clock()
    append_records(settings.timeline, [header_record(settings.url, settings.interval_s)])
    count = 0
    current = Scrape(0.0, first)
    timeout = max(1.0, min(10.0, 2 * settings.interval_s))
    while True:
        if current.error is None:
            append_records(settings.timeline, sample_records(current.elapsed_s, settings.url, current.states))
        else:
            append_records(settings.timeline, [error_record(current.elapsed_s, settings.url, current.error)])
        count += 1
        on_scrape(current)
        due = count * settings.interval_s
        over = settings.duration_s is not None and clock() - start >= settings.duration_s  # slow scrapes ate it
        if settings.duration_s is not None and (due > settings.duration_s + 1e-9 or over):
            return count
        sleep(max(0.0, start + due - clock()))
        elapsed = clock() - start
        try:
            current = Scrape(elapsed, read_endpoint(settings.url, timeout))
        except KvbenchError as err:
            current = Scrape(elapsed, error=str(err))
