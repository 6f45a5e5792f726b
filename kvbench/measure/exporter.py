"""Live Prometheus metrics of a running engine, on an HTTP endpoint and/or in a text file.

``KvMetrics`` owns its own ``CollectorRegistry`` (never the process-global one), labels every series by
``engine`` and ``device`` (the names are listed in docs/ARCHITECTURE.md), and is fed from the engine's step hook::

    metrics = KvMetrics(device="cpu")
    metrics.serve("127.0.0.1", 9400)              # optional: http://127.0.0.1:9400/metrics
    engine.alloc_observer = metrics.alloc_observer("paged")
    metrics.begin_run("paged")
    engine.run(requests, concurrency, on_step=metrics.on_step)
    final = metrics.end_run("paged")              # this run's final values, for the results
    metrics.write_textfile("metrics.prom")

Allocation latency is timed only between ``begin_run`` and ``end_run`` (warm-up runs stay out of it).
"""

from __future__ import annotations

import errno
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from kvbench.errors import KvbenchError
from kvbench.fileio import write_text_atomic
from kvbench.measure.metric_names import (
    ALLOC_LATENCY,
    BLOCK_SIZE,
    BLOCKS_CAPACITY,
    BLOCKS_FREE,
    BLOCKS_USED,
    CACHED_BLOCKS,
    FINISHED,
    FLEET_INSTANCES,
    FRAGMENTATION,
    GENERATED_TOKENS,
    PREEMPTIONS,
    PREFIX_HITS,
    PREFIX_QUERIES,
    PROMPT_TOKENS,
    RUNNING,
    STEP_SECONDS,
    STEP_TOKENS,
    STEPS,
    WAITING,
)

if TYPE_CHECKING:
    import threading
    from wsgiref.simple_server import WSGIServer

# seconds: 1 µs .. 100 ms, with 50 ms (the article's alert threshold) on a bucket edge
ALLOC_LATENCY_BUCKETS = (
    1e-6,
    2.5e-6,
    5e-6,
    1e-5,
    2.5e-5,
    5e-5,
    1e-4,
    2.5e-4,
    5e-4,
    1e-3,
    2.5e-3,
    5e-3,
    1e-2,
    2.5e-2,
    5e-2,
    0.1,
    math.inf,
)
LABELS = ("engine", "device")
DEFAULT_HOST = "127.0.0.1"


def online_fragmentation(used_slots: int, allocated_slots: int) -> float:
    """The live figure (docs/ARCHITECTURE.md): 1 - used / allocated (0 when nothing is allocated), clamped to [0, 1]."""
    if allocated_slots <= 0:
        return 0.0
    return min(1.0, max(0.0, 1.0 - used_slots / allocated_slots))


def written_slots(request) -> int:
    """Token states a running request has written: prompt + outputs - 1 (the last sample is not fed back)."""
    return request.prompt_len + max(len(request.output_token_ids), 1) - 1


def quantile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank quantile of already sorted values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


@dataclass(frozen=True)
class _Gauges:
    """The gauges' values at the run's last step."""

    blocks_used: int
    blocks_free: int
    blocks_total: int
    fragmentation: float
    running: int
    waiting: int


@dataclass
class _Run:
    """Per-run state: counters are deltas of the scheduler's own totals; peaks for the results."""

    scheduler: Any = None
    preemptions: int = 0
    tokens: int = 0
    finished: int = 0
    finished_tokens: int = 0
    prompt_tokens: int = 0
    finished_prompt_tokens: int = 0
    prefix_queries: int = 0
    prefix_hits: int = 0
    steps: int = 0
    last: _Gauges | None = None  # None until the first step
    blocks_used_peak: int = 0
    blocks_free_min: int | None = None
    fragmentation_max: float = 0.0
    alloc_seconds: list[float] = field(default_factory=list)


def _prefilled(request) -> int:
    """A request's prompt tokens once its prefill is done (its first token out), counted once: a sample forked
    from a parent shares the parent's prefill."""
    if not request.output_token_ids or request.parent_id is not None:
        return 0
    return request.prompt_len


class MetricsEndpoint:
    """What :class:`KvMetrics` and :class:`FleetMetrics` share: their registry exposed as text, in a file or
    served on ``/metrics``."""

    registry: CollectorRegistry
    _server: WSGIServer | None
    _thread: threading.Thread | None
    host: str | None
    port: int | None

    # -- exposing ---------------------------------------------------------------------------------------
    def exposition(self) -> str:
        """The Prometheus text exposition format of every series now."""
        return generate_latest(self.registry).decode("utf-8")

    def write_textfile(self, path: str | Path) -> Path:
        """Write the exposition text atomically (node_exporter textfile collector, CI artefacts)."""
        return write_text_atomic(path, self.exposition())

    def serve(self, host: str = DEFAULT_HOST, port: int = 0) -> int:
        """Serve ``/metrics`` on a daemon thread; returns the bound port (``port=0`` picks a free one)."""
        from prometheus_client import start_http_server

        if not 0 <= port <= 65535:
            raise KvbenchError(f"a metrics port must be between 0 and 65535, got {port}")
        try:
            self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as err:
            if err.errno == errno.EADDRINUSE:
                raise KvbenchError(f"metrics port {port} on {host} is already in use") from None
            raise KvbenchError(f"cannot serve metrics on {host}:{port}: {err.strerror or err}") from None
        self.host = host
        self.port = int(self._server.server_address[1])
        return self.port

    @property
    def url(self) -> str | None:
        if self.port is None:
            return None
        host = f"[{self.host}]" if self.host and ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def close(self) -> None:
        """Stop the endpoint (if serving) and free its port."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            if self._thread is not None:
                self._thread.join(timeout=2.0)
        self._server = self._thread = None


class KvMetrics(MetricsEndpoint):
    """Prometheus gauges, counters and a histogram for one or more engines on one device."""

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.blocks_used = Gauge(BLOCKS_USED, "KV cache blocks held by live requests.", LABELS, registry=r)
        self.blocks_free = Gauge(BLOCKS_FREE, "KV cache blocks in the free queue.", LABELS, registry=r)
        self.blocks_capacity = Gauge(BLOCKS_CAPACITY, "KV cache blocks in the pool.", LABELS, registry=r)
        self.block_size = Gauge(BLOCK_SIZE, "Tokens per KV cache block.", LABELS, registry=r)
        self.fragmentation = Gauge(
            FRAGMENTATION, "Online KV fragmentation: 1 - used slots / allocated slots.", LABELS, registry=r
        )
        self.preemptions = Counter(PREEMPTIONS, "Requests preempted (recompute) so far.", LABELS, registry=r)
        self.generated = Counter(GENERATED_TOKENS, "Output tokens generated so far.", LABELS, registry=r)
        self.prompt = Counter(
            PROMPT_TOKENS,
            "Prompt tokens of requests whose prefill finished (their first token out).",
            LABELS,
            registry=r,
        )
        self.finished = Counter(FINISHED, "Requests finished so far.", LABELS, registry=r)
        self.running = Gauge(RUNNING, "Requests running (holding KV blocks).", LABELS, registry=r)
        self.waiting = Gauge(WAITING, "Requests waiting for admission.", LABELS, registry=r)
        self.cached_blocks = Gauge(
            CACHED_BLOCKS, "KV blocks whose content the prefix cache can hand out.", LABELS, registry=r
        )
        self.prefix_queries = Counter(
            PREFIX_QUERIES, "Prompt tokens looked up in the prefix cache at admission.", LABELS, registry=r
        )
        self.prefix_hits = Counter(PREFIX_HITS, "Prompt tokens the prefix cache held the KV of.", LABELS, registry=r)
        # a server's engine loop (kvbench serve feeds them; an in-process run has no loop of its own to time)
        self.steps = Counter(STEPS, "Engine steps so far, by phase.", (*LABELS, "phase"), registry=r)
        self.step_seconds = Counter(
            STEP_SECONDS,
            "Wall seconds of the engine's steps, by phase (the loop's own work included).",
            (*LABELS, "phase"),
            registry=r,
        )
        self.step_tokens = Counter(
            STEP_TOKENS,
            "Tokens the engine's steps computed, by phase (prefill: those not in the prefix cache).",
            (*LABELS, "phase"),
            registry=r,
        )
        self.alloc_latency = Histogram(
            ALLOC_LATENCY,
            "Seconds per KV block allocation call (admission or growth).",
            LABELS,
            buckets=ALLOC_LATENCY_BUCKETS,
            registry=r,
        )
        self._runs: dict[str, _Run] = {}
        self._recording: set[str] = set()
        self._server = None
        self._thread = None
        self.host = None
        self.port = None

    # -- feeding ----------------------------------------------------------------------------------------
    def begin_run(self, engine: str) -> None:
        """Start a run of ``engine``: fresh per-run state; allocation latency is recorded from now on."""
        self._runs[engine] = _Run()
        self._recording.add(engine)

    def end_run(self, engine: str) -> dict[str, Any]:
        """Stop recording ``engine``'s allocations; its run's final values (results ``metrics`` dict)."""
        self._recording.discard(engine)
        return self.run_values(engine)

    def alloc_observer(self, engine: str, keep_samples: bool = True) -> Callable[[float], None]:
        """A callable for ``Scheduler.alloc_observer`` / ``LLMEngine.alloc_observer``; without
        ``keep_samples`` (a server) only the histogram counts, so memory does not grow with the run."""
        child = self.alloc_latency.labels(engine, self.device)

        def observe(seconds: float) -> None:
            if engine in self._recording:
                child.observe(seconds)
                if keep_samples:
                    self._runs[engine].alloc_seconds.append(seconds)

        return observe

    def on_step(self, engine: str, scheduler, finished_count: int = 0) -> None:
        """The engine's ``on_step(engine_name, scheduler, finished_count)`` signature."""
        self.observe(engine, scheduler)

    def observe(self, engine: str, scheduler, clock: int | None = None) -> None:
        """Read the scheduler and its pool now. Without ``clock``, token states come from the requests' tokens."""
        if scheduler is None:  # the simulator reports only its end
            return
        run = self._runs.get(engine)
        if run is None:
            run = self._runs[engine] = _Run()
        if run.scheduler is not scheduler:  # a new run of the engine: its scheduler counts from zero
            run.scheduler, run.preemptions, run.tokens, run.finished, run.finished_tokens = scheduler, 0, 0, 0, 0
            run.prompt_tokens = run.finished_prompt_tokens = run.prefix_queries = run.prefix_hits = 0
        labels = (engine, self.device)
        if clock is not None:
            used = scheduler.used_slots(clock)
        else:
            used = sum(written_slots(r) for r in scheduler.running.values())
        self._set_state(run, labels, scheduler, used)
        finished = scheduler.finished
        for request in finished[run.finished :]:
            run.finished_tokens += len(request.output_token_ids)
            run.finished_prompt_tokens += _prefilled(request)
        self.finished.labels(*labels).inc(len(finished) - run.finished)
        run.finished = len(finished)
        tokens, prompt = run.finished_tokens, run.finished_prompt_tokens
        for request in (*scheduler.running.values(), *scheduler.waiting):  # one pass over the live requests
            tokens += len(request.output_token_ids)
            prompt += _prefilled(request)
        self.generated.labels(*labels).inc(max(0, tokens - run.tokens))
        run.tokens = max(run.tokens, tokens)
        self.prompt.labels(*labels).inc(max(0, prompt - run.prompt_tokens))
        run.prompt_tokens = max(run.prompt_tokens, prompt)

    def _set_state(self, run: _Run, labels: tuple[str, str], scheduler, used: int) -> None:
        """The gauges, the preemption counter and the run's peaks, from the scheduler and its pool."""
        pool = scheduler.manager.pool
        used_blocks, free_blocks, total_blocks = pool.num_used, pool.num_free, pool.num_blocks
        fragmentation = online_fragmentation(used, scheduler.held_slots())
        self.blocks_used.labels(*labels).set(used_blocks)
        self.blocks_free.labels(*labels).set(free_blocks)
        self.blocks_capacity.labels(*labels).set(total_blocks)
        self.block_size.labels(*labels).set(pool.block_size)
        self.fragmentation.labels(*labels).set(fragmentation)
        self.running.labels(*labels).set(len(scheduler.running))
        self.waiting.labels(*labels).set(len(scheduler.waiting))
        self.preemptions.labels(*labels).inc(max(0, scheduler.num_preemptions - run.preemptions))
        run.preemptions = max(run.preemptions, scheduler.num_preemptions)
        manager = scheduler.manager
        if manager.enable_prefix_caching:
            self.cached_blocks.labels(*labels).set(manager.num_cached_blocks)
            self.prefix_queries.labels(*labels).inc(max(0, scheduler.prefill_tokens - run.prefix_queries))
            run.prefix_queries = max(run.prefix_queries, scheduler.prefill_tokens)
            self.prefix_hits.labels(*labels).inc(max(0, scheduler.cached_tokens - run.prefix_hits))
            run.prefix_hits = max(run.prefix_hits, scheduler.cached_tokens)
        run.steps += 1
        run.blocks_used_peak = max(run.blocks_used_peak, used_blocks)
        run.blocks_free_min = free_blocks if run.blocks_free_min is None else min(run.blocks_free_min, free_blocks)
        run.fragmentation_max = max(run.fragmentation_max, fragmentation)
        run.last = _Gauges(
            used_blocks, free_blocks, total_blocks, fragmentation, len(scheduler.running), len(scheduler.waiting)
        )

    def run_values(self, engine: str) -> dict[str, Any]:
        """The run's final gauge values, its counter increments and its peaks (results ``metrics`` dict)."""
        run = self._runs.get(engine) or _Run()
        latencies = sorted(run.alloc_seconds)
        last = run.last
        return {
            "kv_cache_blocks_used": last.blocks_used if last else None,
            "kv_cache_blocks_free": last.blocks_free if last else None,
            "kv_cache_blocks_total": last.blocks_total if last else None,
            "kv_cache_fragmentation": last.fragmentation if last else None,
            "requests_running": last.running if last else None,
            "requests_waiting": last.waiting if last else None,
            "num_preemptions": run.preemptions,
            "generated_tokens": run.tokens,
            "prompt_tokens": run.prompt_tokens,
            "requests_finished": run.finished,
            "kv_cache_blocks_used_peak": run.blocks_used_peak if run.steps else None,
            "kv_cache_blocks_free_min": run.blocks_free_min,
            "kv_cache_fragmentation_max": run.fragmentation_max if run.steps else None,
            "block_alloc_count": len(latencies),
            "block_alloc_latency_p50_seconds": quantile(latencies, 0.50),
            "block_alloc_latency_p99_seconds": quantile(latencies, 0.99),
            "block_alloc_latency_max_seconds": latencies[-1] if latencies else None,
            "steps_observed": run.steps,
        }

    def __enter__(self) -> KvMetrics:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


FLEET_LABELS = ("engine", "device", "instance")


class FleetMetrics(MetricsEndpoint):
    """A fleet's live metrics: the engine series of :class:`KvMetrics` with an ``instance`` label, fed from
    the instances' reports, and the number of instances serving and starting.

    Prometheus attaches its own ``instance`` label (the scrape target) on ingestion; keep this one by setting
    ``honor_labels: true`` on the scrape job, or Prometheus renames it ``exported_instance``.
    """

    def __init__(self, engine: str, device: str = "cpu") -> None:
        self.engine = engine
        self.device = device
        self.registry = CollectorRegistry(auto_describe=True)
        r, labels = self.registry, FLEET_LABELS
        self.blocks_used = Gauge(BLOCKS_USED, "KV cache blocks held by live requests.", labels, registry=r)
        self.blocks_free = Gauge(BLOCKS_FREE, "KV cache blocks in the free queue.", labels, registry=r)
        self.blocks_capacity = Gauge(BLOCKS_CAPACITY, "KV cache blocks in the pool.", labels, registry=r)
        self.running = Gauge(RUNNING, "Requests running (holding KV blocks).", labels, registry=r)
        self.waiting = Gauge(WAITING, "Requests waiting for admission.", labels, registry=r)
        self.preemptions = Counter(PREEMPTIONS, "Requests preempted (recompute) so far.", labels, registry=r)
        self.finished = Counter(FINISHED, "Requests finished so far.", labels, registry=r)
        self.instances = Gauge(FLEET_INSTANCES, "Fleet instances by state.", ("engine", "state"), registry=r)
        self._last: dict[int, tuple[int, int]] = {}  # instance -> (preemptions, finished) already counted
        self._server = None
        self._thread = None
        self.host = None
        self.port = None

    def begin_policy(self, policy: str) -> None:
        """Each policy's instances count from zero again (their sessions are fresh)."""
        self._last.clear()

    def observe_instance(self, index: int, stats) -> None:
        labels = (self.engine, self.device, str(index))
        self.blocks_used.labels(*labels).set(stats.used_blocks)
        self.blocks_free.labels(*labels).set(stats.free_blocks)
        self.blocks_capacity.labels(*labels).set(stats.total_blocks)
        self.running.labels(*labels).set(stats.running)
        self.waiting.labels(*labels).set(stats.waiting)
        preempted, finished = self._last.get(index, (0, 0))
        self.preemptions.labels(*labels).inc(max(0, stats.preemptions - preempted))
        self.finished.labels(*labels).inc(max(0, stats.finished - finished))
        self._last[index] = (max(preempted, stats.preemptions), max(finished, stats.finished))

    def observe_fleet(self, serving: int, starting: int) -> None:
        self.instances.labels(self.engine, "serving").set(serving)
        self.instances.labels(self.engine, "starting").set(starting)
