"""What a server's own metrics say about one point, from the scrapes taken beside its load.

Gauges (KV usage, running and waiting requests) are summed over the engines the endpoint exposes (data-parallel
vLLM has one per engine; KV usage is the share of all their blocks in use when their sizes are known, else the
mean of their shares) and summarised over the scrapes taken while the load ran: peak and mean (scrapes are
evenly spaced, so the mean is a time average). Counters (preemptions, prefix-cache queries and hits, prompt
and generated tokens, the TTFT histogram's sum and count) are differences between the last scrape before the
load and the closing scrape after it, so they cover exactly the point, whatever the server did before
(vLLM #52884: a cache warmed by earlier runs). A counter that went down means the server restarted: its
difference is unknown, not negative. A server that does not expose a quantity leaves it None.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvbench.endpoint.scraper import Scrape
from kvbench.results.endpoint_figures import ServerMetrics
from kvbench.results.servers import ServerState

COUNTERS = (
    "preemptions",
    "prefix_queries",
    "prefix_hits",
    "prompt_tokens",
    "generation_tokens",
    "ttft_sum_s",
    "ttft_count",
    "finished",
)


def _total(states: Sequence[ServerState], name: str) -> float | None:
    values = [getattr(s, name) for s in states]
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def kv_usage(states: Sequence[ServerState]) -> float | None:
    """The share of the endpoint's KV blocks in use at one scrape."""
    known = [(s.usage, s.total_blocks) for s in states if s.usage is not None]
    if not known:
        return None
    sized = [(usage, blocks) for usage, blocks in known if blocks]
    if len(sized) == len(known):  # every instance says how many blocks it has: weigh by them
        return sum(usage * blocks for usage, blocks in sized) / sum(blocks for _, blocks in sized)
    return sum(usage for usage, _ in known) / len(known)


def _series(scrapes: Sequence[Scrape], value: Callable[[list[ServerState]], float | None]) -> list[float]:
    return [v for s in scrapes if s.error is None and (v := value(s.states)) is not None]


def point_server_metrics(scrapes: Sequence[Scrape], load_end_s: float) -> ServerMetrics:
    """The per-point figures (see the module docstring) from every scrape of the point; the load ran from 0 to
    ``load_end_s`` seconds."""
    ok = [s for s in scrapes if s.error is None]
    during = [s for s in ok if 0.0 <= s.elapsed_s <= load_end_s]
    before = [s for s in ok if s.elapsed_s < 0.0]
    after = [s for s in ok if s.elapsed_s > load_end_s]
    kv = _series(during, kv_usage)
    running = _series(during, lambda st: _total(st, "running"))
    waiting = _series(during, lambda st: _total(st, "waiting"))
    sizes = [state.block_size for s in ok for state in s.states if state.block_size]
    # counters: the last scrape before the load (else the first one during it) to the closing one
    first = before[-1] if before else (during[0] if during else None)
    last = after[-1] if after else (during[-1] if during else None)
    notes: list[str] = []
    deltas: dict[str, float | None] = dict.fromkeys(COUNTERS)
    window: float | None = None
    if first is None or last is None or first is last:
        notes.append("too few successful scrapes to difference the counters")
    else:
        if not before:
            notes.append("no scrape before the load: counters start at the first scrape during it")
        if not after:
            notes.append("no scrape after the load: counters end at the last scrape during it")
        for name in COUNTERS:
            a, b = _total(first.states, name), _total(last.states, name)
            if a is not None and b is not None and b < a:
                notes.append(f"{name} went down during the point (the server restarted?): its difference is unknown")
            elif a is not None and b is not None:
                deltas[name] = b - a
        window = last.elapsed_s - first.elapsed_s
    queries, hits = deltas["prefix_queries"], deltas["prefix_hits"]
    hit_rate = hits / queries if queries and hits is not None else None
    if hit_rate is None:  # SGLang reports a rate of its own, not the counters
        rates = _series(during, lambda st: _mean_of(st, "prefix_hit_rate"))
        if rates:
            hit_rate = sum(rates) / len(rates)
            notes.append("prefix-cache hit rate as the server reports it (mean of its gauge), not counted")
    count, total = deltas["ttft_count"], deltas["ttft_sum_s"]
    return ServerMetrics(
        scrapes=len(scrapes),
        scrapes_failed=len(scrapes) - len(ok),
        scrape_errors=sorted({s.error for s in scrapes if s.error is not None})[:3],
        families=sorted({state.family for s in ok for state in s.states}),
        engines=sorted({state.source for s in ok for state in s.states}),
        kv_usage_peak=max(kv) if kv else None,
        kv_usage_mean=_mean(kv),
        running_peak=max(running) if running else None,
        running_mean=_mean(running),
        waiting_peak=max(waiting) if waiting else None,
        waiting_mean=_mean(waiting),
        scrapes_during_load=len(during),
        block_size=int(sizes[-1]) if sizes else None,
        counters_window_s=window,
        preemptions=deltas["preemptions"],
        prefix_cache_queries=queries,
        prefix_cache_hits=hits,
        prefix_cache_hit_rate=hit_rate,
        server_prompt_tokens=deltas["prompt_tokens"],
        server_generation_tokens=deltas["generation_tokens"],
        server_finished=deltas["finished"],
        server_ttft_count=count,
        server_mean_ttft_ms=total / count * 1000.0 if count and total is not None else None,
        notes=notes,
    )


def _mean(series: list[float]) -> float | None:
    return sum(series) / len(series) if series else None


def _mean_of(states: Sequence[ServerState], name: str) -> float | None:
    values = [getattr(s, name) for s in states if getattr(s, name) is not None]
    return sum(values) / len(values) if values else None


def timeline_rows(scrapes: Sequence[Scrape]) -> list[dict[str, Any]]:
    """One compact row per scrape for plotting: KV usage, running, waiting, and the counters so far."""
    rows = []
    for scrape in scrapes:
        if scrape.error is not None:
            rows.append({"elapsed_s": scrape.elapsed_s, "error": scrape.error})
            continue
        states = scrape.states
        rows.append(
            {
                "elapsed_s": scrape.elapsed_s,
                "kv_usage": kv_usage(states),
                "total_blocks": _total(states, "total_blocks"),
                "running": _total(states, "running"),
                "waiting": _total(states, "waiting"),
                "preemptions": _total(states, "preemptions"),
                "prefix_queries": _total(states, "prefix_queries"),
                "prefix_hits": _total(states, "prefix_hits"),
                "generation_tokens": _total(states, "generation_tokens"),
            }
        )
    return rows
