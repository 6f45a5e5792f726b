"""The load a client puts on an engine, kept apart from the transport that carries its requests.

Two load patterns, the two that ``vllm bench serve`` and GuideLLM drive:

- :class:`ClosedLoop`: exactly ``concurrency`` requests in flight, the next sent when one ends, until the list
  runs out (:class:`ClosedLoopClient`);
- :class:`OpenLoop`: each request sent at its arrival time whatever is in flight, optionally capped at
  ``max_concurrency`` in flight, the rest waiting in the client in arrival order (:class:`OpenLoopClient`).

A client sends to a :class:`Target` (``add(request) -> bool``, the request's ``arrival_time`` already set):
an engine session, a simulated instance, vLLM's engine, a fleet's router; an HTTP connection fits the same
shape. The transport's loop asks the client three things: ``release(now)`` (send what is due), ``next_time()``
(when the next request is due by time alone) and ``done(now)`` (one in flight ended). The same loop then runs
either pattern::

    client = load.client(requests, target)
    client.release(start)
    while work is in flight or client.next_time() is not None:
        step or wait until client.next_time(); client.release(now)  # done(now) is called as requests end
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

from kvbench.engine.request import Request


class Target(Protocol):
    """Where a client sends a request: queue it (``request.arrival_time`` already set); False when it is
    rejected at once (it then holds no slot of the client's)."""

    def add(self, request: Request) -> bool: ...


class ClosedLoopClient:
    """Closed-loop client: keeps ``concurrency`` requests in flight, submitting the next when one ends.

    It also notes when the full load ends: ``full_until`` is the first moment fewer than ``concurrency``
    requests are in flight (the list ran out and one finished); None while the load holds, or when it never
    held (``held_full`` False: fewer requests than the concurrency).
    """

    def __init__(self, requests: Sequence[Request], concurrency: int, scheduler: Target) -> None:
        self._pending: Iterator[Request] = iter(requests)
        self._scheduler = scheduler
        self.in_flight = 0
        self.concurrency = concurrency
        self.held_full: bool | None = None
        self.full_until: float | None = None

    def top_up(self, now: float) -> None:
        while self.in_flight < self.concurrency:
            request = next(self._pending, None)
            if request is None:
                break
            request.arrival_time = now
            if self._scheduler.add(request):
                self.in_flight += 1
        if self.held_full is None:
            self.held_full = self.in_flight >= self.concurrency
        elif self.held_full and self.full_until is None and self.in_flight < self.concurrency:
            self.full_until = now

    def release(self, now: float) -> None:
        """The first call sends the first ``concurrency`` requests; later ones wait for ``done``."""
        if self.held_full is None:
            self.top_up(now)

    def next_time(self) -> float | None:
        """A closed loop sends only when a request ends, never by time alone."""
        return None

    def done(self, now: float) -> None:
        self.in_flight -= 1
        self.top_up(now)


class OpenLoopClient:
    """Open-loop client: each request is sent at its arrival time, however many are in flight.

    With ``max_concurrency``, at most that many are in flight; a request due while every slot is taken waits in
    the client (in arrival order) until one frees, and is timed from then (``arrival_time`` = the later of its
    scheduled time and the moment its slot freed), as ``vllm bench serve --max-concurrency`` times a request
    from when it is sent. Otherwise ``arrival_time`` is the scheduled time, even when ``release`` is called a
    little after it (a wall-clock loop's lag, or a simulated step that ran past it). An open loop has no
    full-load window (``held_full`` stays None).
    """

    held_full: bool | None = None
    full_until: float | None = None

    def __init__(
        self, arrivals: Sequence[tuple[float, Request]], target: Target, max_concurrency: int | None = None
    ) -> None:
        times = [t for t, _ in arrivals]
        if any(not math.isfinite(t) or t < 0 for t in times) or times != sorted(times):
            raise ValueError("arrival times must be finite, non-negative and non-decreasing")
        if max_concurrency is not None and max_concurrency < 1:
            raise ValueError(f"max_concurrency must be at least 1, got {max_concurrency}")
        self._arrivals = list(arrivals)
        self._next = 0  # the first arrival not yet due
        self._waiting: deque[Request] = deque()  # due, not sent yet (the cap)
        self._free = [-math.inf] * (max_concurrency or 0)  # capped: when each free slot became free (a heap)
        self._target = target
        self.max_concurrency = max_concurrency
        self.in_flight = 0
        self.sent = 0

    @property
    def exhausted(self) -> bool:
        """Every request has been sent (or rejected at once)."""
        return self._next == len(self._arrivals) and not self._waiting

    def next_time(self) -> float | None:
        """The next scheduled arrival still to come; None when every arrival is due already."""
        return self._arrivals[self._next][0] if self._next < len(self._arrivals) else None

    def release(self, now: float) -> None:
        """Send every request due by ``now``, as the cap allows."""
        while self._next < len(self._arrivals) and self._arrivals[self._next][0] <= now:
            t, request = self._arrivals[self._next]
            self._next += 1
            request.arrival_time = t
            self._waiting.append(request)
        self._send()

    def done(self, now: float) -> None:
        """One request in flight ended at ``now``: its slot goes to the longest waiting request, if any."""
        self.in_flight -= 1
        if self.max_concurrency is not None:
            heapq.heappush(self._free, now)
        self._send()

    def _send(self) -> None:
        capped = self.max_concurrency is not None
        while self._waiting and (not capped or self._free):
            request = self._waiting.popleft()
            if capped:
                request.arrival_time = max(request.arrival_time, heapq.heappop(self._free))
            self.sent += 1
            if self._target.add(request):
                self.in_flight += 1
            elif capped:  # rejected at once: the slot is free again
                heapq.heappush(self._free, request.arrival_time)


@dataclass(frozen=True)
class ClosedLoop:
    """Exactly ``concurrency`` requests in flight until the list runs out."""

    concurrency: int

    def client(self, requests: Sequence[Request], target: Target) -> ClosedLoopClient:
        return ClosedLoopClient(requests, self.concurrency, target)


@dataclass(frozen=True)
class OpenLoop:
    """Request ``i`` sent at ``arrival_times[i]`` seconds, at most ``max_concurrency`` in flight (None: no cap)."""

    arrival_times: tuple[float, ...]
    max_concurrency: int | None = None

    def client(self, requests: Sequence[Request], target: Target) -> OpenLoopClient:
        if len(requests) != len(self.arrival_times):
            raise ValueError(f"{len(requests)} requests for {len(self.arrival_times)} arrival times")
        return OpenLoopClient(list(zip(self.arrival_times, requests, strict=True)), target, self.max_concurrency)


Load = ClosedLoop | OpenLoop
LoadClient = ClosedLoopClient | OpenLoopClient


def as_load(load: Load | int) -> Load:
    """``load``, with a bare integer read as a closed loop of that concurrency."""
    return ClosedLoop(load) if isinstance(load, int) else load
