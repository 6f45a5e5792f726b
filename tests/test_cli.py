"""The entry point's last line of defence: system errors become one line and a non-zero exit."""

from __future__ import annotations

import errno

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
