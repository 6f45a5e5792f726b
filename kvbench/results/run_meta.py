"""What a run directory records about the run: its metadata (command line, versions, device, revision, host, the
settings of the run), typed as :class:`RunMeta` (each kind of run subclasses it), and the summary document that
carries it."""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench import __version__
from kvbench.results.dataset_draw import DatasetDraw
from kvbench.results.environment import HostFacts, host_info, package_versions
from kvbench.results.matmul_plan_record import MatmulPlanRecord
from kvbench.results.model_shape_facts import ModelShapeFacts
from kvbench.results.schema import SCHEMA_VERSION
from kvbench.values import int_or_none, is_number, text_or_none


def git_revision() -> str | None:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            cwd=Path(__file__).resolve().parent,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() or None if done.returncode == 0 else None


def _version(module: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(module)
    except Exception:
        return None


def run_meta(**fields: Any) -> dict[str, Any]:
    """What a reader needs to reproduce the run: command line, versions, device, revision, the host and the
    package versions (``results/environment.py``), plus ``fields``."""
    meta = {
        "command": " ".join(["kvbench", *sys.argv[1:]]),
        "created_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "kvbench_version": __version__,
        "python_version": platform.python_version(),
        "torch_version": _version("torch"),
        "transformers_version": _version("transformers"),
        "triton_version": _version("triton"),
        "platform": platform.platform(),
        "git_revision": git_revision(),
        "host": host_info(),
        "packages": package_versions(),
    }
    meta.update(fields)
    return meta


def summary_document(kind: str, meta: dict[str, Any], points: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "kind": kind, "meta": meta, **extra, "points": points}


MAX_NUM_SEQS = 256  # the engines' batch cap where a run does not record one


@dataclass(frozen=True)
class RunMeta:
    """A run's ``meta``, typed: what every run records (:func:`run_meta`: command line, versions, revision, host)
    and the settings kinds of run record under the same key; a sweep's meta is this. A kind with settings of its own
    subclasses it (``WasteMeta``, ``DatasetMeta``, ``ShareMeta``, ``FleetMeta``) and reads them in its ``from_json``
    beside :func:`run_fields`.

    One rule for every kind: the record is written by :func:`run_meta` and typed by ``from_json``, which keeps it
    as written (:attr:`recorded`); ``to_json`` gives it back, every key in its order, so a file reads and writes
    byte for byte. A key an older or partial record lacks reads the default its readers assume."""

    command: str | None = None  # the command line that ran: kvbench ...
    created_utc: str | None = None  # ISO 8601, seconds
    kvbench_version: str | None = None
    python_version: str | None = None
    torch_version: str | None = None
    transformers_version: str | None = None
    triton_version: str | None = None
    platform: str | None = None
    git_revision: str | None = None  # None: not run from a git checkout
    host: HostFacts | None = None  # CPU, cores, memory, GPU (None: not recorded)
    packages: dict[str, str] = field(default_factory=dict)  # version by package name
    simulated: bool = False  # roofline step times, no model ran
    interrupted: bool = False  # the run stopped before its last point
    model_name: str | None = None  # as recorded (a preset, a path, a Hugging Face id)
    device: str | None = None
    scenario: str | None = None
    scenario_description: str = ""
    seed: int | None = None
    requests: int | None = None  # requests the run drew
    budget_source: str = ""  # where the KV pool's size came from
    stop: str = "length"  # length: drawn or reference output lengths | eos: the model decides
    stop_description: str = ""
    reserve: str | None = None  # the contiguous baseline's reservation policy: max | pow2 | oracle
    max_len: int | None = None  # tokens a request may reach (prompt + output)
    block_size: int | None = None  # tokens per KV block
    max_num_seqs: int = MAX_NUM_SEQS  # the engines' batch cap: requests running at once
    threads: float | None = None  # CPU threads of the engines' steps (None: not a CPU run, or not recorded)
    cpu_matmuls: MatmulPlanRecord | None = None  # the CPU's measured matmul plan (None: not a CPU run)
    dataset: DatasetDraw | None = None  # the requests came from a dataset file: what was drawn
    recorded: Mapping[str, Any] = field(default_factory=dict, repr=False)  # the record as written

    @property
    def reserve_policy(self) -> str:
        """The reservation policy, ``max`` where the run did not record one."""
        return self.reserve or "max"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunMeta:
        return cls(**run_fields(data))

    def to_json(self) -> dict[str, Any]:
        return dict(self.recorded)


def run_fields(data: Mapping[str, Any]) -> dict[str, Any]:
    """:class:`RunMeta`'s fields read from a run's ``meta``, the record itself included: what a kind's
    ``from_json`` passes on beside its own fields."""
    threads = data.get("threads")  # {"threads": N, "reason": ...} as a CPU run records it, or a bare count
    count = threads.get("threads") if isinstance(threads, Mapping) else threads
    dataset = data.get("dataset")
    return {
        "command": text_or_none(data.get("command")),
        "created_utc": text_or_none(data.get("created_utc")),
        "kvbench_version": text_or_none(data.get("kvbench_version")),
        "python_version": text_or_none(data.get("python_version")),
        "torch_version": text_or_none(data.get("torch_version")),
        "transformers_version": text_or_none(data.get("transformers_version")),
        "triton_version": text_or_none(data.get("triton_version")),
        "platform": text_or_none(data.get("platform")),
        "git_revision": text_or_none(data.get("git_revision")),
        "host": HostFacts.from_json(host) if isinstance(host := data.get("host"), Mapping) and host else None,
        "packages": dict(packages) if isinstance(packages := data.get("packages"), Mapping) else {},
        "simulated": bool(data.get("simulated")),
        "interrupted": bool(data.get("interrupted")),
        "model_name": _model_name(data),
        "device": _shown(data, "device"),
        "scenario": _shown(data, "scenario"),
        "scenario_description": str(data.get("scenario_description") or ""),
        "seed": int_or_none(data.get("seed")),
        "requests": int_or_none(data.get("requests")),
        "budget_source": str(data.get("budget_source") or ""),
        "stop": str(data.get("stop") or "length"),
        "stop_description": str(data.get("stop_description") or ""),
        "reserve": text_or_none(data.get("reserve")),
        "max_len": int_or_none(data.get("max_len")),
        "block_size": int_or_none(data.get("block_size")),
        "max_num_seqs": _or(int_or_none(data.get("max_num_seqs")), MAX_NUM_SEQS),
        "threads": count if is_number(count, finite=True) else None,
        "cpu_matmuls": MatmulPlanRecord.recorded(data.get("cpu_matmuls")),
        "dataset": DatasetDraw.from_json(dataset) if isinstance(dataset, Mapping) and dataset else None,
        "recorded": dict(data),
    }


def _model_name(data: Mapping[str, Any]) -> str | None:
    """The run's model as recorded: ``model_name``, or the name in the model's shape record (the waste study's
    ``model``; a dataset's ``model`` names a tokenizer's, not a run's)."""
    model = data.get("model")
    if "model_name" in data or not isinstance(model, Mapping):
        return _shown(data, "model_name")
    return ModelShapeFacts.from_json(model).name


def _shown(data: Mapping[str, Any], key: str) -> str | None:
    """A recorded value as text, as a title shows it; None where the run did not record it."""
    return str(data[key]) if key in data else None


def _or(value: int | None, default: int) -> int:
    return default if value is None else value
