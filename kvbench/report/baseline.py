"""Refresh a committed baseline (e.g. ``reports/baseline/sweep``) from a run, on purpose."""

from __future__ import annotations

import os
from pathlib import Path

from kvbench.fileio import write_text_atomic
from kvbench.results.summary_load import SUMMARY_FILE, Summary


def baseline_file(location: str | os.PathLike) -> Path:
    """Where the baseline summary lives: ``location`` if it names a .json file, else ``location/summary.json``."""
    path = Path(location)
    if path.is_dir() or path.suffix != ".json":
        return path / SUMMARY_FILE
    return path


def update_baseline(head: Summary, location: str | os.PathLike) -> Path:
    """Copy the head run's summary.json, byte for byte, onto the baseline (atomically)."""
    return write_text_atomic(baseline_file(location), head.path.read_text(encoding="utf-8"))
