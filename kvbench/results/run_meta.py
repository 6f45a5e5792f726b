"""What a run directory records about the run: its metadata (command line, versions, device, revision, host, the
settings of the run), typed as :class:`RunMeta` for its readers, and the summary document that carries it."""

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
from kvbench.results.environment import host_info, package_versions
from kvbench.results.matmul_plan_record import MatmulPlanRecord
from kvbench.results.schema import SCHEMA_VERSION
from kvbench.values import is_number


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


@dataclass(frozen=True)
class RunMeta:
    """A run's ``meta`` as its readers see it. Each kind of run records settings of its own beside the common
    ones, so the record stays open: the fields a report reads are typed here, and :meth:`to_json` gives the
    record back as the run wrote it, every key in its order. A field the run did not record keeps the default
    its readers assume."""

    simulated: bool = False  # roofline step times, no model ran
    interrupted: bool = False  # the run stopped before its last point
    model_name: str | None = None  # as recorded (a preset, a path, a Hugging Face id)
    device: str | None = None
    scenario: str | None = None
    scenario_description: str = ""
    budget_source: str = ""  # where the KV pool's size came from
    stop: str = "length"  # length: drawn or reference output lengths | eos: the model decides
    stop_description: str = ""
    reserve: str | None = None  # the contiguous baseline's reservation policy: max | pow2 | oracle
    max_len: int | None = None  # tokens a request may reach (prompt + output)
    block_size: int | None = None  # tokens per KV block
    threads: float | None = None  # CPU threads of the engines' steps (None: not a CPU run, or not recorded)
    from_dataset: bool = False  # the requests came from a dataset file
    cpu_matmuls: MatmulPlanRecord | None = None  # the CPU's measured matmul plan (None: not a CPU run)
    recorded: Mapping[str, Any] = field(default_factory=dict)  # the record as written

    @property
    def reserve_policy(self) -> str:
        """The reservation policy, ``max`` where the run did not record one."""
        return self.reserve or "max"

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RunMeta:
        threads = data.get("threads")  # {"threads": N, "reason": ...} as a CPU run records it, or a bare count
        count = threads.get("threads") if isinstance(threads, Mapping) else threads
        return cls(
            simulated=bool(data.get("simulated")),
            interrupted=bool(data.get("interrupted")),
            model_name=_shown(data, "model_name"),
            device=_shown(data, "device"),
            scenario=_shown(data, "scenario"),
            scenario_description=str(data.get("scenario_description") or ""),
            budget_source=str(data.get("budget_source") or ""),
            stop=str(data.get("stop") or "length"),
            stop_description=str(data.get("stop_description") or ""),
            reserve=_text(data.get("reserve")),
            max_len=_integer(data.get("max_len")),
            block_size=_integer(data.get("block_size")),
            threads=count if is_number(count, finite=True) else None,
            from_dataset=bool(data.get("dataset")),
            cpu_matmuls=MatmulPlanRecord.recorded(data.get("cpu_matmuls")),
            recorded=dict(data),
        )

    @classmethod
    def of(cls, meta: RunMeta | Mapping[str, Any] | None) -> RunMeta:
        """``meta`` typed: as it is when it already is, an empty record for None."""
        return meta if isinstance(meta, RunMeta) else cls.from_json(meta or {})

    def to_json(self) -> dict[str, Any]:
        return dict(self.recorded)


MetaLike = RunMeta | Mapping[str, Any]  # a run's meta, typed or as summary.json holds it (RunMeta.of types it)


def _shown(data: Mapping[str, Any], key: str) -> str | None:
    """A recorded value as text, as a title shows it; None where the run did not record it."""
    return str(data[key]) if key in data else None


def _text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def _integer(value: Any) -> int | None:
    return int(value) if is_number(value, finite=True) else None
