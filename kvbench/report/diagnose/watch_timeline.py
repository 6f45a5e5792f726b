"""Reading and judging the timeline ``kvbench watch`` records (its lines: :mod:`kvbench.results.watch_records`).

A watch cut short keeps every finished scrape; a torn last line (a write cut short) is set aside when read, a
broken line before it is an error.
"""

from __future__ import annotations

import json
from pathlib import Path

from kvbench import json_input
from kvbench.errors import KvbenchError
from kvbench.report.diagnose.findings import Diagnosis
from kvbench.report.diagnose.live_rules import Window, diagnose_windows, seconds
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.results.watch_records import TIMELINE_FILE, WatchHeader, WatchScrape


def timeline_path(location: str | Path) -> Path | None:
    """The timeline ``location`` names: a ``.jsonl`` file, or a folder holding ``timeline.jsonl`` and no
    ``summary.json``; None when it names something else (a run directory or summary)."""
    path = Path(location)
    if path.is_dir():
        candidate = path / TIMELINE_FILE
        return candidate if candidate.is_file() and not (path / "summary.json").exists() else None
    return path if path.suffix == ".jsonl" else None


class Timeline:
    """The scrapes of a timeline file, grouped by engine instance (oldest first)."""

    def __init__(self, path: Path, windows: dict[str, Window], errors: int, torn: bool, url: str) -> None:
        self.path = path
        self.windows = windows
        self.errors = errors
        self.torn = torn
        self.url = url


class NoScrapes(KvbenchError):
    """A timeline without one successful scrape (``failed`` of them failed): nothing of the server to judge."""

    def __init__(self, message: str, failed: int) -> None:
        super().__init__(message)
        self.failed = failed


def read_timeline(location: str | Path) -> Timeline:
    path = Path(location)
    try:
        text = json_input.read_text(path)  # a regular file only: a FIFO would wait for a writer for ever
    except FileNotFoundError:
        raise KvbenchError(f"{location}: no such timeline file") from None
    except (OSError, UnicodeDecodeError) as err:
        raise KvbenchError(f"cannot read {path}: {getattr(err, 'strerror', None) or err}") from None
    lines = [(number, line) for number, line in enumerate(text.splitlines(), 1) if line.strip()]
    windows: dict[str, Window] = {}
    errors, torn, url = 0, False, ""
    for index, (number, line) in enumerate(lines):
        try:
            record = json_input.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            header = WatchHeader.from_json(record)
            if header is not None:
                url = "" if header.url is None else str(header.url)
                continue
            scrape = WatchScrape.from_json(record)
            if scrape.state is None:  # a scrape that failed
                errors += 1
                continue
            elapsed, state = scrape.elapsed_s, scrape.state
            samples = windows[state.source].samples if state.source in windows else []
            if samples and elapsed < samples[-1][0]:
                raise ValueError(f"elapsed_s goes back from {samples[-1][0]:g} to {elapsed:g}")
        except (ValueError, KeyError, TypeError) as err:
            if index == len(lines) - 1 and index > 0 and not text.endswith("\n"):
                torn = True  # the last write was cut short
                break
            what = "not valid JSON" if isinstance(err, json.JSONDecodeError) else f"not a timeline record ({err})"
            raise KvbenchError(f"{path}:{number}: {what}; a timeline is the JSONL file kvbench watch writes") from None
        windows.setdefault(state.source, Window([])).samples.append((float(elapsed), state))
    if not windows:
        failed = f" ({errors} failed)" if errors else ""
        raise NoScrapes(f"{path} holds no scrapes{failed}: a timeline is the JSONL file kvbench watch writes", errors)
    return Timeline(path, windows, errors, torn, url)


def during(window: Window, start_s: float, end_s: float) -> Window | None:
    """The scrapes taken while a load ran from ``start_s`` to ``end_s``, after the last one before it (the base
    of the counters); None when none was taken during it. The scrapes after the load would show the server idle."""
    before = [sample for sample in window.samples if sample[0] < start_s]
    inside = [sample for sample in window.samples if start_s <= sample[0] <= end_s]
    return Window(before[-1:] + inside) if inside else None


def diagnose_timeline(
    location: str | Path, thresholds: Thresholds, load_window_s: tuple[float, float] | None = None
) -> Diagnosis:
    """The live rules over a timeline's scrapes; with ``load_window_s`` (seconds on the timeline's clock) over
    those taken while a load ran (a sweep point against a server), so gauges are read under the load."""
    timeline = read_timeline(location)
    if load_window_s is not None:
        trimmed = {source: during(w, *load_window_s) for source, w in timeline.windows.items()}
        kept = {source: w for source, w in trimmed.items() if w is not None}
        if kept:
            timeline.windows = kept
    scrapes = max(len(w.samples) for w in timeline.windows.values())
    span = max(w.span_s for w in timeline.windows.values())
    notes = [
        f"timeline of {scrapes} scrape(s) over {seconds(span)}" + (f" from {timeline.url}" if timeline.url else "")
    ]
    if timeline.errors:
        notes.append(f"{timeline.errors} scrape(s) failed during the watch and are left out")
    if timeline.torn:
        notes.append("the last line was cut short (the watch was killed while writing) and is left out")
    return diagnose_windows(list(timeline.windows.values()), thresholds, str(timeline.path), notes)
