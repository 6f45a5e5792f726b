"""Read a run's ``summary.json`` (the results schema of ``kvbench.results.schema``) and check its shape.

Every run kind kvbench writes (sweep, waste, share) is a list of points keyed by (engine, concurrency,
scenario); the values of the metrics are checked by ``compare``, which knows which ones it judges.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from kvbench import json_input
from kvbench.errors import KvbenchError
from kvbench.results.point_check import point_problem
from kvbench.results.schema import SCHEMA_VERSION

SUMMARY_FILE = "summary.json"


class PointKey(NamedTuple):
    """What identifies a point across runs."""

    engine: str
    concurrency: int
    scenario: str

    @property
    def label(self) -> str:
        return f"{self.engine} c={self.concurrency} {self.scenario}".rstrip()


@dataclass(frozen=True)
class Summary:
    path: Path  # the summary.json it was read from
    kind: str  # sweep | waste | share
    meta: Mapping[str, Any]
    points: Mapping[PointKey, Mapping[str, Any]]  # in file order


MAX_SUMMARY_BYTES = 256 << 20  # a summary of thousands of points is megabytes


def summary_path(location: str | os.PathLike) -> Path:
    """``location`` itself when it is a file, else ``location/summary.json``."""
    path = Path(location)
    if path.is_dir():
        path = path / SUMMARY_FILE
        if not path.is_file():
            raise KvbenchError(f"{location}: run directory has no {SUMMARY_FILE}")
    elif not path.exists():
        raise KvbenchError(f"{location}: no such run directory or summary file")
    return path


MAX_CONCURRENCY = 10**9  # requests in flight at once: no run reaches it


def load_summary(location: str | os.PathLike) -> Summary:
    path = summary_path(location)
    try:
        text = json_input.read_text(path, MAX_SUMMARY_BYTES)
    except (OSError, UnicodeDecodeError) as err:
        raise KvbenchError(f"cannot read {path}: {err}") from err
    try:
        data = json_input.loads(text)
    except json.JSONDecodeError as err:
        raise KvbenchError(f"{path} is not valid JSON (line {err.lineno}: {err.msg})") from err
    return parse_summary(data, path)


def parse_summary(data: Any, path: Path) -> Summary:
    if not isinstance(data, dict) or "schema_version" not in data or "points" not in data:
        raise KvbenchError(f"{path} is not a kvbench summary (it needs schema_version and points)")
    version = data["schema_version"]
    if type(version) is not int or version != SCHEMA_VERSION:
        raise KvbenchError(f"{path} has schema_version {version!r}; this kvbench reads {SCHEMA_VERSION}")
    kind, meta, points = data.get("kind"), data.get("meta") or {}, data["points"]
    if not isinstance(kind, str) or not kind:
        raise KvbenchError(f"{path} is not a kvbench summary: 'kind' must be a non-empty string")
    if not isinstance(meta, dict):
        raise KvbenchError(f"{path} is not a kvbench summary: 'meta' must be an object")
    if not isinstance(points, list):
        raise KvbenchError(f"{path} is not a kvbench summary: 'points' must be a list")
    default_scenario = scenario if isinstance(scenario := meta.get("scenario"), str) else ""
    keyed: dict[PointKey, Mapping[str, Any]] = {}
    for index, point in enumerate(points):
        key = _point_key(point, default_scenario, f"{path}: point {index}")
        if (problem := point_problem(point)) is not None:
            raise KvbenchError(f"{path}: point {key.label}: {problem}; kvbench never writes that")
        if key in keyed:
            raise KvbenchError(f"{path}: two points for {key.label}")
        keyed[key] = point
    return Summary(path=path, kind=kind, meta=meta, points=keyed)


def _point_key(point: Any, default_scenario: str, where: str) -> PointKey:
    if not isinstance(point, dict):
        raise KvbenchError(f"{where} is not an object")
    engine, concurrency = point.get("engine"), point.get("concurrency")
    scenario = point.get("scenario", default_scenario)
    if not isinstance(engine, str) or not engine:
        raise KvbenchError(f"{where} has no engine name")
    if type(concurrency) is not int:
        raise KvbenchError(f"{where} has no integer concurrency")
    if concurrency < 0:
        raise KvbenchError(f"{where} has concurrency {concurrency}, below 0 (0 is an open-loop point)")
    if concurrency > MAX_CONCURRENCY:
        raise KvbenchError(f"{where} has a concurrency above {MAX_CONCURRENCY:,}, more than any run holds")
    if not isinstance(scenario, str):
        raise KvbenchError(f"{where} has a non-string scenario")
    return PointKey(engine, concurrency, scenario)
