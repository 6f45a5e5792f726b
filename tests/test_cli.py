"""The entry point's last line of defence: system errors become one line and a non-zero exit."""

from __future__ import annotations

import errno
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, published as tomli
    import tomli as tomllib

from kvbench.cli import main
from kvbench.commands import _run as run_module
from kvbench.studies import waste as waste_study


def test_a_full_disk_is_one_line_not_a_traceback(tmp_path, monkeypatch, capsys):
    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "r" / "summary.json"))

    monkeypatch.setattr(run_module, "write_summary", full)  # the one tail every study writes through
    assert main(["waste", "--requests", "20", "--out", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: No space left on device: {tmp_path / 'r' / 'summary.json'}"


def test_running_out_of_memory_is_one_line(monkeypatch, capsys):
    def hungry(*args, **kwargs):
        raise MemoryError

    monkeypatch.setattr(waste_study, "run_strategy", hungry)
    assert main(["waste", "--requests", "20", "--out", "/tmp/kvbench-oom-test"]) == 2
    assert capsys.readouterr().err.strip().startswith("error: out of memory")


def test_the_version_is_pyprojects(capsys):
    """The version is written once, in pyproject.toml; the package reads it from its installed metadata."""
    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text(encoding="utf-8"))
    assert main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"kvbench {project['project']['version']}"
