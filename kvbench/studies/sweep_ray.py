"""``sweep --ray``: the points of a sweep fanned out to Ray workers, with the same results as a local sweep.

Each worker is a Ray actor that resolves the sweep's setup once (its own model and pools: one GPU per worker
when the tensor engines run on CUDA, else one CPU) and runs the points it is given exactly as the local sweep runs them:
the same request lists, an uncounted warm-up before an engine's first point, the same point code. The driver
appends each point to ``results.jsonl`` as it comes and writes its timeline file, so an interrupted sweep
keeps what finished and ``--resume`` skips it.
"""

from __future__ import annotations

import json
import tempfile
import traceback
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError
from kvbench.fileio import append_jsonl, write_json_atomic
from kvbench.results.point import Point
from kvbench.studies.fleet.ray_runtime import actor_resources, gpus_available, ray_session, uses_gpu
from kvbench.studies.sweep import PointFailed, _run_point, load_finished, ordered_points
from kvbench.studies.sweep_setup import SweepOptions, SweepSetup


class SweepWorker:
    """A Ray actor's body: one resolved sweep setup, points run on request."""

    def __init__(self, options: SweepOptions, continue_on_error: bool) -> None:
        self.setup = SweepSetup.resolve(options)
        self.plan = self.setup.plan(continue_on_error)
        self.warmed: set[str] = set()

    def run_point(self, engine: str, concurrency: int) -> tuple[dict[str, Any], dict | None]:
        """The point's JSON and its timeline file's content (None when it failed before writing one)."""
        with tempfile.TemporaryDirectory() as scratch:
            try:
                if engine not in self.warmed:
                    self.setup.backend.warm_up(engine, self.plan.make_warmup())
                    self.warmed.add(engine)
                point = _run_point(self.plan, self.setup.backend, engine, concurrency, Path(scratch), None)
            except KvbenchError:
                raise
            except Exception as err:
                point = Point.failed(
                    engine,
                    concurrency,
                    self.plan.scenario,
                    f"{type(err).__name__}: {err}",
                    traceback.format_exc(limit=5),
                ).to_json()
            timeline = Path(scratch) / timeline_name(engine, concurrency)
            return point, json.loads(timeline.read_text(encoding="utf-8")) if timeline.exists() else None


def timeline_name(engine: str, concurrency: int) -> str:
    return f"timeline-{engine}-c{concurrency}.json"


def run_sweep_on_ray(
    setup: SweepSetup,
    continue_on_error: bool,
    run_dir: Path,
    resume: bool,
    workers: int | None = None,
    address: str | None = None,
    on_point=None,
) -> list[dict]:
    """Every point of the plan on Ray workers; returns every point of the run directory, in table order."""
    plan = setup.plan(continue_on_error)
    results = run_dir / "results.jsonl"
    if results.exists() and not resume:
        raise KvbenchError(f"{run_dir} already holds results; resume it or choose another run directory")
    finished = load_finished(results) if resume else {}
    todo = [(e, c) for e, c in plan.keys() if (e, c, plan.scenario) not in finished]
    points = [p for key, p in finished.items()]  # earlier points, in this plan or not
    if not todo:
        return ordered_points(points)
    with ray_session(address) as ray:
        gpus = gpus_available(ray)
        on_gpus = uses_gpu(setup.options.device, setup.options.simulate, gpus)
        count = max(1, min(len(todo), workers if workers is not None else (gpus if on_gpus else 1)))
        resources = actor_resources(setup.options.device, setup.options.simulate, gpus, count)
        worker_class = ray.remote(**resources)(SweepWorker)
        actors = [worker_class.remote(setup.options, continue_on_error) for _ in range(count)]
        try:
            # points dealt round-robin in plan order; a worker warms an engine up before its first point of it
            refs = {
                actors[i % count].run_point.remote(engine, concurrency): (engine, concurrency)
                for i, (engine, concurrency) in enumerate(todo)
            }
            pending = list(refs)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                try:
                    point, timeline = ray.get(ready[0])
                except Exception as err:
                    engine, concurrency = refs[ready[0]]
                    cause = getattr(err, "cause", None)
                    if isinstance(cause, KvbenchError):
                        raise cause from None
                    point, timeline = (
                        Point.failed(
                            engine, concurrency, plan.scenario, f"the Ray worker failed: {type(err).__name__}: {err}"
                        ).to_json(),
                        None,
                    )
                if timeline is not None:
                    write_json_atomic(run_dir / timeline_name(point["engine"], point["concurrency"]), timeline)
                append_jsonl(results, point)
                points.append(point)
                if on_point is not None:
                    on_point(point)
                if point["status"] == "error" and not continue_on_error:
                    raise PointFailed(point, ordered_points(points))
        finally:
            for actor in actors:
                ray.kill(actor)
    return ordered_points(points)
