"""The closed-loop client: exactly ``concurrency`` requests in flight until the list runs out."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvbench.engine.request import Request


class ClosedLoopClient:
    """Closed-loop client: keeps ``concurrency`` requests in flight, submitting the next when one ends.

    It also notes when the full load ends: ``full_until`` is the first moment fewer than ``concurrency``
    requests are in flight (the list ran out and one finished); None while the load holds, or when it never
    held (``held_full`` False: fewer requests than the concurrency).
    """

    def __init__(self, requests: Sequence[Request], concurrency: int, scheduler) -> None:
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

    def done(self, now: float) -> None:
        self.in_flight -= 1
        self.top_up(now)
