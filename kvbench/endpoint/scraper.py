"""Scraping a server's ``/metrics`` beside the load, at fixed ticks, into engine states.

Each scrape is parsed by ``results/exposition.py`` and read by the engine families of
``results/servers.py`` (kvbench, vLLM, SGLang), as ``kvbench watch`` reads them. A scrape that fails
(the endpoint is gone, slow, or answers something else) is recorded with its reason and the scraping goes on:
a server under load may miss a scrape, and the load must never wait for one.

Times are seconds from the point's start (``time.perf_counter()`` based), the clock of the request records, so
the timeline and the client's throughput share one axis. A scrape is stamped at the middle of its round trip.

While the load runs, scrapes are only fetched (and kept compressed); they are parsed when the scraper stops.
Parsing a vLLM server's page (60 KB) takes milliseconds of the event loop that timestamps tokens, and of a CPU
the server may be short of: the client does as little as it can while it measures.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from kvbench.endpoint.http_body import read_body
from kvbench.errors import KvbenchError
from kvbench.results.exposition import MAX_BODY_BYTES
from kvbench.results.servers import ServerState, read_states

DEFAULT_INTERVAL_S = 0.5


SETTLE_GAP_S = 0.2  # between the scrapes that wait for a server's counters to settle
SETTLE_SCRAPES = 5  # at most this many more of them
COUNTER_FIELDS = ("finished", "generation_tokens", "prompt_tokens", "preemptions", "prefix_queries", "prefix_hits")


def _counters(scrape: Scrape) -> list[tuple[float | None, ...]]:
    return [tuple(getattr(state, name) for name in COUNTER_FIELDS) for state in scrape.states]


@dataclass
class Scrape:
    elapsed_s: float  # seconds from the point's start (negative: before the load began)
    states: list[ServerState] = field(default_factory=list)
    error: str | None = None
    raw: bytes | None = field(default=None, repr=False)  # the page, compressed, until it is parsed

    def as_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"elapsed_s": self.elapsed_s, "error": self.error}
        return {"elapsed_s": self.elapsed_s, "states": [state.record() for state in self.states]}


async def fetch_metrics(session: aiohttp.ClientSession, url: str, timeout_s: float) -> str:
    """The exposition text at ``url``; a one-line :class:`KvbenchError` when it cannot be read."""
    try:
        async with session.get(
            url, timeout=aiohttp.ClientTimeout(total=timeout_s), allow_redirects=False, headers={"Accept": "text/plain"}
        ) as response:
            body, cut = await read_body(response, MAX_BODY_BYTES)
            if response.status != 200:
                raise KvbenchError(f"cannot scrape {url}: HTTP {response.status} {response.reason or ''}".strip())
    except (asyncio.TimeoutError, TimeoutError):
        raise KvbenchError(f"cannot scrape {url}: no answer within {timeout_s:g} s") from None
    except aiohttp.ClientError as err:
        raise KvbenchError(f"cannot scrape {url}: {' '.join(str(err).split()) or type(err).__name__}") from None
    if cut:
        raise KvbenchError(f"{url} returned more than {MAX_BODY_BYTES >> 20} MiB: not a metrics page")
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        raise KvbenchError(f"{url} did not return UTF-8 text: not Prometheus exposition text") from None


class MetricsScraper:
    """Scrapes ``url`` every ``interval_s`` from ``start()`` until ``stop()``, which takes one last scrape."""

    def __init__(
        self,
        session: aiohttp.ClientSession,
        url: str,
        origin: float,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if not interval_s > 0:
            raise KvbenchError(f"scrape interval must be a positive number of seconds, got {interval_s}")
        self.session = session
        self.url = url
        self.origin = origin  # perf_counter of the point's start
        self.interval_s = interval_s
        self.timeout_s = timeout_s if timeout_s is not None else min(5.0, max(1.0, 2 * interval_s))
        self.clock = clock
        self.scrapes: list[Scrape] = []
        self._task: asyncio.Task | None = None
        self._stop = asyncio.Event()

    async def scrape(self, parse: bool = True) -> Scrape:
        """One scrape, recorded; parsed now, or (``parse=False``) kept for :meth:`parse_pending`."""
        sent = self.clock()
        try:
            text = await fetch_metrics(self.session, self.url, self.timeout_s)
            scrape = Scrape((sent + self.clock()) / 2 - self.origin, raw=zlib.compress(text.encode(), 1))
        except KvbenchError as err:
            scrape = Scrape((sent + self.clock()) / 2 - self.origin, error=str(err))
        self.scrapes.append(scrape)
        if parse:
            self._parse(scrape)
        return scrape

    def _parse(self, scrape: Scrape) -> None:
        if scrape.raw is None:
            return
        try:
            scrape.states = read_states(zlib.decompress(scrape.raw).decode(), self.url)
        except KvbenchError as err:
            scrape.error = str(err)
        scrape.raw = None

    def parse_pending(self) -> None:
        for scrape in self.scrapes:
            self._parse(scrape)

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._loop())

    async def _loop(self) -> None:
        """The first tick is one interval after ``start()``: the scrape before the load was just taken, and a
        scrape at the load's first instant would compete with the server's admission of its first requests."""
        began = self.clock()
        ticks = 0
        while True:
            ticks = max(ticks + 1, int((self.clock() - began) / self.interval_s) + 1)  # a slow scrape skips ticks
            delay = began + ticks * self.interval_s - self.clock()
            try:
                await asyncio.wait_for(self._stop.wait(), timeout=max(0.0, delay))
                return
            except asyncio.TimeoutError:
                pass
            await self.scrape(parse=False)

    async def settled_scrape(self, gap_s: float = SETTLE_GAP_S, most: int = SETTLE_SCRAPES) -> Scrape:
        """A scrape whose counters have stopped moving: scraped again every ``gap_s`` until two in a row agree
        (at most ``most`` more). A server may publish its counters a moment after it answered (kvbench serve
        counts a step's tokens at the step's end): a start or closing scrape taken at once would cut them off."""
        scrape = await self.scrape()
        for _ in range(most):
            await asyncio.sleep(gap_s)
            again = await self.scrape()
            if scrape.error is None and again.error is None and _counters(scrape) == _counters(again):
                return again
            scrape = again
        return scrape

    async def stop(self) -> list[Scrape]:
        """Stop the ticks, take the closing scrape (the counters' end, settled), parse what the load left
        unparsed, and return every scrape."""
        self._stop.set()
        if self._task is not None:
            await self._task
            self._task = None
        self.parse_pending()
        await self.settled_scrape()
        return self.scrapes

    def restart_clock(self, origin: float) -> None:
        """Count from ``origin`` (the load's actual start) instead: earlier scrapes are re-stamped."""
        shift = origin - self.origin
        for scrape in self.scrapes:
            scrape.elapsed_s -= shift
        self.origin = origin

    async def cancel(self) -> None:
        """Stop without the closing scrape (the point was interrupted)."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
