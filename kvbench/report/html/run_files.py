"""The files of a run directory that a report is built from: ``summary.json`` (and the series files its plots
read), or a watch's ``timeline.jsonl``. Nothing here depends on the process that made the run."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench import json_input
from kvbench.errors import KvbenchError
from kvbench.fileio import inside
from kvbench.report.run_input import run_series
from kvbench.results.summary_load import MAX_SUMMARY_BYTES, SUMMARY_FILE, parse_summary
from kvbench.results.watch_records import TIMELINE_FILE

# Files a report reads besides summary.json, by the run kind that writes them (listed in its provenance).
SERIES_PATTERNS = {"sweep": ("timeline-*.json",), "fleet": ("fleet-*.json",)}


@dataclass
class RunFiles:
    directory: Path
    kind: str  # summary.json's kind, or "watch" for a timeline
    document: dict[str, Any] = field(default_factory=dict)  # summary.json (empty for a watch)
    timeline: Path | None = None

    def files(self) -> list[Path]:
        """The files this report reads, for its provenance."""
        if self.timeline is not None:
            return [self.timeline]
        found = [self.directory / SUMMARY_FILE]
        for pattern in SERIES_PATTERNS.get(self.kind, ()):
            found += run_series(self.directory, pattern)
        return found


def load_run(location: str | Path) -> RunFiles:
    """A run directory (or its summary.json, or a watch's timeline.jsonl) as the report reads it."""
    path = Path(location)
    if not path.exists():
        raise KvbenchError(f"{location}: no such run directory")
    if path.is_file():
        if path.suffix == ".jsonl":
            return RunFiles(path.parent, "watch", timeline=path)
        return _summary_run(path)
    if (path / SUMMARY_FILE).is_file():
        return _summary_run(path / SUMMARY_FILE)
    if (path / TIMELINE_FILE).is_file():
        return RunFiles(path, "watch", timeline=path / TIMELINE_FILE)
    if (path / "results.jsonl").is_file():
        raise KvbenchError(
            f"{location} has results.jsonl but no {SUMMARY_FILE}: the run did not finish; resume it "
            "to the end, then build its report"
        )
    raise KvbenchError(f"{location} is not a run directory: it holds neither {SUMMARY_FILE} nor {TIMELINE_FILE}")


def _summary_run(path: Path) -> RunFiles:
    inside(path.parent, path)  # summary.json itself: no link out of its run directory
    try:
        text = json_input.read_text(path, MAX_SUMMARY_BYTES)
    except (OSError, UnicodeDecodeError) as err:
        raise KvbenchError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    try:
        document = json_input.loads(text)
    except json.JSONDecodeError as err:
        raise KvbenchError(f"{path} is not valid JSON (line {err.lineno}: {err.msg})") from None
    summary = parse_summary(document, path)  # the schema version, kind, meta and points are checked here
    return RunFiles(path.parent, summary.kind, document)
