"""Run a concurrency sweep: every (engine, concurrency) point on the same request list, point by point.

Finished points are appended to ``results.jsonl`` at once, so an interrupted or failed sweep keeps them and
``resume`` skips them. A point that raises is recorded with status ``error`` and its reason.
"""

from __future__ import annotations

import json
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvbench import json_input
from kvbench.engine.load_pattern import ClosedLoop
from kvbench.engine.request import Request, make_request
from kvbench.errors import KvbenchError
from kvbench.fileio import append_jsonl, run_file, set_aside_torn_tail, write_json_atomic
from kvbench.results.block_timeline import BlockTimeline
from kvbench.results.point import Point, aggregate_repeats, point_from_result, timeline_of
from kvbench.results.schema import INTERLEAVED_FIELD
from kvbench.studies.backends.base import PointBackend


@dataclass
class SweepPlan:
    engines: Sequence[str]
    concurrencies: Sequence[int]
    scenario: str
    make_requests: Callable[[int], list[Request]]  # a fresh, identical request list per run, by concurrency
    make_warmup: Callable[[], list[Request]]
    repeat: int = 1
    continue_on_error: bool = False
    samples: int = 1  # parallel sampling: the paged engine forks each request, the baseline runs n copies

    def keys(self) -> list[tuple[str, int]]:
        return [(engine, c) for c in self.concurrencies for engine in self.engines]


RUN_CONFIG = "sweep-config.json"


def pin_run_config(run_dir: Path, config: dict[str, Any], resume: bool) -> None:
    """Record what a run directory's points were measured with; refuse to resume it with other settings."""
    path = run_dir / RUN_CONFIG
    if resume and path.exists():
        run_file(run_dir, RUN_CONFIG)  # a link leading out of the run directory is refused
        try:
            recorded = json_input.loads(json_input.read_text(path))
        except (OSError, ValueError):  # ValueError: not UTF-8, not JSON
            raise KvbenchError(f"{path} is unreadable; cannot check that a resume uses the same settings") from None
        changed = sorted(key for key in set(recorded) | set(config) if recorded.get(key) != config.get(key))
        if changed:
            details = ", ".join(f"{key} {recorded.get(key)!r} -> {config.get(key)!r}" for key in changed)
            raise KvbenchError(f"cannot resume {run_dir} with other settings than it was measured with: {details}")
        return
    write_json_atomic(path, config)


def recover_results(results_path: Path) -> str | None:
    """Before resuming: set a torn last line of ``results.jsonl`` aside (a write cut short by a crash).

    Returns the torn text (for a warning) or None. A broken line before the last one is not a torn write
    but a damaged file: ``load_finished`` refuses it.
    """
    if results_path.exists():
        run_file(results_path.parent, results_path.name)  # a link leading out of the run directory is refused
    return set_aside_torn_tail(results_path)


def load_finished(results_path: Path) -> dict[tuple[str, int, str], dict[str, Any]]:
    """Points already recorded (ok or oom) by key; error points are run again on resume."""
    finished: dict[tuple[str, int, str], dict[str, Any]] = {}
    if not results_path.exists():
        return finished
    run_file(results_path.parent, results_path.name)  # a link leading out of the run directory is refused
    try:
        text = json_input.read_text(results_path)
    except (OSError, UnicodeDecodeError) as err:
        raise KvbenchError(f"cannot read {results_path}: {getattr(err, 'strerror', None) or err}") from None
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            point = json_input.loads(line)
        except json.JSONDecodeError:
            raise KvbenchError(f"{results_path}:{number}: not valid JSON; cannot resume from it") from None
        if not isinstance(point, dict) or not {"engine", "concurrency", "status"} <= point.keys():
            raise KvbenchError(
                f"{results_path}:{number}: not a sweep point (engine, concurrency, status); cannot resume from it"
            )
        typed = Point.from_json(point)
        if typed.status in ("ok", "oom"):
            finished[(typed.engine, typed.concurrency, typed.scenario)] = point
    return finished


def run_sweep(plan: SweepPlan, backend: PointBackend, run_dir: Path, resume: bool, progress=None) -> list[dict]:
    """All points of the plan in order; returns every point of the run directory.

    When resuming, points finished earlier are skipped, and those outside this plan (a resume with fewer
    concurrency levels or engines) are kept in the returned list, so the summary never loses them.
    """
    results_path = run_dir / "results.jsonl"
    if results_path.exists() and not resume:
        raise KvbenchError(f"{run_dir} already holds results; resume it or choose another run directory")
    finished = load_finished(results_path) if resume else {}
    planned = {(engine, concurrency, plan.scenario) for engine, concurrency in plan.keys()}
    earlier = [point for key, point in finished.items() if key not in planned]
    points: list[dict] = []
    warmed: set[str] = set()
    together = backend.interleaved_engines
    for concurrency in plan.concurrencies:
        todo = []
        for engine in plan.engines:
            key = (engine, concurrency, plan.scenario)
            if key in finished:
                points.append(finished[key])
                if progress is not None:
                    progress.skip(engine, concurrency)
            else:
                todo.append(engine)
        paired = [engine for engine in todo if engine in together]
        groups = ([paired] if len(paired) > 1 else []) + [[e] for e in todo if len(paired) < 2 or e not in paired]
        for group in groups:
            done = _measure(plan, backend, group, concurrency, run_dir, progress, warmed)
            for point in done:
                append_jsonl(results_path, point)
                points.append(point)
            failed = next((point for point in done if Point.from_json(point).status == "error"), None)
            if failed is not None and not plan.continue_on_error:
                raise PointFailed(failed, ordered_points([*earlier, *points]))
    return ordered_points([*earlier, *points])


def ordered_points(points: list[dict]) -> list[dict]:
    """Points by concurrency, then engine name: the order of the tables."""

    def order(point: dict) -> tuple[int, str]:
        typed = Point.from_json(point)
        return typed.concurrency, typed.engine

    return sorted(points, key=order)


def parallel_samples(requests: list[Request], samples: int, forked: bool) -> list[Request]:
    """n samples per request: one request forked into n by an engine that can fork (paged), else n full copies
    (seeds seed+i, the baseline)."""
    out = []
    for request in requests:
        base = replace(request.sampling, temperature=1.0, top_p=0.95, seed=1000 * request.request_id)
        assert request.prompt_token_ids is not None, "an engine's requests carry token ids"
        if forked:
            out.append(make_request(request.request_id, request.prompt_token_ids, base, num_samples=samples))
        else:
            out += [
                make_request(
                    request.request_id * samples + i, request.prompt_token_ids, replace(base, seed=base.seed + i)
                )
                for i in range(samples)
            ]
    return out


class PointFailed(Exception):
    """A point failed and --continue-on-error was not given; earlier points are already saved."""

    def __init__(self, point: dict, points: list[dict]) -> None:
        self.point = Point.from_json(point)
        super().__init__(self.point.error)
        self.points = points  # every point of the run directory, the failed one included


def _measure(
    plan: SweepPlan,
    backend: PointBackend,
    group: list[str],
    concurrency: int,
    run_dir: Path,
    progress,
    warmed: set[str],
) -> list[dict[str, Any]]:
    """The points of ``group`` at ``concurrency`` (several engines: interleaved); a point that raises is recorded
    with status ``error``. When an interleaved run fails, each engine runs again alone, so that the others'
    points survive and the error is pinned on the engine that raised it."""
    try:
        for engine in group:
            if engine not in warmed:
                backend.warm_up(engine, plan.make_warmup())
                warmed.add(engine)
        if len(group) > 1:
            return _run_points_together(plan, backend, group, concurrency, run_dir, progress)
        return [_run_point(plan, backend, group[0], concurrency, run_dir, progress)]
    except KeyboardInterrupt:
        raise
    except KvbenchError:
        raise
    except Exception as err:
        if len(group) > 1:
            return [
                point
                for engine in group
                for point in _measure(plan, backend, [engine], concurrency, run_dir, progress, warmed)
            ]
        return [
            Point.failed(
                group[0], concurrency, plan.scenario, f"{type(err).__name__}: {err}", traceback.format_exc(limit=5)
            ).to_json()
        ]


def _requests_for(plan: SweepPlan, backend: PointBackend, engine: str, concurrency: int) -> tuple[list[Request], int]:
    """A point's fresh request list and how many requests it keeps in flight."""
    requests = plan.make_requests(concurrency)
    in_flight = concurrency
    if plan.samples > 1:  # concurrency counts prompts in flight, each with its n samples
        forked = backend.can_fork(engine)
        requests = parallel_samples(requests, plan.samples, forked)
        in_flight = concurrency * (1 if forked else plan.samples)
    return requests, in_flight


def _run_points_together(
    plan: SweepPlan, backend: PointBackend, engines: list[str], concurrency: int, run_dir: Path, progress
) -> list[dict[str, Any]]:
    """The points of ``engines`` at ``concurrency``, run interleaved step by step (``backend.run_together``):
    a shared machine's load then falls on every engine alike, and their ratio holds from run to run."""
    runs: dict[str, list[Point]] = {engine: [] for engine in engines}
    for repeat in range(plan.repeat):
        lists = {engine: _requests_for(plan, backend, engine, concurrency) for engine in engines}
        in_flight = {n for _, n in lists.values()}
        if len(in_flight) != 1:  # parallel samples: the baseline keeps n copies in flight, paged forks them
            results = [
                backend.run(
                    engine, requests, ClosedLoop(n), _on_step(progress, [engine], concurrency, repeat, requests)
                )
                for engine, (requests, n) in lists.items()
            ]
        else:
            every = [r for requests, _ in lists.values() for r in requests]
            results = backend.run_together(
                [(engine, lists[engine][0]) for engine in engines],
                in_flight.pop(),
                _on_step(progress, engines, concurrency, repeat, every),
            )
        for engine, (result, memory) in zip(engines, results, strict=True):
            point = point_from_result(result, engine, concurrency, plan.scenario, backend.bytes_per_token, memory)
            point.extra[INTERLEAVED_FIELD] = [other for other in engines if other != engine]
            if repeat == plan.repeat - 1:
                _write_timeline(run_dir, engine, concurrency, result)
            if progress is not None:
                progress.point_done(engine, concurrency, point)
            runs[engine].append(point)
    return [aggregate_repeats(runs[engine]).to_json() for engine in engines]


def _on_step(progress, engines: list[str], concurrency: int, repeat: int, requests: list[Request]):
    if progress is None:
        return None
    return progress.step_callback("+".join(engines), concurrency, repeat, len(requests), engines=engines)


def _write_timeline(run_dir: Path, engine: str, concurrency: int, result) -> None:
    timeline = BlockTimeline(engine, concurrency, result.pool_slots // result.block_size, timeline_of(result))
    write_json_atomic(run_dir / f"timeline-{engine}-c{concurrency}.json", timeline.to_json())


def _run_point(
    plan: SweepPlan, backend: PointBackend, engine: str, concurrency: int, run_dir: Path, progress
) -> dict[str, Any]:
    runs: list[Point] = []
    for repeat in range(plan.repeat):
        requests, in_flight = _requests_for(plan, backend, engine, concurrency)
        on_step = progress.step_callback(engine, concurrency, repeat, len(requests)) if progress else None
        result, memory = backend.run(engine, requests, ClosedLoop(in_flight), on_step)
        point = point_from_result(result, engine, concurrency, plan.scenario, backend.bytes_per_token, memory)
        if repeat == plan.repeat - 1:
            _write_timeline(run_dir, engine, concurrency, result)
        if progress is not None:
            progress.point_done(engine, concurrency, point)
        runs.append(point)
    return aggregate_repeats(runs).to_json()
