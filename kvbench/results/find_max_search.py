"""``--find-max``'s answer per target, typed: the probes in the order they ran, the highest load meeting the SLO,
the first missing it and why the load stops there. ``summary.json`` keeps the searches, with the SLO they judged
by, as its ``endpoint`` object (:class:`EndpointSummary`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Limit:
    """Why the load stops at a point: a kind, the evidence, and what to change on the server."""

    kind: str  # kv_full | batch_cap | prefill_queue | compute | failures | unknown
    evidence: str
    suggestion: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "evidence": self.evidence, "suggestion": self.suggestion}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Limit:
        return cls(str(data.get("kind", "-")), str(data.get("evidence") or ""), str(data.get("suggestion", "-")))


@dataclass(frozen=True)
class Probe:
    """One level the search measured."""

    level: float
    meets: bool
    slo_share: float | None  # the share of its requests meeting every objective
    status: str  # the point's

    def to_json(self) -> dict[str, Any]:
        return {"level": self.level, "meets": self.meets, "slo_share": self.slo_share, "status": self.status}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Probe:
        return cls(data["level"], bool(data.get("meets")), data.get("slo_share"), str(data.get("status", "ok")))


@dataclass
class Search:
    """The probes of one target's search, in the order they ran, and its answer."""

    engine: str
    by: str  # "concurrency" | "rate"
    probes: list[Probe] = field(default_factory=list)
    best: float | None = None  # the highest level that met the SLO
    first_miss: float | None = None  # the lowest level that missed it
    limit: Limit | None = None
    stopped: str = ""  # why the search ended (bracket closed, budget spent, range exhausted)

    def level_text(self, level: float) -> str:
        return f"C={int(level)}" if self.by == "concurrency" else f"{level:g} req/s"

    def to_json(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "by": self.by,
            "best": self.best,
            "first_miss": self.first_miss,
            "limit": self.limit.to_json() if self.limit else None,
            "stopped": self.stopped,
            "probes": [probe.to_json() for probe in self.probes],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Search:
        limit = data.get("limit")
        return cls(
            data["engine"],
            data["by"],
            [Probe.from_json(probe) for probe in data.get("probes") or []],
            data["best"],
            data["first_miss"],
            Limit.from_json(limit) if isinstance(limit, Mapping) else None,
            str(data.get("stopped") or ""),
        )


@dataclass(frozen=True)
class EndpointSummary:
    """A ``sweep --target`` summary's own object: the ``--find-max`` searches (none for fixed levels) and the SLO
    its points were judged by."""

    find_max: list[Search] = field(default_factory=list)
    slo: dict[str, float] | None = None  # objective (ttft, tpot, e2el) -> milliseconds

    def to_json(self) -> dict[str, Any]:
        return {"find_max": [search.to_json() for search in self.find_max], "slo": self.slo}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EndpointSummary:
        return cls([Search.from_json(search) for search in data.get("find_max") or []], data.get("slo"))
