"""Run directories: where a command writes summary.json, results.jsonl, summary.csv, summary.md and plots."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError
from kvbench.fileio import write_json_atomic, write_text_atomic

DEFAULT_REPORTS = Path("reports")


def new_run_dir(command: str, out: Path | None) -> Path:
    """``out`` if given, else ``reports/<command>-<UTC timestamp>``; created, must be writable."""
    if out is None:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S")
        out = DEFAULT_REPORTS / f"{command}-{stamp}"
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise KvbenchError(f"cannot create run directory {out}: {err.strerror}") from None
    if not out.is_dir():
        raise KvbenchError(f"run directory {out} is not a directory")
    return out


def write_summary(run_dir: Path, document: dict[str, Any], csv_rows: list[dict[str, Any]], markdown: str) -> None:
    """summary.json, summary.csv and summary.md, each written atomically; then report.html, built from them."""
    import pandas as pd

    from kvbench.report.html import write_report_after_run

    write_json_atomic(run_dir / "summary.json", document)
    write_text_atomic(run_dir / "summary.csv", pd.DataFrame(csv_rows).to_csv(index=False))
    write_text_atomic(run_dir / "summary.md", markdown)
    write_report_after_run(run_dir)


def wrote_line(run_dir: Path, files: str) -> str:
    """The line a run ends with: the files it wrote, report.html among them only where this run wrote it."""
    from kvbench.report.html import written_after_run

    page = "report.html, " if written_after_run(run_dir) else ""
    return f"wrote {run_dir}/ ({page}{files})"


def flatten(point: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested dicts become dotted columns (``waste.internal_pct``) for CSV."""
    flat: dict[str, Any] = {}
    for key, value in point.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, f"{name}."))
        elif isinstance(value, list):
            continue
        else:
            flat[name] = value
    return flat
