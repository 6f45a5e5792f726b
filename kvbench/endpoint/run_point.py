"""One point against an endpoint: warm up, reset the prefix cache if asked, put the load on while scraping
``/metrics``, and measure both sides.

The order of a point:

1. ask the server for its model name if none was given (``GET /v1/models``);
2. run the warm-up requests (not counted; closed loop); if every one fails the endpoint is unusable and the
   point stops with the reason (and, when the server refuses ``ignore_eos``, says so);
3. one scrape to learn the server's family, the prefix-cache reset where asked (recorded either way), and the
   scrape before the load (the counters' start);
4. the load, scraped every interval, then the closing scrape (the counters' end);
5. token counts the server did not report, client metrics, server metrics, and how the two agree.

``run_point`` is what a sweep backend calls per point (one ``asyncio.run`` each, or its own event loop).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import aiohttp

from kvbench.endpoint.cache_reset import NOT_ASKED, reset_prefix_cache
from kvbench.endpoint.client import EndpointClient, RequestLimits, Target, list_models, open_session
from kvbench.endpoint.client_metrics import DEFAULT_PERCENTILES, client_metrics
from kvbench.endpoint.conversation import Conversation
from kvbench.endpoint.kv_event_subscriber import KvEventSubscriber, event_figures
from kvbench.endpoint.load import ClosedLoop, LoadPattern, OnRecord, OpenLoop, run_load
from kvbench.endpoint.openai import api_key_from_env, check_key_transport
from kvbench.endpoint.prefix_reuse import prefix_reuse, workload_reuse
from kvbench.endpoint.record import RequestRecord
from kvbench.endpoint.scraper import DEFAULT_INTERVAL_S, MetricsScraper, Scrape
from kvbench.endpoint.server_metrics import point_server_metrics
from kvbench.endpoint.timeline import kv_series, point_timeline
from kvbench.endpoint.tokens import fill_token_counts
from kvbench.endpoint.workloads import HitRateTarget, shaped_to_hit_rate
from kvbench.errors import KvbenchError
from kvbench.measure.kv_events import changes
from kvbench.measure.kv_residency import DEFAULT_THRASH_WINDOW_S, Change
from kvbench.results.client_figures import ClientMetrics
from kvbench.results.endpoint_figures import Agreement, ServerMetrics
from kvbench.results.endpoint_timeline import EndpointTimeline, KvEventSeries
from kvbench.results.prefix_reuse_figures import PrefixReuse, ReuseTarget

STOPPED_KINDS = frozenset({"cancelled", "not_sent"})  # what a point's time limit leaves: in flight, or never sent


class EndpointUnusable(KvbenchError):
    """Every warm-up request failed: the target cannot serve this workload (the reason says why)."""


@dataclass(frozen=True)
class PointSettings:
    pattern: LoadPattern
    warmup: Sequence[Conversation] = ()
    reset_prefix_cache: bool = False
    scrape: bool = True
    scrape_interval_s: float = DEFAULT_INTERVAL_S
    slo: Mapping[str, float] | None = None
    deadline_s: float | None = None  # stop the point after this long; what is left is recorded, not dropped
    limits: RequestLimits = field(default_factory=RequestLimits)
    temperature: float | None = None
    percentiles: Sequence[float] = DEFAULT_PERCENTILES
    thrash_window_s: float = DEFAULT_THRASH_WINDOW_S  # a block stored again this soon after its removal: thrash
    hit_rate: HitRateTarget | None = None  # reshape the prompts to this prefix-cache hit rate, with a prewarm

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scrape_interval_s) and self.scrape_interval_s > 0):
            raise KvbenchError(f"scrape interval must be a positive number of seconds, got {self.scrape_interval_s}")

    @property
    def warmup_concurrency(self) -> int:
        pattern = self.pattern
        if isinstance(pattern, ClosedLoop):
            width = pattern.concurrency
        elif isinstance(pattern, OpenLoop):
            width = pattern.max_concurrency or len(self.warmup)
        else:
            width = len(self.warmup)
        return max(1, min(width, len(self.warmup) or 1))


@dataclass
class EndpointPoint:
    """A measured point: client and server figures, and the records and scrapes behind them."""

    target: dict[str, Any]
    model: str
    load: dict[str, Any]
    metrics: ClientMetrics
    server: ServerMetrics | None  # None: not scraped
    cache_reset: dict[str, Any]
    warmup: dict[str, Any]
    duration_s: float
    peak_in_flight: int
    max_send_lag_ms: float
    stopped_at_deadline: bool
    agreement: Agreement
    records: list[RequestRecord] = field(repr=False, default_factory=list)
    scrapes: list[Scrape] = field(repr=False, default_factory=list)
    origin: float = 0.0
    scrape_interval_s: float = DEFAULT_INTERVAL_S
    reuse: PrefixReuse | None = None  # per-request cached tokens against the counters
    kv_events: dict[str, Any] | None = None  # the KV event stream's figures; None: not listened to
    kv_changes: list[Change] = field(repr=False, default_factory=list)  # the stream's events, compact
    wall_origin: float = 0.0  # Unix seconds at ``origin`` (the events are stamped on that clock)

    @property
    def status(self) -> str:
        """``ok`` when every request completed, ``failed`` when some did not (the run must say so)."""
        return "ok" if self.metrics.failed == 0 else "failed"

    def as_json(self) -> dict[str, Any]:
        return {
            "status": self.status,
            "target": self.target,
            "model": self.model,
            "load": self.load,
            "duration_s": self.duration_s,
            "peak_in_flight": self.peak_in_flight,
            "max_send_lag_ms": self.max_send_lag_ms,
            "stopped_at_deadline": self.stopped_at_deadline,
            "warmup": self.warmup,
            "cache_reset": self.cache_reset,
            "metrics": self.metrics.to_json(),
            "server": self.server.to_json() if self.server else None,
            "agreement": self.agreement.to_json(),
            "reuse": self.reuse.to_json() if self.reuse else {},
            "kv_events": self.kv_events,
        }

    def timeline(self, bin_s: float | None = None) -> EndpointTimeline:
        width = bin_s or self.scrape_interval_s
        timeline = EndpointTimeline.from_json(
            point_timeline(
                self.records,
                self.scrapes,
                self.origin,
                self.duration_s,
                width,
                {"target": self.target, "load": self.load},
            )
        )
        if self.kv_events is None:
            return timeline
        series = kv_series(self.kv_changes, self.wall_origin, self.duration_s, width)
        return replace(timeline, kv_events=KvEventSeries.from_json(series))


async def run_point(
    target: Target,
    conversations: Sequence[Conversation],
    settings: PointSettings,
    tokenizer: Any | None = None,
    on_record: OnRecord | None = None,
) -> EndpointPoint:
    """Measure one point (see the module docstring)."""
    if target.api == "chat" and any(c.token_ids for c in [*conversations, *settings.warmup]):
        raise KvbenchError(
            "the chat API takes text, and these prompts are token ids: use the completions API, or text prompts"
        )
    api_key = api_key_from_env(target.api_key_env)
    check_key_transport(target.url, api_key)
    async with open_session(settings.limits) as session:
        model = target.model or await _first_model(session, target, api_key)
        client = EndpointClient(target, model, session, settings.limits, api_key, settings.temperature)
        listener = None
        if target.kv_events is not None:  # from before the warm-up, so the blocks it stores are known
            subscriber = KvEventSubscriber(target.kv_events, target.kv_events_replay, bind=target.kv_events_bind)
            try:
                listener = await asyncio.to_thread(subscriber.start)
            except OSError as err:
                raise KvbenchError(str(err)) from None
        warmup = await _warm_up(client, settings)
        scraper = (
            MetricsScraper(session, target.scrape_url, time.perf_counter(), settings.scrape_interval_s)
            if settings.scrape
            else None
        )
        family = None
        block_size = None
        if scraper is not None:
            first = await scraper.scrape()
            family = next((s.family for s in first.states), None)
            block_size = next((s.block_size for s in first.states if s.block_size), None)
        target_plan = None
        prewarm: list[Conversation] = []
        if settings.hit_rate is not None:
            if not block_size:
                raise KvbenchError(
                    f"{target.scrape_url} does not give the server's KV block size, which a target hit rate is "
                    "shaped in (vLLM: cache_config_info; kvbench serve: kvbench_kv_cache_block_size)"
                )
            conversations, prewarm, planned = shaped_to_hit_rate(conversations, settings.hit_rate, block_size)
            target_plan = ReuseTarget(settings.hit_rate.rate, planned, block_size)
        reset = NOT_ASKED
        if settings.reset_prefix_cache:
            reset = await reset_prefix_cache(session, target.url, family, api_key)
        if prewarm:  # after the reset, before the counters start: its blocks are stored, its tokens uncounted
            warmed = await run_load(prewarm, ClosedLoop(1), client.send)
            failed = [r for r in warmed.records if not r.ok]
            if failed:
                raise EndpointUnusable(f"the prewarm request failed ({failed[0].reason()})")
        if scraper is not None:
            await scraper.settled_scrape()  # the counters' start (the warm-up's counted in full)
            scraper.start()
        wall_at_start = time.time() - time.perf_counter()  # our Unix clock minus perf_counter
        try:
            load = await run_load(conversations, settings.pattern, client.send, settings.deadline_s, on_record)
        except BaseException:
            if scraper is not None:
                await scraper.cancel()
            if listener is not None:
                await asyncio.to_thread(listener.stop)
            raise
        scrapes: list[Scrape] = []
        if scraper is not None:
            await scraper.stop()
            scraper.restart_clock(load.started)
            scrapes = scraper.scrapes
        event_log = await asyncio.to_thread(listener.stop) if listener is not None else None
    fill_token_counts(load.records, tokenizer)
    cut = STOPPED_KINDS if load.stopped_at_deadline else frozenset()  # the time limit asked for, not a failure
    measured = client_metrics(load.records, load.duration_s, settings.slo, settings.percentiles, cut)
    metrics = ClientMetrics.from_json(measured)
    server = point_server_metrics(scrapes, load.duration_s) if scraper is not None else None
    described = target.describe() | {"model": model}
    kv_changes = changes(event_log) if event_log is not None else []
    kv_figures = None
    if event_log is not None:
        kv_figures = event_figures(
            event_log,
            kv_changes,
            settings.thrash_window_s,
            load.started + wall_at_start,
            load.duration_s,
            [(s.elapsed_s + load.started + wall_at_start, s.states) for s in scrapes if s.error is None],
        )
    return EndpointPoint(
        described,
        model,
        settings.pattern.describe(),
        metrics,
        server,
        reset,
        warmup,
        load.duration_s,
        load.peak_in_flight,
        load.max_send_lag_s * 1000.0,
        load.stopped_at_deadline,
        agreement(metrics, server),
        load.records,
        scrapes,
        load.started,
        settings.scrape_interval_s,
        replace(
            prefix_reuse(load.records, server, target_plan),
            workload=workload_reuse(conversations, server.block_size if server else None, prewarm),
        ),
        kv_figures,
        kv_changes,
        load.started + wall_at_start,
    )


def run_point_sync(
    target: Target,
    conversations: Sequence[Conversation],
    settings: PointSettings,
    tokenizer: Any | None = None,
    on_record: OnRecord | None = None,
) -> EndpointPoint:
    return asyncio.run(run_point(target, conversations, settings, tokenizer, on_record))


async def _first_model(session: aiohttp.ClientSession, target: Target, api_key: str | None) -> str:
    names = await list_models(session, target, api_key)
    if not names:
        raise KvbenchError(f"{target.url}/v1/models lists no model; name the model to request")
    return names[0]


async def _warm_up(client: EndpointClient, settings: PointSettings) -> dict[str, Any]:
    if not settings.warmup:
        return {"requests": 0, "completed": 0, "failed": 0, "failures": []}
    result = await run_load(settings.warmup, ClosedLoop(settings.warmup_concurrency), client.send)
    done = [r for r in result.records if r.ok]
    failed = [r for r in result.records if not r.ok]
    summary = {
        "requests": len(result.records),
        "completed": len(done),
        "failed": len(failed),
        "failures": sorted({r.reason() for r in failed})[:3],
    }
    if not done:
        raise EndpointUnusable(await _why_unusable(client, settings.warmup[0], failed[0]))
    return summary


async def _why_unusable(client: EndpointClient, conversation: Conversation, failure: RequestRecord) -> str:
    """The reason every warm-up request failed; when the server refused a request with ignore_eos and takes the
    same request without it, that is the reason."""
    base = f"{client.target.endpoint}: every warm-up request failed ({failure.reason()})"
    first = conversation.turns[0]
    if first.ignore_eos and failure.error_kind == "http" and failure.status in (400, 422):
        plain = replace(conversation, turns=(replace(first, ignore_eos=False),))
        retry = await client.send(plain, 0, [])
        if retry.ok:
            return (
                f"{client.target.endpoint} refuses ignore_eos ({failure.reason()}); it serves the request without "
                "it, so outputs cannot be held to their reference lengths there"
            )
    return base


def agreement(client: ClientMetrics, server: ServerMetrics | None) -> Agreement:
    """How the client's figures and the server's own line up over the point: output and prompt tokens the
    client counted (from ``usage``) against the tokens the server generated and prefilled, and the client's mean
    TTFT against the server's (the client's includes the network and the HTTP layer, so it is the larger)."""
    if not server:
        return Agreement()

    def ratio(client_tokens: float | None, server_tokens: float | None) -> float | None:
        if client_tokens and server_tokens and not client.failed:  # a failed request's tokens: server only
            return client_tokens / server_tokens
        return None

    client_ttft, server_ttft = client.latency("mean_ttft_ms"), server.server_mean_ttft_ms
    return Agreement(
        ratio(client.total_output_tokens, server.server_generation_tokens),
        ratio(client.total_input_tokens, server.server_prompt_tokens),
        client_ttft - server_ttft if client_ttft is not None and server_ttft is not None else None,
    )


__all__ = [
    "ClosedLoop",
    "EndpointPoint",
    "EndpointUnusable",
    "OpenLoop",
    "PointSettings",
    "run_point",
    "run_point_sync",
]
