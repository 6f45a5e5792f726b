"""``report.html``: one self-contained page per run, built from the run directory's files alone.

The end of every run and ``kvbench report RUN_DIR`` call :func:`write_report`, so both write the same page.
Each run kind has a builder (``BUILDERS``) that turns its files into a :class:`~kvbench.report.html.page.Page`:
the verdict first, then the findings of ``diagnose``, the plots (drawn by the run's own plot functions, kept in
memory), the per-point tables, the memory waterfall and the provenance. ``compare`` builds its page from a
``Comparison`` (:func:`write_compare_report`).
"""

from __future__ import annotations

import importlib
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from kvbench import env_settings
from kvbench.errors import KvbenchError
from kvbench.fileio import write_text_atomic

REPORT_FILE = "report.html"

# Run kind -> the module whose build(RunFiles) -> Page draws it.
BUILDERS = {
    kind: f"kvbench.report.html.{kind}_page"
    for kind in ("sweep", "waste", "share", "dataset", "fleet", "watch", "reuse")
}


@dataclass(frozen=True)
class Written:
    path: Path
    size_bytes: int
    seconds: float  # building and writing the page


def build_page(location: str | Path):
    """The page of the run at ``location`` (a run directory, its summary.json, or a watch timeline)."""
    from kvbench.report.html.run_files import load_run

    run = load_run(location)
    module = BUILDERS.get(run.kind)
    if module is None:
        raise KvbenchError(
            f"{run.directory}: this kvbench has no report for runs of kind {run.kind!r} (known: {', '.join(BUILDERS)})"
        )
    try:
        return importlib.import_module(module).build(run)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError, OverflowError) as err:
        _close_figures()
        # a summary edited by hand, or written by another version: say what is wrong, in one line
        raise KvbenchError(
            f"{run.directory}: cannot build its report, its files lack or mistype a field ({type(err).__name__}: {err})"
        ) from None


def _close_figures() -> None:
    """A plot that failed half drawn leaves its figure open: closed, so failures cannot pile figures up."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        pyplot.close("all")


def render_run(location: str | Path) -> str:
    from kvbench.report.html.render import render_page

    return render_page(build_page(location))


def write_report(location: str | Path, out: str | Path | None = None) -> Written:
    """Build the run's page and write it (atomically) to ``out``, by default ``report.html`` in the run."""
    start = time.perf_counter()
    text = render_run(location)
    path = Path(out) if out is not None else _run_directory(Path(location)) / REPORT_FILE
    write_text_atomic(path, text)
    return Written(path, len(text.encode("utf-8")), time.perf_counter() - start)


REPORT_ENV = "KVBENCH_REPORT"  # "0" (or off, false, no): runs skip report.html; kvbench report builds it later
_OFF, _ON = env_settings.OFF_WORDS, ("", *env_settings.ON_WORDS)


def report_after_runs() -> bool:
    """Whether runs end by writing report.html (``KVBENCH_REPORT``, on unless "0")."""
    value = (env_settings.read(REPORT_ENV) or "1").strip().lower()
    if value in _OFF:
        return False
    if value not in _ON:
        print(f"warning: {REPORT_ENV}={value!r} is neither 0 nor 1; writing report.html", file=sys.stderr)
    return True


_WRITTEN_AFTER_RUN: set[Path] = set()  # the run directories whose page this process wrote at the end of a run


def written_after_run(run_dir: Path) -> bool:
    """Whether this process wrote ``run_dir``'s page at the end of its run (the run's last line names it only
    then: a page that failed, or one left from an earlier run there, is not this run's)."""
    return run_dir.resolve() in _WRITTEN_AFTER_RUN


def write_report_after_run(run_dir: Path) -> Written | None:
    """At the end of a run, right after its summary is written: the report, or a one-line warning on stderr if
    it cannot be built (the run's results are already safe; ``kvbench report`` can build it later). None when
    it was not written (``KVBENCH_REPORT=0``, or it failed)."""
    _WRITTEN_AFTER_RUN.discard(run_dir.resolve())
    if not report_after_runs():
        return None
    try:
        written = write_report(run_dir)
        _WRITTEN_AFTER_RUN.add(run_dir.resolve())
        return written
    except Exception as err:  # a report must never cost a run its results, its plots or its exit code
        print(
            f"warning: {run_dir}/{REPORT_FILE} not written ({type(err).__name__}: {err}); "
            f"build it later with: kvbench report {run_dir}",
            file=sys.stderr,
        )
        return None


def write_compare_report(comparison, out: str | Path) -> Written:
    from kvbench.report.html.compare_page import build
    from kvbench.report.html.render import render_page

    start = time.perf_counter()
    text = render_page(build(comparison))
    path = write_text_atomic(out, text)
    return Written(path, len(text.encode("utf-8")), time.perf_counter() - start)


def _run_directory(location: Path) -> Path:
    return location.parent if location.is_file() else location
