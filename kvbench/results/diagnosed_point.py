"""A recorded point as ``kvbench diagnose`` judges it, typed: the figures its rules read, whatever command wrote
the point (sweep, waste, fleet). A figure the point lacks, or holds as anything but a number, is None: the rule
that needs it does not fire, rather than judge a guess. A part that should be an object and is not (``waste``,
``metrics``, an instance) is an error: the file is corrupt, and ``kvbench diagnose`` says so in one line."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvbench.results.fleet_point import FleetInstance
from kvbench.results.waste_shares import WasteShares
from kvbench.values import number


@dataclass(frozen=True)
class DiagnosedPoint:
    engine: str | None  # None: not recorded
    concurrency: int | float | None  # as recorded (it names the point); None: not a number
    status: str | None = None  # ok | oom | error
    status_reason: str | None = None
    error: str | None = None
    completed: float | None = None
    rejected: float | None = None
    preemptions: float | None = None
    peak_running: float | None = None
    duration: float | None = None  # seconds the load ran
    kv_pool_bytes: float | None = None
    kv_peak_allocated_bytes: float | None = None
    fragmentation_mean: float | None = None
    waste: WasteShares = WasteShares()
    alloc_latency_p99_s: float | None = None  # the in-process engine's exported metrics
    alloc_count: Any = "?"  # as recorded, for the evidence
    policy: str | None = None  # a fleet point's routing policy (None: not a fleet point)
    instances: list[FleetInstance] = field(default_factory=list)  # a fleet point's
    free_blocks_imbalance_mean: float | None = None

    @property
    def is_fleet(self) -> bool:
        return self.policy is not None

    @property
    def label(self) -> str:
        """How findings name the point: ``paged C=8``, ``fleet paged/round-robin``."""
        return f"fleet {self.engine}" if self.is_fleet else f"{self.engine} C={self.concurrency}"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DiagnosedPoint:
        engine, concurrency = data.get("engine"), data.get("concurrency")
        metrics = data.get("metrics") or {}
        return cls(
            engine if isinstance(engine, str) else None,
            concurrency if number(concurrency) is not None else None,
            data.get("status"),
            data.get("status_reason"),
            data.get("error"),
            number(data.get("completed")),
            number(data.get("rejected")),
            number(data.get("preemptions")),
            number(data.get("peak_running")),
            number(data.get("duration")),
            number(data.get("kv_pool_bytes")),
            number(data.get("kv_peak_allocated_bytes")),
            number(data.get("fragmentation_mean")),
            WasteShares.from_json(data.get("waste") or {}),
            number(metrics.get("block_alloc_latency_p99_seconds")),
            metrics.get("block_alloc_count", "?"),
            str(data["policy"]) if "policy" in data else None,
            [FleetInstance.from_json(instance) for instance in data.get("instances") or []],
            number(data.get("free_blocks_imbalance_mean")),
        )
