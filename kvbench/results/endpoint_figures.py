"""What a point measured against a server over HTTP adds to the results schema, typed: the endpoint and its load,
the server's own figures from /metrics, the failed requests, the cache reset, the prefix reuse, the KV events and
how client and server agree. They are flat fields of the point's JSON (``Point.extra``): :meth:`EndpointFigures.of`
reads them from a point, :meth:`EndpointFigures.to_json` writes them in the order the point keeps them."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from kvbench.results.point import Point
from kvbench.results.prefix_reuse_figures import PrefixReuse

ENDPOINT_FIELD = "endpoint"  # {url, api, model, load, ...}: marks a point measured over HTTP


@dataclass(frozen=True)
class LoadShape:
    """How the load was put on: a closed loop of ``concurrency``, an open loop at ``rate`` requests/s, or a
    trace at its own times."""

    pattern: str | None  # closed | open | trace; None: not recorded
    concurrency: int | None = None  # closed
    rate: float | None = None  # open; None there: every request at once
    burstiness: float | None = None  # open
    max_concurrency: int | None = None  # open
    seed: int | None = None  # open

    def to_json(self) -> dict[str, Any]:
        if self.pattern == "closed":
            return {"pattern": "closed", "concurrency": self.concurrency}
        if self.pattern == "open":
            return {
                "pattern": "open",
                "rate": self.rate,
                "burstiness": self.burstiness,
                "max_concurrency": self.max_concurrency,
                "seed": self.seed,
            }
        return {} if self.pattern is None else {"pattern": self.pattern}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LoadShape:
        return cls(
            data.get("pattern"),
            data.get("concurrency"),
            data.get("rate"),
            data.get("burstiness"),
            data.get("max_concurrency"),
            data.get("seed"),
        )


@dataclass(frozen=True)
class EndpointTarget:
    """The server a point loaded and how (the point's ``endpoint`` object)."""

    url: str | None
    api: str | None = None  # completions | chat
    model: str | None = None
    metrics_url: str | None = None
    load: LoadShape = LoadShape(None)
    peak_in_flight: int | None = None
    stopped_at_deadline: bool = False  # the point's time limit ended it
    warmup: dict[str, Any] = field(default_factory=dict)  # {requests, completed, failed, failures}: not counted

    def to_json(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "api": self.api,
            "model": self.model,
            "metrics_url": self.metrics_url,
            "load": self.load.to_json(),
            "peak_in_flight": self.peak_in_flight,
            "stopped_at_deadline": self.stopped_at_deadline,
            "warmup": self.warmup,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EndpointTarget:
        load = data.get("load")
        return cls(
            data.get("url"),
            data.get("api"),
            data.get("model"),
            data.get("metrics_url"),
            LoadShape.from_json(load if isinstance(load, Mapping) else {}),
            data.get("peak_in_flight"),
            bool(data.get("stopped_at_deadline")),
            dict(data.get("warmup") or {}),
        )


@dataclass(frozen=True)
class ServerFigures:
    """The server's own figures over the point, from its /metrics; None where it does not expose them. KV usage is
    a share of the server's KV cache in [0, 1]; the counters are differences across the load."""

    kv_usage_peak: float | None = None
    kv_usage_mean: float | None = None
    running_mean: float | None = None
    waiting_peak: float | None = None
    waiting_mean: float | None = None
    prefix_cache_hit_rate: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_queries: float | None = None
    server_mean_ttft_ms: float | None = None
    server_prompt_tokens: float | None = None
    server_generation_tokens: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerFigures:
        """From a point, or from the server's metrics of a point (which hold more)."""
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})

    @classmethod
    def combined(cls, runs: Sequence[ServerFigures]) -> ServerFigures:
        """Repeats of a point as one: the peaks' maximum, every other figure's mean, over the repeats that exposed
        it (None where none did)."""
        out: dict[str, float | None] = {}
        for f in fields(cls):
            values = [float(value) for run in runs if isinstance(value := getattr(run, f.name), (int, float))]
            combine = max if f.name in _PEAKS else statistics.fmean
            out[f.name] = combine(values) if values else None
        return cls(**out)


_PEAKS = frozenset({"kv_usage_peak", "waiting_peak"})  # over repeats: their maximum, the rest a mean


@dataclass(frozen=True)
class ServerMetrics:
    """Everything the server's /metrics said over one point, as the scrapes beside its load gave it; the point keeps
    its :meth:`figures` and :meth:`scrape_counts`. None where the server does not expose a figure."""

    scrapes: int = 0
    scrapes_failed: int = 0
    scrape_errors: list[str] = field(default_factory=list)  # the first few distinct errors
    families: list[str] = field(default_factory=list)  # the engines the scrapes recognised (vllm, sglang, kvbench)
    engines: list[str] = field(default_factory=list)  # the instances behind the endpoint
    kv_usage_peak: float | None = None  # a share of the KV cache, during the load
    kv_usage_mean: float | None = None
    running_peak: float | None = None
    running_mean: float | None = None
    waiting_peak: float | None = None
    waiting_mean: float | None = None
    scrapes_during_load: int = 0
    block_size: int | None = None  # the KV block, in tokens
    counters_window_s: float | None = None  # the counters' differences span this long
    preemptions: float | None = None  # the counters' differences over the load
    prefix_cache_queries: float | None = None
    prefix_cache_hits: float | None = None
    prefix_cache_hit_rate: float | None = None
    server_prompt_tokens: float | None = None
    server_generation_tokens: float | None = None
    server_finished: float | None = None
    server_ttft_count: float | None = None
    server_mean_ttft_ms: float | None = None
    notes: list[str] = field(default_factory=list)  # what makes a figure partial or unknown

    def figures(self) -> ServerFigures:
        return ServerFigures(
            kv_usage_peak=self.kv_usage_peak,
            kv_usage_mean=self.kv_usage_mean,
            running_mean=self.running_mean,
            waiting_peak=self.waiting_peak,
            waiting_mean=self.waiting_mean,
            prefix_cache_hit_rate=self.prefix_cache_hit_rate,
            prefix_cache_hits=self.prefix_cache_hits,
            prefix_cache_queries=self.prefix_cache_queries,
            server_mean_ttft_ms=self.server_mean_ttft_ms,
            server_prompt_tokens=self.server_prompt_tokens,
            server_generation_tokens=self.server_generation_tokens,
        )

    def scrape_counts(self) -> ScrapeCounts:
        return ScrapeCounts(
            self.scrapes, self.scrapes_failed, self.scrapes_during_load, self.scrape_errors, self.families
        )

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ServerMetrics:
        """The metrics as ``EndpointPoint.as_json`` writes them; a figure it lacks keeps its empty value."""
        return cls(**{f.name: data[f.name] for f in fields(cls) if f.name in data})


@dataclass(frozen=True)
class CacheReset:
    """Whether the server's prefix cache was emptied before the point's load."""

    asked: bool = False
    reset: bool | None = None  # True: the server confirmed; False: refused or not offered; None: not asked or unknown
    route: str | None = None
    detail: str = "not asked"

    @property
    def state(self) -> str:
        """The prefix cache as the load found it: ``reset`` (emptied, the server confirmed), ``warm`` (not asked:
        earlier points and the warm-up left their blocks) or ``unknown`` (asked, not confirmed)."""
        if self.reset is True:
            return "reset"
        return "unknown" if self.asked else "warm"

    def to_json(self) -> dict[str, Any]:
        return {"asked": self.asked, "reset": self.reset, "route": self.route, "detail": self.detail}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> CacheReset:
        return cls(bool(data.get("asked")), data.get("reset"), data.get("route"), data.get("detail") or "")


NOT_ASKED = CacheReset()


@dataclass(frozen=True)
class Agreement:
    """How the client's figures and the server's line up over a point; each only where both sides measured it."""

    output_tokens_client_over_server: float | None = None
    input_tokens_client_over_server: float | None = None
    mean_ttft_client_minus_server_ms: float | None = None  # the client's includes the network and HTTP

    def tokens_client_over_server(self, kind: str) -> float | None:
        """``kind`` output or input."""
        return self.output_tokens_client_over_server if kind == "output" else self.input_tokens_client_over_server

    def to_json(self) -> dict[str, Any]:
        return {f.name: value for f in fields(self) if (value := getattr(self, f.name)) is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Agreement:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


@dataclass(frozen=True)
class ScrapeCounts:
    """The scrapes of the server's /metrics over a point."""

    scrapes: int | None = None
    scrapes_failed: int | None = None
    scrapes_during_load: int | None = None
    scrape_errors: list[str] | None = None  # the first few distinct errors
    families: list[str] | None = None  # the engines the scrapes recognised (vllm, sglang, kvbench)

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ScrapeCounts:
        """From a point's ``scrapes``, or from the server's metrics of a point (which hold more)."""
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


@dataclass(frozen=True)
class KvEventsSummary:
    """A point's KV event stream: its health, the residency it rebuilt over the load (None where nothing was
    heard), and the resident blocks against what the scrapes said."""

    endpoint: str | None = None
    replay_endpoint: str | None = None
    batches: int | None = None
    events: int | None = None
    lost_batches: int | None = None
    replayed_batches: int | None = None
    malformed: int | None = None
    malformed_reason: str | None = None
    dropped_events: int | None = None
    restarts: int | None = None
    history_complete: bool | None = None
    kv_events_complete: bool | None = None
    kv_blocks_stored: int | None = None
    kv_blocks_removed: int | None = None
    kv_blocks_removed_unknown: int | None = None
    kv_cache_resets: int | None = None
    kv_resident_blocks_end: int | None = None
    kv_resident_blocks_peak: int | None = None
    kv_eviction_churn_per_s: float | None = None
    kv_thrash_window_s: float | None = None
    kv_thrash_share: float | None = None  # removed blocks stored again within the window
    kv_block_lifetime_median_s: float | None = None
    kv_restore_gap_median_s: float | None = None
    resident_minus_server_cached_blocks_max: float | None = None
    resident_minus_server_cached_blocks_at_rest: float | None = None
    resident_share_minus_usage_max: float | None = None
    flag: str | None = None  # what makes the figures partial or absent

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KvEventsSummary:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})


@dataclass(frozen=True)
class TraceFigures:
    """A replayed trace and the hit rate kvbench's simulation of it predicts on the server's KV blocks."""

    source: str | None = None
    requests: int = 0
    duration_s: float | None = None
    trace_block_size: int | None = None
    predicted_hit_rate: float | None = None  # None: the server exposes no block count and size
    predicted_with_more_blocks: list[list[float]] = field(default_factory=list)  # [blocks, hit rate] at 2x, 4x, 8x
    prediction: str | None = None  # how it was predicted, or why not

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TraceFigures:
        return cls(
            data.get("source"),
            data.get("requests") or 0,
            data.get("duration_s"),
            data.get("trace_block_size"),
            data.get("predicted_hit_rate"),
            list(data.get("predicted_with_more_blocks") or []),
            data.get("prediction"),
        )


@dataclass(frozen=True)
class EndpointFigures:
    """A server point's own fields (see the module docstring). The point's figures (completed, throughput,
    latencies) stay the :class:`Point`'s; a point that did not record one of these reads its empty value."""

    endpoint: EndpointTarget
    request_rate: float | None = None  # an open loop's (written only for one); None there: all at once
    server: ServerFigures = ServerFigures()
    failed: int = 0
    stopped: int = 0  # cut by the point's time limit: neither done nor failed
    failed_by_kind: dict[str, int] = field(default_factory=dict)
    failure_examples: list[str] = field(default_factory=list)
    request_goodput: float | None = None  # completed requests/s meeting every objective; None: no SLO
    slo: dict[str, float] | None = None  # objective (ttft, tpot, e2el) -> milliseconds
    cache_reset: CacheReset = NOT_ASKED
    cache_state: str = "warm"  # reset | warm | unknown (CacheReset.state)
    prefix_reuse: PrefixReuse | None = None  # None: not measured ({} in the JSON)
    kv_events: KvEventsSummary | None = None  # None: not listened to
    agreement: Agreement = Agreement()
    server_notes: list[str] = field(default_factory=list)
    scrapes: ScrapeCounts | None = None  # None: the server was not scraped
    max_send_lag_ms: float | None = None
    trace: TraceFigures | None = None  # a replayed trace's (written only then)
    timeline_file: str | None = None  # the run directory's files of the point (written once known)
    requests_file: str | None = None
    kv_events_file: str | None = None
    repeat_files: list[str | None] | None = None  # with --repeat: each run's timeline file

    @property
    def pattern(self) -> str | None:
        return self.endpoint.load.pattern

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {ENDPOINT_FIELD: self.endpoint.to_json()}
        if self.pattern == "open":
            out["request_rate"] = self.request_rate
        out |= self.server.to_json()
        out |= {
            "failed": self.failed,
            "stopped": self.stopped,
            "failed_by_kind": self.failed_by_kind,
            "failure_examples": self.failure_examples,
            "request_goodput": self.request_goodput,
            "slo": self.slo,
            "cache_reset": self.cache_reset.to_json(),
            "cache_state": self.cache_state,
            "prefix_reuse": self.prefix_reuse.to_json() if self.prefix_reuse else {},
            "kv_events": self.kv_events.to_json() if self.kv_events else None,
            "agreement": self.agreement.to_json(),
            "server_notes": self.server_notes,
            "scrapes": self.scrapes.to_json() if self.scrapes else None,
            "max_send_lag_ms": self.max_send_lag_ms,
        }
        if self.trace is not None:
            out["trace"] = self.trace.to_json()
        for name in ("timeline_file", "requests_file", "kv_events_file", "repeat_files"):
            if (value := getattr(self, name)) is not None:
                out[name] = value
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EndpointFigures:
        """From a point's JSON (its other fields ignored); a part that is not an object reads as not recorded."""
        reset, reuse, events = data.get("cache_reset"), data.get("prefix_reuse"), data.get("kv_events")
        agreement, scrapes, trace = data.get("agreement"), data.get("scrapes"), data.get("trace")
        endpoint = data.get(ENDPOINT_FIELD)
        return cls(
            EndpointTarget.from_json(endpoint if isinstance(endpoint, Mapping) else {}),
            data.get("request_rate"),
            ServerFigures.from_json(data),
            data.get("failed") or 0,
            data.get("stopped") or 0,
            dict(data.get("failed_by_kind") or {}),
            list(data.get("failure_examples") or []),
            data.get("request_goodput"),
            data.get("slo"),
            CacheReset.from_json(reset) if isinstance(reset, Mapping) else NOT_ASKED,
            str(data.get("cache_state") or "warm"),
            PrefixReuse.from_json(reuse) if isinstance(reuse, Mapping) and reuse else None,
            KvEventsSummary.from_json(events) if isinstance(events, Mapping) else None,
            Agreement.from_json(agreement) if isinstance(agreement, Mapping) else Agreement(),
            list(data.get("server_notes") or []),
            ScrapeCounts.from_json(scrapes) if isinstance(scrapes, Mapping) else None,
            data.get("max_send_lag_ms"),
            TraceFigures.from_json(trace) if isinstance(trace, Mapping) else None,
            data.get("timeline_file"),
            data.get("requests_file"),
            data.get("kv_events_file"),
            data.get("repeat_files"),
        )

    @classmethod
    def of(cls, point: Point) -> EndpointFigures:
        """A typed point's server fields (kept in its ``extra``)."""
        return cls.from_json(point.extra)

    def store_in(self, point: Point) -> None:
        """Write these fields into ``point``'s extra: a field it holds keeps its place, a new one goes last."""
        point.extra.update(self.to_json())


def is_endpoint_point(point: Point | Mapping[str, Any]) -> bool:
    """Whether a point was measured against a server over HTTP (it has an ``endpoint`` object)."""
    data = point.extra if isinstance(point, Point) else point
    return isinstance(data.get(ENDPOINT_FIELD), Mapping)


def slo_share(point: Point) -> float | None:
    """The share of a point's completed requests meeting every objective (goodput over throughput); None without an
    SLO or a throughput."""
    goodput = EndpointFigures.of(point).request_goodput
    return goodput / point.request_throughput if goodput is not None and point.request_throughput else None


def failure_text(failed: int, completed: int, by_kind: Mapping[str, int], examples: Sequence[str]) -> str:
    """``3 of 20 requests failed: http 2, timeout 1 (e.g. HTTP 500 ...)``."""
    kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(by_kind.items()))
    first = examples[0] if examples else None
    return f"{failed} of {failed + completed} requests failed: {kinds}" + (f" (e.g. {first})" if first else "")
