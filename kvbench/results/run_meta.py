"""What a run directory records about the run: its metadata (command line, versions, device, revision, host)
and the summary document that carries it."""

from __future__ import annotations

import datetime as dt
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

from kvbench import __version__
from kvbench.results.environment import host_info, package_versions
from kvbench.results.schema import SCHEMA_VERSION


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
