"""A server point's timeline file (``timeline-<target>-<level>.json``), typed: the client's throughput per bin,
the server's scrapes and, where it was listened to, its KV event stream, on one time axis (seconds since the load
started). ``to_json`` writes the file's keys in their order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ClientSeries:
    """Per bin of ``bin_s`` seconds: its start and the client's rates."""

    t_s: list[float] = field(default_factory=list)
    output_tokens_per_s: list[float] = field(default_factory=list)
    completed_per_s: list[float] = field(default_factory=list)
    failed_per_s: list[float] = field(default_factory=list)
    in_flight: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "t_s": self.t_s,
            "output_tokens_per_s": self.output_tokens_per_s,
            "completed_per_s": self.completed_per_s,
            "failed_per_s": self.failed_per_s,
            "in_flight": self.in_flight,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClientSeries:
        return cls(
            list(data.get("t_s") or []),
            list(data.get("output_tokens_per_s") or []),
            list(data.get("completed_per_s") or []),
            list(data.get("failed_per_s") or []),
            list(data.get("in_flight") or []),
        )


@dataclass(frozen=True)
class ScrapeRow:
    """One scrape of the server's /metrics: what it read (summed over the server's engines), or its error."""

    elapsed_s: float
    error: str | None = None  # a failed scrape reads nothing else
    kv_usage: float | None = None  # share of the KV cache in use, in [0, 1]
    total_blocks: float | None = None
    running: float | None = None
    waiting: float | None = None
    preemptions: float | None = None  # the counters so far
    prefix_queries: float | None = None
    prefix_hits: float | None = None
    generation_tokens: float | None = None

    def to_json(self) -> dict[str, Any]:
        if self.error is not None:
            return {"elapsed_s": self.elapsed_s, "error": self.error}
        return {
            "elapsed_s": self.elapsed_s,
            "kv_usage": self.kv_usage,
            "total_blocks": self.total_blocks,
            "running": self.running,
            "waiting": self.waiting,
            "preemptions": self.preemptions,
            "prefix_queries": self.prefix_queries,
            "prefix_hits": self.prefix_hits,
            "generation_tokens": self.generation_tokens,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScrapeRow:
        return cls(
            data["elapsed_s"],
            data.get("error"),
            data.get("kv_usage"),
            data.get("total_blocks"),
            data.get("running"),
            data.get("waiting"),
            data.get("preemptions"),
            data.get("prefix_queries"),
            data.get("prefix_hits"),
            data.get("generation_tokens"),
        )


@dataclass(frozen=True)
class KvEventSeries:
    """The server's resident prefix-cache blocks after each change (from its KV events), and the blocks it
    removed per second in the client's bins."""

    t_s: list[float] = field(default_factory=list)
    resident_blocks: list[int] = field(default_factory=list)
    bin_t_s: list[float] = field(default_factory=list)
    removed_per_s: list[float] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "t_s": self.t_s,
            "resident_blocks": self.resident_blocks,
            "bin_t_s": self.bin_t_s,
            "removed_per_s": self.removed_per_s,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KvEventSeries:
        return cls(
            list(data.get("t_s") or []),
            list(data.get("resident_blocks") or []),
            list(data.get("bin_t_s") or []),
            list(data.get("removed_per_s") or []),
        )


@dataclass(frozen=True)
class EndpointTimeline:
    version: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)  # the target, its load, the engine and level
    bin_s: float = 0.0  # the client series' bin width
    duration_s: float | None = None  # the load's
    client: ClientSeries = ClientSeries()
    server: list[ScrapeRow] = field(default_factory=list)
    kv_events: KvEventSeries | None = None  # None: the stream was not listened to

    @property
    def usage_rows(self) -> list[ScrapeRow]:
        """The scrapes that read the server's KV usage."""
        return [row for row in self.server if row.kv_usage is not None]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "version": self.version,
            "meta": self.meta,
            "bin_s": self.bin_s,
            "duration_s": self.duration_s,
            "client": self.client.to_json(),
            "server": [row.to_json() for row in self.server],
        }
        if self.kv_events is not None:
            out["kv_events"] = self.kv_events.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EndpointTimeline:
        """A timeline file; what an older one lacks (its KV events, a series) reads as empty."""
        client, events = data.get("client"), data.get("kv_events")
        return cls(
            data.get("version"),
            dict(data.get("meta") or {}),
            data.get("bin_s") or 0.0,
            data.get("duration_s"),
            ClientSeries.from_json(client) if isinstance(client, Mapping) else ClientSeries(),
            [ScrapeRow.from_json(row) for row in data.get("server") or []],
            KvEventSeries.from_json(events) if isinstance(events, Mapping) else None,
        )
