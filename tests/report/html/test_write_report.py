"""When a run writes its report.html: at its end unless KVBENCH_REPORT=0, and never at the cost of its results."""

from __future__ import annotations

import pytest

from kvbench.cli import main
from kvbench.report.html import REPORT_FILE

ARGS = ["waste", "--requests", "50", "--strategies", "contiguous-max,paged", "--json"]


@pytest.mark.parametrize(
    "value, written, warned",
    [("1", True, False), ("0", False, False), ("off", False, False), ("maybe", True, True)],
)
def test_the_end_of_a_run_writes_the_report_unless_told_not_to(tmp_path, monkeypatch, capsys, value, written, warned):
    monkeypatch.setenv("KVBENCH_REPORT", value)
    assert main([*ARGS, "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / REPORT_FILE).exists() == written
    assert (tmp_path / "run" / "summary.json").exists()
    assert ("neither 0 nor 1" in capsys.readouterr().err) == warned


def test_a_report_that_fails_costs_the_run_nothing(tmp_path, monkeypatch, capsys):
    import kvbench.report.html.waste_page as waste_page

    def broken(run):
        raise RuntimeError("a bug in the page")

    monkeypatch.setenv("KVBENCH_REPORT", "1")
    monkeypatch.setattr(waste_page, "build", broken)
    assert main([*ARGS, "--out", str(tmp_path / "run")]) == 0  # the run's results and exit code stand
    err = capsys.readouterr().err
    assert "warning: " in err and "report.html not written (RuntimeError: a bug in the page)" in err
    assert f"kvbench report {tmp_path / 'run'}" in err
    assert (tmp_path / "run" / "summary.json").exists() and not (tmp_path / "run" / REPORT_FILE).exists()


def test_the_last_line_names_report_html_only_when_this_run_wrote_it(tmp_path, monkeypatch, capsys):
    """A page that failed is not announced, even where an earlier run left one in the same directory."""
    import kvbench.report.html.waste_page as waste_page

    monkeypatch.setenv("KVBENCH_REPORT", "1")
    monkeypatch.setenv("COLUMNS", "400")
    run = tmp_path / "run"
    args = ["waste", "--requests", "50", "--strategies", "contiguous-max,paged", "--out", str(run)]
    assert main(args) == 0
    assert f"wrote {run}/ (report.html, summary.json" in capsys.readouterr().out

    def broken(run):
        raise RuntimeError("a bug in the page")

    monkeypatch.setattr(waste_page, "build", broken)
    assert main(args) == 0
    captured = capsys.readouterr()
    assert "report.html not written" in captured.err
    assert f"wrote {run}/ (summary.json" in captured.out and "report.html," not in captured.out
