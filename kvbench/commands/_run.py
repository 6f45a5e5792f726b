"""What a command does around its study, written once.

- A :class:`Run` (``sweep``, ``fleet``) opens a :class:`RunDirectory` (created or reused, locked) and runs its
  body under :meth:`Run.guarded`: Ctrl-C becomes exit 130 after the command's own interrupt note, a bad-input
  error before anything was measured leaves no empty run directory or lock behind, and live metrics and engine
  processes are let go however it ends.
- Every command ends the same way (:func:`show`): the finished document as JSON on stdout with ``--json``,
  else its tables; a one-shot study (``waste``, ``share``, ``dataset``) writes its run directory first
  (:func:`write_study`: a plot, ``summary.json/csv/md``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol, TypeVar

import typer

from kvbench.errors import KvbenchError
from kvbench.fileio import DirectoryLock, json_text
from kvbench.report.rundir import flatten, new_run_dir, write_summary


class RunDirectory:
    """A run's directory: ``out_dir`` (or a fresh one under reports/), locked against a second writer."""

    def __init__(self, kind: str, out_dir: Path | None) -> None:
        self.created = out_dir is None or not out_dir.exists()
        self.path = new_run_dir(kind, out_dir)
        self.lock = DirectoryLock(self.path, f"kvbench {kind}")

    def release(self) -> None:
        self.lock.release()

    def discard(self) -> None:
        """Undo what a run that measured nothing left: its lock file, and the directory if this run made it and
        it is empty."""
        self.lock.release()
        (self.path / DirectoryLock.FILE).unlink(missing_ok=True)
        if self.created:
            try:
                self.path.rmdir()
            except OSError:  # not empty: something else is in it
                pass


class Run:
    """One run of a command: its directory once made, the points measured so far, and what it holds (live
    metrics, engine processes) to let go at the end."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.dir: RunDirectory | None = None
        self.points: list[dict] = []
        self._let_go: list[Callable[[], None]] = []

    def open(self, out_dir: Path | None) -> Path:
        self.dir = RunDirectory(self.kind, out_dir)
        return self.dir.path

    @property
    def opened(self) -> RunDirectory:
        """Its directory, made by :meth:`open` (which a command calls before it measures)."""
        assert self.dir is not None, "Run.open comes first"
        return self.dir

    def hold(self, let_go: Callable[[], None]) -> None:
        """Call ``let_go`` when the run ends, however it ends (the last held first)."""
        self._let_go.append(let_go)

    @contextmanager
    def guarded(self, on_interrupt: Callable[[], None]) -> Iterator[None]:
        """The body of a run. Ctrl-C: ``on_interrupt`` (say what was kept, write what finished), then exit 130;
        an error while no point is measured discards the run directory; what the run holds is let go last."""
        try:
            yield
        except KeyboardInterrupt:
            on_interrupt()
            raise typer.Exit(code=130) from None
        except KvbenchError:
            if self.dir is not None and not self.points:
                self.dir.discard()
            raise
        finally:
            for let_go in reversed(self._let_go):
                let_go()


def show(document: dict, as_json: bool, tables: Callable[[], None]) -> None:
    """The finished document as JSON on stdout, or its tables."""
    if as_json:
        typer.echo(json_text(document))
    else:
        tables()


class JsonForm(Protocol):
    def to_json(self) -> dict[str, Any]: ...


class StudyResult(JsonForm, Protocol):
    """What a one-shot study found: ``summary.json``'s document, whose points are ``summary.csv``'s rows."""

    @property
    def points(self) -> Sequence[JsonForm]: ...


Study = TypeVar("Study", bound=StudyResult)


def write_study(
    kind: str,
    out_dir: Path | None,
    result: Study,
    as_json: bool,
    *,
    plot: Callable[[Study, Path], Any],
    plot_file: str,
    markdown: Callable[[Study], str],
    tables: Callable[[Path], None],
    flat_rows: bool = True,
) -> Path:
    """A one-shot study's run directory (its plot, ``summary.json/csv/md``), then its document shown."""
    document = result.to_json()
    points = [p.to_json() for p in result.points]
    run_dir = new_run_dir(kind, out_dir)
    plot(result, run_dir / plot_file)
    rows = [flatten(p) for p in points] if flat_rows else points
    write_summary(run_dir, document, rows, markdown(result))
    show(document, as_json, lambda: tables(run_dir))
    return run_dir
