"""A server point's prefix-cache reuse, typed: the hit rate its requests report beside the server's counters,
the target hit rate it was shaped to, and what the workload itself allows. A point keeps it in its JSON as
``prefix_reuse``."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ReuseSpread:
    """The hit rate per conversation: how many there were and the spread of their rates."""

    conversations: int
    min: float
    median: float
    max: float

    def to_json(self) -> dict[str, Any]:
        return {"conversations": self.conversations, "min": self.min, "median": self.median, "max": self.max}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReuseSpread:
        return cls(data["conversations"], data["min"], data["median"], data["max"])


@dataclass(frozen=True)
class ReuseTarget:
    """A target hit rate the prompts were shaped to, and the rate achieved against it."""

    rate: float  # asked for, a share in [0, 1]
    planned: float  # what the shaped prompts allow, in whole blocks
    block_size: int  # the server's KV block, in tokens
    achieved: float | None = None  # the requests' rate (the counters' where the answers did not say)
    tolerance: float = 0.0  # max(0.5 points, one block over the mean prompt)
    met: bool | None = None  # None: nothing achieved to judge

    def to_json(self) -> dict[str, Any]:
        return {
            "rate": self.rate,
            "planned": self.planned,
            "block_size": self.block_size,
            "achieved": self.achieved,
            "tolerance": self.tolerance,
            "met": self.met,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ReuseTarget:
        return cls(
            data["rate"],
            data["planned"],
            data["block_size"],
            data.get("achieved"),
            data.get("tolerance", 0.0),
            data.get("met"),
        )


@dataclass(frozen=True)
class WorkloadReuse:
    """What an unbounded prefix cache of ``block_size``-token blocks would serve of the requests as sent."""

    block_size: int
    ideal_cached_tokens: int
    ideal_hit_rate: float | None
    requests_sharing_under_one_block: int  # a shared head shorter than a block: never served

    def to_json(self) -> dict[str, Any]:
        return {
            "block_size": self.block_size,
            "ideal_cached_tokens": self.ideal_cached_tokens,
            "ideal_hit_rate": self.ideal_hit_rate,
            "requests_sharing_under_one_block": self.requests_sharing_under_one_block,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> WorkloadReuse:
        return cls(
            data.get("block_size") or 0,
            data.get("ideal_cached_tokens") or 0,
            data.get("ideal_hit_rate"),
            data.get("requests_sharing_under_one_block") or 0,
        )


@dataclass(frozen=True)
class PrefixReuse:
    """Rates are shares in [0, 1]; None where the answers (or the server) did not say."""

    requests: int = 0  # completed
    requests_reporting: int = 0  # of them, the ones whose answer gave its cached tokens
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    hit_rate_requests: float | None = None
    hit_rate_by_turn: dict[str, float] | None = None  # turn (from 0, as text) -> rate
    hit_rate_by_conversation: ReuseSpread | None = None
    hit_rate_counters: float | None = None  # the server's prefix-cache counters over the load
    counter_hits: float | None = None
    difference_tokens: float | None = None  # the answers' cached tokens minus the counters' hits
    difference_pct_points: float | None = None
    flag: str | None = None  # why the two sides disagree, or what is unknown
    target: ReuseTarget | None = None  # written only with a target hit rate
    workload: WorkloadReuse | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "requests_reporting": self.requests_reporting,
            "cached_tokens": self.cached_tokens,
            "prompt_tokens": self.prompt_tokens,
            "hit_rate_requests": self.hit_rate_requests,
            "hit_rate_by_turn": self.hit_rate_by_turn,
            "hit_rate_by_conversation": self.hit_rate_by_conversation.to_json()
            if self.hit_rate_by_conversation
            else None,
            "hit_rate_counters": self.hit_rate_counters,
            "counter_hits": self.counter_hits,
            "difference_tokens": self.difference_tokens,
            "difference_pct_points": self.difference_pct_points,
            "flag": self.flag,
        }
        if self.target is not None:
            out["target"] = self.target.to_json()
        out["workload"] = self.workload.to_json() if self.workload else None
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PrefixReuse:
        """Any part that is not an object (an older or hand-edited point) is read as not measured."""
        spread, target, workload = data.get("hit_rate_by_conversation"), data.get("target"), data.get("workload")
        by_turn = data.get("hit_rate_by_turn")
        return cls(
            data.get("requests") or 0,
            data.get("requests_reporting") or 0,
            data.get("cached_tokens"),
            data.get("prompt_tokens"),
            _share(data.get("hit_rate_requests")),
            by_turn if isinstance(by_turn, dict) else None,
            ReuseSpread.from_json(spread) if isinstance(spread, Mapping) else None,
            _share(data.get("hit_rate_counters")),
            data.get("counter_hits"),
            data.get("difference_tokens"),
            data.get("difference_pct_points"),
            data.get("flag"),
            ReuseTarget.from_json(target) if isinstance(target, Mapping) else None,
            WorkloadReuse.from_json(workload) if isinstance(workload, Mapping) else None,
        )


def _share(value: Any) -> float | None:
    """A rate as JSON holds it; anything but a number (a hand-edited file) is not a rate."""
    return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None
