"""Outputs replace only regular files that the command does not read; run directories (received from others)
never make kvbench read outside them; their text is drawn as text. One error line, exit 2, nothing damaged."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from kvbench.cli import main
from kvbench.errors import KvbenchError
from kvbench.fileio import run_file, write_text_atomic
from kvbench.report.html import write_report
from kvbench.report.run_input import read_run_json


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("paths") / "sweep"
    args = ["sweep", "--simulate", "--requests", "12", "--concurrency", "2", "--out", str(out), "--json"]
    assert main(args) == 0
    return out


@pytest.fixture(scope="module")
def fleet_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("paths") / "fleet"
    assert main(["fleet", "--simulate", "--instances", "2", "--requests", "20", "--out", str(out), "--json"]) == 0
    return out


@pytest.fixture()
def sweep_copy(sweep_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(sweep_run, copy)
    return copy


def one_error_line(capfd) -> str:
    captured = capfd.readouterr()
    err = captured.err.strip()
    assert err.startswith("error: ") and len(err.splitlines()) == 1, err
    return err


def test_an_output_never_replaces_a_pipe_or_a_link(sweep_copy, tmp_path, capfd):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    assert main(["report", str(sweep_copy), "--out", str(pipe)]) == 2
    assert "not a regular file" in one_error_line(capfd)
    assert pipe.is_fifo()
    target = tmp_path / "elsewhere.txt"
    target.write_text("keep me")
    link = tmp_path / "link.html"
    link.symlink_to(target)
    assert main(["compare", str(sweep_copy), str(sweep_copy), "--html", str(link)]) == 2
    assert "symbolic link" in one_error_line(capfd)
    assert link.is_symlink() and target.read_text() == "keep me"


def test_the_one_writer_refuses_what_is_not_a_regular_file(tmp_path):
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(KvbenchError, match="not a regular file"):
        write_text_atomic(pipe, "x")
    assert pipe.is_fifo()


def test_an_output_never_replaces_what_the_command_reads(sweep_copy, capfd):
    summary = sweep_copy / "summary.json"
    before = summary.read_bytes()
    assert main(["report", str(sweep_copy), "--out", str(summary)]) == 2
    assert "which this command reads" in one_error_line(capfd)
    timeline = next(sweep_copy.glob("timeline-*.json"))
    assert main(["report", str(sweep_copy), "--out", str(timeline)]) == 2
    one_error_line(capfd)
    assert main(["compare", str(sweep_copy), str(sweep_copy), "--html", str(summary)]) == 2
    one_error_line(capfd)
    assert main(["compare", str(sweep_copy), str(sweep_copy), "--output", str(summary)]) == 2
    one_error_line(capfd)
    assert summary.read_bytes() == before
    assert main(["report", str(sweep_copy)]) == 0


def test_a_summary_linked_from_outside_is_refused(sweep_run, tmp_path, capfd):
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").symlink_to(sweep_run / "summary.json")
    assert main(["report", str(run)]) == 2
    assert "leads outside the run directory" in one_error_line(capfd)


def test_a_timeline_linked_from_outside_is_refused(sweep_copy, tmp_path, capfd):
    outside = tmp_path / "secret.json"
    outside.write_text(json.dumps({"title": "SECRET"}))
    timeline = next(sweep_copy.glob("timeline-*.json"))
    timeline.unlink()
    timeline.symlink_to(outside)
    assert main(["report", str(sweep_copy)]) == 2
    assert "leads outside the run directory" in one_error_line(capfd)


@pytest.mark.parametrize("name", ["/etc/hostname", "../outside.json", "a/../../b.json", "..", "", None, 7])
def test_names_from_run_files_never_build_paths(tmp_path, name):
    with pytest.raises(KvbenchError):
        run_file(tmp_path, name)
    with pytest.raises(KvbenchError):
        read_run_json(tmp_path, name)


def test_a_fleet_policy_name_cannot_reach_outside(fleet_run, tmp_path, capfd):
    run = tmp_path / "fleet"
    shutil.copytree(fleet_run, run)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "fleet.json").write_text(json.dumps({"policy": "SECRET"}))
    summary = json.loads((run / "summary.json").read_text())
    summary["points"][0]["policy"] = "/../../../outside/fleet"
    (run / "summary.json").write_text(json.dumps(summary))
    code = main(["report", str(run)])
    err = capfd.readouterr().err
    assert code == 2 and "is not the name of a file in the run directory" in err
    assert "SECRET" not in (run / "report.html").read_text() if (run / "report.html").exists() else True


def test_deeply_nested_series_files_are_not_a_traceback(fleet_run, sweep_copy, tmp_path):
    nested = "[" * 100_000 + "]" * 100_000
    for path in sweep_copy.glob("timeline-*.json"):
        path.write_text(nested)
    assert write_report(sweep_copy).size_bytes > 0
    run = tmp_path / "fleet"
    shutil.copytree(fleet_run, run)
    for path in run.glob("fleet-*.json"):
        path.write_text(nested)
    assert write_report(run).size_bytes > 0


def test_dollar_signs_in_names_are_drawn_as_text(sweep_copy):
    summary = json.loads((sweep_copy / "summary.json").read_text())
    summary["meta"]["scenario"] = "$\\frac{1}{0}$ and $unclosed"  # drawn in every plot's title
    summary["meta"]["model_name"] = "$^^^$"
    summary["meta"]["device"] = "a$b"
    (sweep_copy / "summary.json").write_text(json.dumps(summary))
    page = write_report(sweep_copy)
    assert page.size_bytes > 0


def test_a_pipe_given_or_planted_as_a_run_file_is_refused_not_waited_on(sweep_copy, tmp_path, capfd):
    """Opening a FIFO for reading waits for a writer for ever: every JSON from outside must be a regular file."""
    pipe = tmp_path / "summary.json"
    os.mkfifo(pipe)
    for args in (["diagnose", str(pipe)], ["compare", str(pipe), str(sweep_copy)]):
        assert main(args) == 2, args
        assert "is not a regular file" in one_error_line(capfd)
    assert main(["report", str(pipe)]) == 2
    assert "is not a run directory" in one_error_line(capfd)
    assert main(["diagnose", str(sweep_copy), "--thresholds", str(pipe)]) == 2
    assert "is not a regular file" in one_error_line(capfd)
    assert main(["compare", str(pipe), str(sweep_copy), "--update-baseline"]) == 2  # nothing to read, nowhere to write
    err = one_error_line(capfd)
    assert "no usable baseline" in err and "is not a regular file" in err
    (sweep_copy / "summary.json").unlink()
    os.mkfifo(sweep_copy / "summary.json")  # planted in a run directory: no summary to read
    assert main(["diagnose", str(sweep_copy)]) == 2
    assert "no summary.json" in one_error_line(capfd)


def test_a_resume_never_reads_or_appends_through_links_leaving_the_run(sweep_copy, tmp_path, capfd):
    """results.jsonl and sweep-config.json linked to files elsewhere: the resume is refused, the files untouched."""
    for name in ("results.jsonl", "sweep-config.json"):
        run = tmp_path / f"run-{name}"
        shutil.copytree(sweep_copy, run)
        outside = tmp_path / f"outside-{name}"
        (run / name).rename(outside)
        (run / name).symlink_to(outside)
        before = outside.read_bytes()
        args = ["sweep", "--simulate", "--requests", "12", "--concurrency", "2,4", "--out", str(run), "--resume"]
        assert main(args) == 2, name
        assert "leads outside the run directory" in one_error_line(capfd)
        assert outside.read_bytes() == before


def test_the_one_appender_refuses_a_link_and_a_pipe(tmp_path):
    from kvbench.fileio import append_jsonl

    target = tmp_path / "elsewhere.jsonl"
    target.write_text('{"a": 1}\n')
    link = tmp_path / "results.jsonl"
    link.symlink_to(target)
    with pytest.raises(KvbenchError, match="symbolic link"):
        append_jsonl(link, {"b": 2})
    pipe = tmp_path / "pipe.jsonl"
    os.mkfifo(pipe)
    with pytest.raises(KvbenchError):
        append_jsonl(pipe, {"b": 2})
    assert target.read_text() == '{"a": 1}\n' and pipe.is_fifo()
    append_jsonl(tmp_path / "new.jsonl", {"c": 3})
    assert (tmp_path / "new.jsonl").read_text() == '{"c": 3}\n'
