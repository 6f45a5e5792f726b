"""The closed-loop client: exactly ``concurrency`` requests in flight until the list runs out."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvbench.engine.request import Request


class ClosedLoopClient:
    """Closed-loop client: keeps ``concurrency`` requests in flight, submitting the next when one ends."""

    def __init__(self, requests: Sequence[Request], concurrency: int, scheduler) -> None:
        self._pending: Iterator[Request] = iter(requests)
        self._scheduler = scheduler
        self.in_flight = 0
        self.concurrency = concurrency

    def top_up(self, now: float) -> None:
        while self.in_flight < self.concurrency:
            request = next(self._pending, None)
            if request is None:
                return
            request.arrival_time = now
            if self._scheduler.add(request):
                self.in_flight += 1

    def done(self, now: float) -> None:
        self.in_flight -= 1
        self.top_up(now)
