"""`kvbench compare` through the CLI: exit codes 0/1/2, formats, --output, --update-baseline, every run kind."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from kvbench.cli import main


def write_run(root: Path, name: str, paged_throughput: float, internal_pct: float = 4.0, **timing: float) -> Path:
    """A two-point sweep; ``timing`` adds each point's ``duration`` and ``cpu_time_s``."""

    def point(engine: str, throughput: float, internal: float) -> dict:
        return {
            "engine": engine,
            "concurrency": 10,
            "scenario": "article",
            "status": "ok",
            "completed": 40,
            "output_throughput": throughput,
            "waste": {"internal_pct": internal},
            **timing,
        }

    summary = {
        "schema_version": 1,
        "kind": "sweep",
        "meta": {"command": "kvbench sweep"},
        "points": [point("paged", paged_throughput, internal_pct), point("contiguous", 32.0, 40.0)],
    }
    run = root / name
    run.mkdir(parents=True)
    (run / "summary.json").write_text(json.dumps(summary))
    return run


def test_unchanged_run_exits_zero_with_markdown(tmp_path, capsys):
    base, head = write_run(tmp_path, "base", 41.0), write_run(tmp_path, "head", 40.5)
    assert main(["compare", str(base), str(head), "--verbose"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("**kvbench compare: PASS")
    assert "| point | metric | base | head | change | verdict | rule |" in out


def test_the_terminal_gets_a_few_lines_and_where_the_full_table_is(tmp_path, capsys):
    base, head = write_run(tmp_path, "base", 41.0), write_run(tmp_path, "head", 41.0, internal_pct=8.0)
    assert main(["compare", str(base), str(head)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("kvbench compare: FAIL - 1 regressed") and len(lines) <= 6
    assert any(line.startswith("  regressed: paged c=10") and "waste.internal_pct" in line for line in lines)
    assert lines[-1] == "the full table: --verbose, or --output FILE (Markdown)"


def test_a_point_too_short_to_time_is_reported_not_failed_and_a_long_drop_still_fails(tmp_path, capsys):
    """Two ci-smoke runs of the same code failed with 3 regressions: their points ran well under a second, where
    a few scheduler stalls decide the throughput. Judged only where a point ran long enough to time."""
    drop = {"paged_throughput": 10.0}  # paged/contiguous x4.1 lower: beyond a single run's x2.5
    base = write_run(tmp_path, "base", 41.0, duration=0.3, cpu_time_s=0.3)
    head = write_run(tmp_path, "head", **drop, duration=0.4, cpu_time_s=0.4)
    assert main(["compare", str(base), str(head)]) == 0
    out = capsys.readouterr().out
    assert "PASS" in out and "too short to judge on this machine" in out
    rule = "paged_over_contiguous_output_throughput:5%"  # an explicit rule still gates it
    assert main(["compare", str(base), str(head), "--fail-on", rule]) == 1
    long_base = write_run(tmp_path, "long-base", 41.0, duration=30.0, cpu_time_s=29.0)
    long_head = write_run(tmp_path, "long-head", **drop, duration=30.0, cpu_time_s=29.0)
    assert main(["compare", str(long_base), str(long_head)]) == 1
    assert main(["compare", str(base), str(head), "--min-duration", "0.1"]) == 1


def test_machines_loaded_differently_are_named(tmp_path, capsys):
    base = write_run(tmp_path, "base", 41.0, duration=10.0, cpu_time_s=9.8)
    head = write_run(tmp_path, "head", 40.0, duration=10.0, cpu_time_s=4.5)
    assert main(["compare", str(base), str(head)]) == 0
    assert (
        "note: the machines were loaded differently: base's engines had a core for 98% of their steps' time, "
        "head's for 45%" in capsys.readouterr().out
    )
    for run in (base, head):  # two threads: CPU seconds count per core (a quiet 2-thread run read 199%)
        summary = json.loads((run / "summary.json").read_text())
        summary["meta"]["threads"] = {"threads": 2, "reason": "measured"}
        for point in summary["points"]:
            point["cpu_time_s"] *= 2
        (run / "summary.json").write_text(json.dumps(summary))
    assert main(["compare", str(base), str(head)]) == 0
    assert "had a core for 98% of their steps' time, head's for 45%" in capsys.readouterr().out


def test_regression_exits_one(tmp_path, capsys):
    base, head = write_run(tmp_path, "base", 41.0), write_run(tmp_path, "head", 41.0, internal_pct=8.0)
    assert main(["compare", str(base), str(head)]) == 1
    assert "waste.internal_pct" in capsys.readouterr().out


def test_fail_on_sets_a_threshold(tmp_path, capsys):
    base, head = write_run(tmp_path, "base", 41.0), write_run(tmp_path, "head", 37.0)  # ratio -9.8%
    assert main(["compare", str(base), str(head)]) == 0  # within a single measured run's noise
    for threshold, code in (("5%", 1), ("10%", 0)):
        rule = f"paged_over_contiguous_output_throughput:{threshold}"
        assert main(["compare", str(base), str(head), "--fail-on", rule]) == code


def test_unusable_input_exits_two_with_one_line(tmp_path, capsys):
    base = write_run(tmp_path, "base", 41.0)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "summary.json").write_text('{"schema_version": 7, "kind": "sweep", "points": []}')
    for args in (
        [str(base), str(tmp_path / "absent")],
        [str(base), str(broken)],
        [str(base), str(base), "--fail-on", "output_throughput"],
        [str(base), str(base), "--alpha", "2"],
    ):
        assert main(["compare", *args]) == 2
        captured = capsys.readouterr()
        assert captured.err.startswith("error: ") and captured.err.count("\n") == 1
        assert captured.out == ""


def test_junit_output_file_and_summary_line(tmp_path, capsys):
    base, head = write_run(tmp_path, "base", 41.0), write_run(tmp_path, "head", 12.0)  # ratio x3.4 lower
    report = tmp_path / "compare.xml"
    assert main(["compare", str(base), str(head), "--format", "junit", "--output", str(report)]) == 1
    assert capsys.readouterr().out.startswith("kvbench compare: FAIL - 1 regressed")
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1"
    assert int(suite.get("tests")) == len(suite.findall("testcase"))


@pytest.mark.parametrize(("value", "shown"), [('"fast"', "'fast'"), ("NaN", "nan"), ("true", "True"), ("1e999", "inf")])
def test_a_corrupted_base_metric_is_unusable_input(tmp_path, capsys, value, shown):
    base, head = write_run(tmp_path, "base", 41.0), write_run(tmp_path, "head", 41.0)
    text = (base / "summary.json").read_text().replace('"completed": 40', f'"completed": {value}', 1)
    (base / "summary.json").write_text(text)
    assert main(["compare", str(base), str(head)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(
        f"error: {base / 'summary.json'}: point paged c=10 article: metric completed is {shown}"
    )


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("concurrency", -2, "has concurrency -2, below 0 (0 is an open-loop point)"),
        ("output_throughput", -5.0, "metric output_throughput is -5.0, negative"),
        ("completed", 1.5, "metric completed is 1.5, not a whole number of at least 0"),
        ("completed", -1, "metric completed is -1, not a whole number of at least 0"),
        ("status", "exploded", "status is 'exploded', not one of ok, oom, error"),
        ("waste", {"internal_pct": 150.0}, "metric waste.internal_pct is 150.0, outside 0-100 (a percentage)"),
        ("fragmentation_mean", 3.0, "metric fragmentation_mean is 3.0, outside 0-1 (a fraction)"),
        ("p99_ttft_ms", -1.0, "metric p99_ttft_ms is -1.0, negative"),
    ],
)
@pytest.mark.parametrize("side", ["base", "head"])
def test_a_point_field_outside_its_meaning_is_unusable_input(tmp_path, capsys, field, value, said, side):
    """Not data to judge (a FAIL, exit 1): a summary no kvbench writes (exit 2), whichever side holds it."""
    runs = {"base": write_run(tmp_path, "base", 41.0), "head": write_run(tmp_path, "head", 41.0)}
    summary = json.loads((runs[side] / "summary.json").read_text())
    summary["points"][0][field] = value
    (runs[side] / "summary.json").write_text(json.dumps(summary))
    assert main(["compare", str(runs["base"]), str(runs["head"]), "--absolute"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert captured.err.startswith(f"error: {runs[side] / 'summary.json'}: point ") and said in captured.err, (
        captured.err
    )


def test_a_null_base_metric_fails_with_a_note(tmp_path, capsys):
    base, head = write_run(tmp_path, "base", 41.0), write_run(tmp_path, "head", 41.0)
    text = (base / "summary.json").read_text().replace('"completed": 40', '"completed": null', 1)
    (base / "summary.json").write_text(text)
    assert main(["compare", str(base), str(head)]) == 1
    assert "base has no value" in capsys.readouterr().out


def test_json_and_table_formats(tmp_path, capsys):
    base, head = write_run(tmp_path, "base", 41.0), write_run(tmp_path, "head", 41.0)
    assert main(["compare", str(base), str(head), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["failed"] is False
    assert main(["compare", str(base), str(head), "--format", "table"]) == 0
    assert "kvbench compare: PASS" in capsys.readouterr().out


def test_update_baseline_reports_then_replaces_base(tmp_path, capsys):
    base, head = write_run(tmp_path, "base", 41.0), write_run(tmp_path, "head", 12.0)
    assert main(["compare", str(base), str(head), "--update-baseline"]) == 0
    captured = capsys.readouterr()
    assert "regressed" in captured.out and "baseline updated" in captured.err
    assert (base / "summary.json").read_bytes() == (head / "summary.json").read_bytes()


def test_update_baseline_creates_a_fresh_baseline(tmp_path, capsys):
    head = write_run(tmp_path, "head", 41.0)
    fresh = tmp_path / "reports" / "baseline" / "sweep"
    assert main(["compare", str(fresh), str(head), "--update-baseline"]) == 0
    assert (fresh / "summary.json").read_bytes() == (head / "summary.json").read_bytes()
    assert "no usable baseline" in capsys.readouterr().err


def test_help_documents_the_baseline_procedure(capsys):
    assert main(["compare", "--help"]) == 0
    out = capsys.readouterr().out
    assert "--update-baseline" in out and "--fail-on" in out


def test_unwritable_output_is_one_line_error(tmp_path, capsys):
    import json as _json

    summary = {
        "schema_version": 1,
        "kind": "waste",
        "meta": {},
        "points": [{"engine": "paged-16", "concurrency": 1, "scenario": "waste", "status": "ok", "completed": 1}],
    }
    path = tmp_path / "s.json"
    path.write_text(_json.dumps(summary))
    assert main(["compare", str(path), str(path), "-o", "/proc/no/such/file"]) == 2
    err = capsys.readouterr().err.strip()
    assert (
        err == "error: --output /proc/no/such/file: the folder /proc/no/such does not exist; create it first or "
        "choose another path"
    )


SHARE = ["--requests", "2", "--prompt-len", "8", "--output-len", "8", "--device", "cpu"]
RUN_KINDS = {
    "waste": ["waste", "--requests", "50"],
    "share-n": ["share", "--n", "2", *SHARE],
    "share-beam": ["share", "--beam", "2", *SHARE],
    "sweep-simulated": ["sweep", "--simulate", "--requests", "40", "--concurrency", "10,30"],
}


@pytest.mark.parametrize("kind", RUN_KINDS)
def test_two_runs_of_a_deterministic_kind_pass(tmp_path, capsys, kind):
    """waste, share and a simulated sweep are deterministic: two runs with the same settings pass."""
    runs = [tmp_path / name for name in ("a", "b")]
    for run in runs:
        assert main([*RUN_KINDS[kind], "--out", str(run), "--json"]) == 0
    capsys.readouterr()
    assert main(["compare", str(runs[0]), str(runs[1]), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["counts"]["unchanged"] == len(report["rows"]) > 0
    assert report["simulated"] is (kind in ("waste", "sweep-simulated"))


def test_a_measured_sweep_passes_against_itself(tmp_path, capsys):
    run = tmp_path / "smoke"
    assert main(["sweep", "--scenario", "ci-smoke", "--out", str(run), "--json"]) == 0
    capsys.readouterr()
    assert main(["compare", str(run), str(run), "--format", "json"]) == 0
    report = json.loads(capsys.readouterr().out)
    short = {row["metric"] for row in report["rows"] if "too short to judge" in row["note"]}
    assert "paged_over_contiguous_output_throughput" in short  # ci-smoke's points run well under 2 s
    assert main(["compare", str(run), str(run), "--format", "json", "--min-duration", "0"]) == 0
    report = json.loads(capsys.readouterr().out)
    judged = {row["metric"] for row in report["rows"] if row["verdict"] == "unchanged"}
    assert {
        "completed",
        "kv_peak_allocated_bytes",
        "waste.internal_pct",
        "paged_over_contiguous_output_throughput",
    } <= judged
    assert {row["metric"] for row in report["rows"] if row["verdict"] == "info"} == {
        f"paged_over_contiguous_p99_{kind}_ms" for kind in ("ttft", "tpot", "itl", "e2el")
    }
