"""One tensor-engine instance in its own process: the body of a Ray actor.

The driver talks to it only through these methods (submit, step, stats, drain, reset); each answers with a
:class:`Report`: the instance's stats and the requests that ended since the last answer. Token times are
seconds since the fleet's epoch (``time.time()`` of the driver at the start): exact on one machine, and as
good as the nodes' clock sync on a cluster.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

from kvbench.engine.config import EngineConfig
from kvbench.engine.instance import InstanceStats
from kvbench.engine.request import Request
from kvbench.studies.local_model import build_engine, load_model


@dataclass(frozen=True)
class InstanceSpec:
    """What an instance loads: the same model, budget and scheduler as every other instance of the fleet."""

    model: str
    device: str
    dtype: str | None
    seed: int
    config: EngineConfig


@dataclass
class Report:
    stats: InstanceStats
    ended: list[Request]
    pid: int = 0


class InstanceServer:
    """Loads the model and serves one engine session at a time (a fresh one per policy: ``reset``)."""

    def __init__(self, spec: InstanceSpec, epoch: float) -> None:
        start = time.perf_counter()
        import torch

        if spec.device == "cpu" or not torch.cuda.is_available():
            torch.set_num_threads(1)  # one CPU per actor: its matmuls stay on its own core
        loaded = load_model(spec.model, spec.device, spec.dtype, spec.seed, max_len=spec.config.max_len)
        self.engine = build_engine(loaded, spec.config)
        self.epoch = epoch
        self.session = self.engine.session(clock=self.now)
        self.draining = False
        self.submits_after_drain = 0
        self.startup_s = time.perf_counter() - start

    def now(self) -> float:
        return time.time() - self.epoch

    def ready(self) -> tuple[float, int]:
        """(seconds the model and pool took to load, process id)."""
        return self.startup_s, os.getpid()

    def reset(self, epoch: float) -> Report:
        """A fresh session (empty pool and prefix cache) for the next policy; the model stays loaded."""
        self.epoch = epoch
        self.session = self.engine.session(clock=self.now)
        self.draining = False
        return self._report()

    def submit(self, request: Request, arrival_time: float) -> Report:
        if self.draining:  # the router must never do this: counted, and the request is refused with a reason
            self.submits_after_drain += 1
            request.arrival_time = arrival_time
            request.status = request.status.REJECTED
            request.reject_reason, request.reject_kind = "sent to a draining instance", "draining"
            self.session.ended.append(request)
        else:
            self.session.submit(request, arrival_time)
        return self._report()

    def step(self) -> Report:
        """One engine step (nothing when idle), then the report."""
        self.session.step()
        return self._report()

    def drain(self) -> Report:
        """Accept nothing new; what is queued or running still finishes."""
        self.draining = True
        return self._report()

    def stats(self) -> Report:
        return self._report()

    def _report(self) -> Report:
        return Report(self.session.stats(), self.session.take_ended(), os.getpid())
