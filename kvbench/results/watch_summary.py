"""One engine instance over a watch, summed up from its scrapes: how long, how full its KV cache was on average
and at peak, the most requests running and waiting, the preemptions that happened (what the watch's page shows)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.results.servers import ServerState


@dataclass(frozen=True)
class InstanceSummary:
    scrapes: int
    span_s: float  # seconds from its first scrape to its last
    usage_mean: float | None  # share of its KV blocks in use, 0..1 (None: the engine does not expose it)
    usage_peak: float | None
    running_peak: float | None
    waiting_peak: float | None
    preemptions: float | None  # new ones over the watch (None: fewer than two scrapes exposed the count)
    family: str  # the engine's name (vLLM, SGLang, kvbench)

    @classmethod
    def of(cls, samples: Sequence[tuple[float, ServerState]]) -> InstanceSummary:
        """From (seconds since the first scrape, state) pairs, oldest first."""
        states = [s for _, s in samples]
        usage = [s.usage for s in states if s.usage is not None]
        waiting = [s.waiting for s in states if s.waiting is not None]
        running = [s.running for s in states if s.running is not None]
        preempted = [s.preemptions for s in states if s.preemptions is not None]
        return cls(
            scrapes=len(states),
            span_s=samples[-1][0] - samples[0][0] if samples else 0.0,
            usage_mean=sum(usage) / len(usage) if usage else None,
            usage_peak=max(usage) if usage else None,
            running_peak=max(running) if running else None,
            waiting_peak=max(waiting) if waiting else None,
            preemptions=(preempted[-1] - preempted[0]) if len(preempted) > 1 else None,
            family=states[-1].family_name if states else "",
        )
