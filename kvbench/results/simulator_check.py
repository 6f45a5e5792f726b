"""The simulator against a real fleet (``simulator-check.json``, and the run's ``meta.simulator_check``): the step
times fitted to the servers, each twin's KV pool, and per policy the real and simulated figures side by side."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from kvbench.engine.timing import MeasuredTiming


@dataclass(frozen=True)
class PolicyCheck:
    """One policy, real beside simulated; ``skipped`` says why it was not compared (the figures then unset)."""

    policy: str
    skipped: str | None = None
    share_real: list[float] = field(default_factory=list)  # each instance's share of the requests
    share_simulated: list[float] = field(default_factory=list)
    share_gap_points: float = 0.0  # the largest difference of a share, in percentage points
    hit_rate_real: float | None = None  # prefix hit rate (None: the servers counted no prompt token)
    hit_rate_simulated: float | None = None
    hit_rate_gap_points: float | None = None  # real - simulated, in percentage points
    preemptions_real: int = 0
    preemptions_simulated: int = 0
    p50_ttft_ms_real: float | None = None
    p50_ttft_ms_simulated: float | None = None
    agrees: bool = False  # share and hit rate within the agreement's points
    timing: MeasuredTiming | None = None  # the step times this policy's servers counted (None: the check's own)

    def to_json(self) -> dict[str, Any]:
        if self.skipped is not None:
            return {"policy": self.policy, "skipped": self.skipped}
        return {
            "policy": self.policy,
            "share_real": list(self.share_real),
            "share_simulated": list(self.share_simulated),
            "share_gap_points": self.share_gap_points,
            "hit_rate_real": self.hit_rate_real,
            "hit_rate_simulated": self.hit_rate_simulated,
            "hit_rate_gap_points": self.hit_rate_gap_points,
            "preemptions_real": self.preemptions_real,
            "preemptions_simulated": self.preemptions_simulated,
            "p50_ttft_ms_real": self.p50_ttft_ms_real,
            "p50_ttft_ms_simulated": self.p50_ttft_ms_simulated,
            "agrees": self.agrees,
            **({"timing": asdict(self.timing)} if self.timing is not None else {}),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PolicyCheck:
        return cls(
            policy=data["policy"],
            skipped=data.get("skipped") or None,
            share_real=list(data.get("share_real") or []),
            share_simulated=list(data.get("share_simulated") or []),
            share_gap_points=data.get("share_gap_points", 0.0),
            hit_rate_real=data.get("hit_rate_real"),
            hit_rate_simulated=data.get("hit_rate_simulated"),
            hit_rate_gap_points=data.get("hit_rate_gap_points"),
            preemptions_real=data.get("preemptions_real", 0),
            preemptions_simulated=data.get("preemptions_simulated", 0),
            p50_ttft_ms_real=data.get("p50_ttft_ms_real"),
            p50_ttft_ms_simulated=data.get("p50_ttft_ms_simulated"),
            agrees=bool(data.get("agrees", False)),
            timing=_timing(data["timing"]) if data.get("timing") else None,
        )


TIMED_BY_COUNTERS = "step counters"  # the servers' own counts of their steps and the seconds they took
TIMED_BY_REQUESTS = "requests"  # the requests' times to first token and per output token


@dataclass(frozen=True)
class SimulatorCheck:
    timing: MeasuredTiming  # the step times fitted to the real run
    blocks_per_instance: list[int] = field(default_factory=list)  # each twin's KV pool, as its server's
    policies: list[PolicyCheck] = field(default_factory=list)
    timed_by: str = TIMED_BY_REQUESTS  # what the step times were fitted to

    @property
    def compared(self) -> list[PolicyCheck]:
        """The policies compared (not skipped)."""
        return [policy for policy in self.policies if policy.skipped is None]

    def to_json(self) -> dict[str, Any]:
        return {
            "timing": asdict(self.timing),
            "blocks_per_instance": list(self.blocks_per_instance),
            "policies": [policy.to_json() for policy in self.policies],
            "timed_by": self.timed_by,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SimulatorCheck:
        """A check as written; a step time it lacks reads 0, and one that does not say what timed it reads as
        timed by the requests."""
        return cls(
            _timing(data.get("timing") or {}),
            list(data.get("blocks_per_instance") or []),
            [PolicyCheck.from_json(policy) for policy in data.get("policies") or []],
            data.get("timed_by") or TIMED_BY_REQUESTS,
        )


def _timing(data: Mapping[str, Any]) -> MeasuredTiming:
    """Step times as written; a term missing reads 0."""
    return MeasuredTiming(
        data.get("decode_s", 0.0),
        data.get("prefill_base_s", 0.0),
        data.get("prefill_per_token_s", 0.0),
        data.get("decode_per_running_s", 0.0),
    )
