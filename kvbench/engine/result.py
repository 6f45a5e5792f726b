"""What a run of either engine (or the simulator) produced: requests, accounting, latencies."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvbench.engine.latency import latency_fields
from kvbench.engine.request import Request, RequestStatus
from kvbench.kv.accounting import WasteAccountant


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

    def latencies(self) -> dict:
        return latency_fields(self.completed, self.itl_values_s, self.itl_weights)
