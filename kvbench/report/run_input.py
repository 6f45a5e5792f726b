"""Reading what a run directory holds, when the directory came from someone else (a CI artifact): every name its
files give is confined to it, every JSON goes through the one reader."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kvbench import json_input
from kvbench.errors import KvbenchError
from kvbench.fileio import inside, run_file

MAX_SERIES_BYTES = 256 << 20  # a run's timeline or fleet series: far more than any run writes


def read_run_json(directory: Path, name: object) -> Any:
    """The JSON of file ``name`` of a run directory (a name its own files give): confined to the directory
    (:func:`~kvbench.fileio.run_file`), read through the one JSON reader (depth and size limits). None when the
    file is absent or unreadable JSON; a one-line error when the name or a link would lead outside."""
    path = run_file(directory, name)
    if not path.is_file():
        return None
    try:
        return json_input.loads(json_input.read_text(path, MAX_SERIES_BYTES))
    except (OSError, ValueError, KvbenchError):  # ValueError: not UTF-8, not JSON, nested too deep
        return None


def run_series(directory: Path, pattern: str) -> list[Path]:
    """The run's files matching ``pattern``, in name order; a link among them leading outside is refused."""
    return [inside(directory, path) for path in sorted(directory.glob(pattern))]
