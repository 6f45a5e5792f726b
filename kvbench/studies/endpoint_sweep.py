"""The points of ``sweep --target``: every target at every load level, or ``--find-max``'s search per target.

A level is a concurrency (closed loop: C requests in flight) or, with ``--rate``, a request rate (open loop;
its points have concurrency 0 and ``request_rate`` set). Targets run one after another at each level, so each
server has the machine to itself. Each point is appended to ``results.jsonl`` as it finishes (with ``--repeat K``,
the K runs combined: means with their spread, the server's peaks as the maximum, every failure counted), with its
timeline (``timeline-<target>-c<C>.json``: client tok/s and the server's KV usage on one time axis) and its
scrapes in ``kvbench watch``'s format (``watch-<target>-c<C>.jsonl``: ``kvbench diagnose FILE`` reads it).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from kvbench.endpoint.load import ClosedLoop, LoadPattern, OpenLoop, TraceLoop
from kvbench.endpoint.run_point import EndpointPoint
from kvbench.endpoint.scraper import Scrape
from kvbench.endpoint.sweep_point import combine_repeats, sweep_point
from kvbench.endpoint.timeline import write_point_timeline, write_watch_timeline
from kvbench.fileio import append_jsonl, json_text, write_text_atomic
from kvbench.measure.kv_residency import kv_events_text
from kvbench.results.endpoint_figures import EndpointFigures, TraceFigures
from kvbench.results.find_max_search import Search
from kvbench.results.point import Point
from kvbench.studies.backends.endpoint import EndpointBackend
from kvbench.studies.find_max import find_max
from kvbench.studies.run_options import EndpointOptions
from kvbench.studies.sweep_setup import SweepSetup
from kvbench.studies.trace_prediction import trace_replay_figures


@dataclass(frozen=True)
class Level:
    """One load level: a concurrency, a rate (requests/s) with concurrency 0, or a trace at its own times."""

    concurrency: int
    rate: float | None = None
    trace: bool = False

    def pattern(self, options: EndpointOptions, seed: int) -> LoadPattern:
        if self.trace:
            return TraceLoop()
        if self.rate is None:
            return ClosedLoop(self.concurrency)
        return OpenLoop(self.rate, options.burstiness, options.max_concurrency, seed)

    @property
    def label(self) -> str:
        if self.trace:
            return "trace"
        return f"C={self.concurrency}" if self.rate is None else f"{self.rate:g} req/s"

    @property
    def tag(self) -> str:
        """How file names carry the level: ``c8``, ``r2.5``, ``trace``."""
        if self.trace:
            return "trace"
        return f"c{self.concurrency}" if self.rate is None else f"r{self.rate:g}"


def file_name(engine: str) -> str:
    """A target's name as it goes into a file name."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", engine)


class EndpointProgress(Protocol):
    """What the sweep tells its user: a bar per point (requests done), a line per finished point."""

    def start(self, engine: str, level: Level, total: int) -> Callable[[Any], None]: ...

    def done(self, point: Point) -> None:
        """A finished point."""

    def close(self) -> None:
        """The sweep ended (however it ended)."""


class NoProgress:
    """Progress nobody watches (the library's default)."""

    def start(self, engine: str, level: Level, total: int) -> Callable[[Any], None]:
        return lambda record: None

    def done(self, point: Point) -> None:
        pass

    def close(self) -> None:
        pass


@dataclass
class EndpointRun:
    points: list[dict[str, Any]] = field(default_factory=list)
    searches: list[Search] = field(default_factory=list)


def endpoint_backend(setup: SweepSetup) -> EndpointBackend:
    """The run's endpoint backend (the provider behind the routed backend)."""
    backend = getattr(setup.backend, "provider", setup.backend)
    if not isinstance(backend, EndpointBackend):
        raise AssertionError("an endpoint sweep runs on the endpoint backend")
    return backend


class EndpointSweep:
    def __init__(self, setup: SweepSetup, run_dir: Path, progress: EndpointProgress | None = None) -> None:
        if setup.options.endpoint is None:
            raise AssertionError("an endpoint sweep needs targets")
        self.setup = setup
        self.options: EndpointOptions = setup.options.endpoint
        self.backend = endpoint_backend(setup)
        self.run_dir = run_dir
        self.progress: EndpointProgress = progress or NoProgress()
        self.results = run_dir / "results.jsonl"
        self.done = EndpointRun()  # what finished so far: the caller still has it when a later point fails

    def levels(self) -> list[Level]:
        if self.options.trace_timed:
            return [Level(0, trace=True)]
        if self.options.rates is not None:
            return [Level(0, rate) for rate in self.options.rates]
        return [Level(c) for c in self.setup.levels]

    def measure(self, engine: str, level: Level) -> tuple[Point, EndpointPoint]:
        """One point: measured (``--repeat`` times, combined), written (results.jsonl, and each run's timeline
        and watch file) and returned with the last run's measurement."""
        repeats = self.setup.options.repeat
        runs: list[Point] = []
        for index in range(repeats):
            point, measured = self._measure_once(engine, level, index if repeats > 1 else None)
            runs.append(point)
        merged = combine_repeats(runs)
        append_jsonl(self.results, merged.to_json())
        self.progress.done(merged)
        return merged, measured

    def _measure_once(self, engine: str, level: Level, index: int | None) -> tuple[Point, EndpointPoint]:
        """One run of a point (``index``: which repeat, None when it is the only one) and its files."""
        setup = self.setup
        requests = setup.make_requests(level.concurrency if level.rate is None else None)
        warmup = setup.plan(False).make_warmup()
        shown = engine if index is None else f"{engine} run {index + 1}/{self.setup.options.repeat}"
        trace = self.options.trace
        on_record = self.progress.start(shown, level, len(trace.requests) if trace else len(requests))
        measured = self.backend.measure(engine, requests, level.pattern(self.options, setup.seed), warmup, on_record)
        point = sweep_point(measured, engine, level.concurrency, setup.spec.name, self.options.slo)
        figures = EndpointFigures.of(point)
        if trace is not None:
            figures = replace(figures, trace=TraceFigures.from_json(trace_replay_figures(trace, measured)))
        stem = f"{file_name(engine)}-{level.tag}" + ("" if index is None else f"-run{index + 1}")
        timeline = measured.timeline()
        level_meta = {"engine": engine, "concurrency": level.concurrency, "request_rate": level.rate}
        timeline = replace(timeline, meta=timeline.meta | level_meta)
        write_point_timeline(self.run_dir / f"timeline-{stem}.json", timeline.to_json())
        if measured.scrapes:
            watch = self.run_dir / f"watch-{stem}.jsonl"
            watch.unlink(missing_ok=True)  # a rerun of the same level (find-max never repeats one) starts afresh
            metrics_url = figures.endpoint.metrics_url or ""
            write_watch_timeline(watch, metrics_url, measured.scrape_interval_s, measured.scrapes)
        lines = "".join(json_text(record.as_json(), indent=None) + "\n" for record in measured.records)
        write_text_atomic(self.run_dir / f"requests-{stem}.jsonl", lines)
        figures = replace(figures, timeline_file=f"timeline-{stem}.json", requests_file=f"requests-{stem}.jsonl")
        if measured.kv_events is not None:
            text = kv_events_text(measured.kv_events, measured.kv_changes)
            write_text_atomic(self.run_dir / f"kv-events-{stem}.jsonl", text)
            figures = replace(figures, kv_events_file=f"kv-events-{stem}.jsonl")
        figures.store_in(point)
        return point, measured

    def run(self) -> EndpointRun:
        try:
            return self._run()
        finally:
            self.progress.close()

    def _run(self) -> EndpointRun:
        out = self.done
        if self.options.find_max:
            for engine in self.backend.targets:
                out.searches.append(self._search(engine, out.points))
            return out
        for level in self.levels():
            for engine in self.backend.targets:
                out.points.append(self.measure(engine, level)[0].to_json())
        return out

    def _search(self, engine: str, points: list[dict[str, Any]]) -> Search:
        levels = self.levels()
        by = "concurrency" if self.options.rates is None else "rate"
        values = [level.concurrency if level.rate is None else level.rate for level in levels]
        low, high = min(values), max(values)
        if by == "concurrency" and len(values) == 1:
            low = 1
        seen: dict[float, tuple[Point, list[Scrape], float]] = {}

        def measure(value: float) -> tuple[Point, list[Scrape], float]:
            if value not in seen:
                level = Level(int(value)) if by == "concurrency" else Level(0, value)
                point, measured = self.measure(engine, level)
                points.append(point.to_json())
                seen[value] = (point, measured.scrapes, measured.duration_s)
            return seen[value]

        return find_max(
            engine, float(low), float(high), by, self.options.find_max_points, self.options.slo_attainment, measure
        )
