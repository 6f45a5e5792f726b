"""What a run of either engine (or the simulator) produced: requests, accounting, latencies."""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.engine.latency import latency_fields
from kvbench.engine.request import Request, RequestStatus
from kvbench.kv.accounting import WasteAccountant


@dataclass(frozen=True)
class SteadyWindow:
    """The stretch of a closed-loop run in which all its requests were in flight: from the first token to the
    moment the list ran out and the first of the last wave finished. Ramp-up and the draining tail are outside."""

    start_s: float
    end_s: float
    output_tokens: int  # tokens emitted inside the window
    run_s: float  # the whole run on the same clock

    @property
    def seconds(self) -> float:
        return self.end_s - self.start_s

    @property
    def share(self) -> float:
        return self.seconds / self.run_s if self.run_s > 0 else 0.0

    @property
    def output_throughput(self) -> float:
        return self.output_tokens / self.seconds


class TokenCurve:
    """Output tokens emitted so far, after each step (or span of steps): what a window's throughput needs."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.totals: list[int] = []

    def add(self, now: float, tokens: int) -> None:
        if tokens:
            self.times.append(now)
            self.totals.append((self.totals[-1] if self.totals else 0) + tokens)

    def total_at(self, moment: float) -> int:
        """Tokens emitted at or before ``moment``."""
        index = bisect.bisect_right(self.times, moment)
        return self.totals[index - 1] if index else 0

    def steady_window(self, held_full: bool | None, full_until: float | None) -> SteadyWindow | None:
        """The window of full load (None when the load never held, or ended before the first token)."""
        if not held_full or not self.times:
            return None
        start = self.times[0]
        end = self.times[-1] if full_until is None else full_until
        if end <= start:
            return None
        return SteadyWindow(start, end, self.total_at(end) - self.total_at(start), self.times[-1])


def steady_of(curve: TokenCurve, client) -> SteadyWindow | None:
    return curve.steady_window(client.held_full, client.full_until)


@dataclass
class RunResult:
    requests: list[Request]
    accountant: WasteAccountant
    num_preemptions: int
    peak_running: int
    itl_values_s: np.ndarray
    itl_weights: np.ndarray
    pool_slots: int
    block_size: int
    extras: dict = field(default_factory=dict)
    steady: SteadyWindow | None = None  # the full-load window of a closed-loop run
    cpu_time_s: float | None = None  # process CPU seconds of the run's steps (CPU devices; None elsewhere)

    def output_lengths(self) -> Sequence[int]:
        """Output tokens of each completed request: what the model (or the drawn lengths) decided."""
        return [r.num_outputs for r in self.completed]

    @property
    def completed(self) -> list[Request]:
        return [r for r in self.requests if r.status is RequestStatus.FINISHED]

    @property
    def rejected(self) -> list[Request]:
        return [r for r in self.requests if r.status is RequestStatus.REJECTED]

    @property
    def elapsed_s(self) -> float:
        return self.accountant.elapsed_s

    def throughput(self) -> dict[str, float]:
        done = self.completed
        elapsed = self.elapsed_s
        if not done or elapsed <= 0:  # nothing finished: no throughput, never a NaN
            return {"output_throughput": 0.0, "total_token_throughput": 0.0, "request_throughput": 0.0}
        output = sum(r.num_outputs for r in done)
        prompt = sum(r.prompt_len for r in done)
        return {
            "output_throughput": output / elapsed,
            "total_token_throughput": (output + prompt) / elapsed,
            "request_throughput": len(done) / elapsed,
        }

    def totals(self) -> dict[str, float | int]:
        """The run's length and the tokens its completed requests read and wrote, in ``vllm bench serve``'s names."""
        done = self.completed
        return {
            "duration": self.elapsed_s,
            "total_input_tokens": sum(r.prompt_len for r in done),
            "total_output_tokens": sum(r.num_outputs for r in done),
        }

    def latencies(self) -> dict:
        return latency_fields(self.completed, self.itl_values_s, self.itl_weights)
