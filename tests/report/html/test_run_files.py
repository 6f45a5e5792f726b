"""What a report is built from, and the one-line errors for what it cannot be built from."""

from __future__ import annotations

import json

import pytest

from kvbench.cli import main
from kvbench.errors import KvbenchError
from kvbench.report.html import build_page
from kvbench.report.html.run_files import load_run


def test_a_run_directory_its_summary_or_a_timeline(waste_run, tmp_path):
    assert load_run(waste_run).kind == "waste"
    assert load_run(waste_run / "summary.json").directory == waste_run
    assert [p.name for p in load_run(waste_run).files()] == ["summary.json"]
    (tmp_path / "timeline.jsonl").write_text("")
    assert load_run(tmp_path).kind == "watch"


@pytest.mark.parametrize(
    "setup, message",
    [
        (lambda d: None, "is not a run directory: it holds neither summary.json nor timeline.jsonl"),
        (
            lambda d: (d / "results.jsonl").write_text("{}\n"),
            "has results.jsonl but no summary.json: the run did not finish",
        ),
        (lambda d: (d / "summary.json").write_text("{"), "is not valid JSON"),
        (
            lambda d: (d / "summary.json").write_text(
                json.dumps({"schema_version": 1, "kind": "sweep", "meta": {}, "points": "x"})
            ),
            "'points' must be a list",
        ),
        (
            lambda d: (d / "summary.json").write_text(
                json.dumps({"schema_version": 1, "kind": "mystery", "meta": {}, "points": []})
            ),
            "no report for runs of kind 'mystery'",
        ),
        (
            lambda d: (d / "summary.json").write_text(
                json.dumps(
                    {
                        "schema_version": 1,
                        "kind": "dataset",
                        "meta": {"dataset": {"path": "x.json", "counted_by": "words"}},
                        "points": [],
                    }
                )
            ),
            "cannot build its report",
        ),
    ],
)
def test_bad_input_is_one_line(tmp_path, capsys, setup, message):
    setup(tmp_path)
    with pytest.raises(KvbenchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build_page(tmp_path)
    assert main(["report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "report.html").exists()


def test_a_missing_directory_and_an_unwritable_out(tmp_path, waste_run, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "no such run directory" in capsys.readouterr().err
    assert main(["report", str(waste_run), "--out", str(tmp_path)]) == 2
    assert "is a directory" in capsys.readouterr().err
