"""compare's report: the verdict first, then each judged metric with base, head, ratio and why."""

from __future__ import annotations

from report_page import by_id, parse, section_ids, table_rows

from kvbench.report.compare import Row, Verdict
from kvbench.report.html.compare_page import ratio, why
from kvbench.results.summary_load import PointKey

KEY = PointKey("paged", 4, "quick")


def test_why_says_how_each_metric_was_judged():
    assert why(Row(KEY, "completed", Verdict.REGRESSED, 6, 5, "exact")) == (
        "judged exactly: deterministic for the same seed and settings"
    )
    assert why(Row(KEY, "fragmentation_mean", Verdict.UNCHANGED, 0.1, 0.11, "x1.6 (min 0.001)")) == (
        "timing-dependent: judged within ×1.6 (min 0.001) of base"
    )
    assert (
        why(
            Row(
                KEY,
                "paged_over_contiguous_output_throughput",
                Verdict.INFO,
                1.0,
                1.2,
                "not gated",
                note="single run: too noisy to gate",
            )
        )
        == "reported, not gated; single run: too noisy to gate"
    )
    assert why(Row(KEY, "output_throughput", Verdict.REGRESSED, 100, 60, "x1.35", p_value=0.0286)) == (
        "timing-dependent: judged within ×1.35 of base; Mann-Whitney U p = 0.0286"
    )
    assert why(Row(KEY, "status", Verdict.REGRESSED, "ok", "oom", "ok > oom > error")).startswith("a point's status")
    assert ratio(Row(KEY, "completed", Verdict.REGRESSED, 6, 5, "exact")) == 5 / 6
    assert ratio(Row(KEY, "rejected", Verdict.UNCHANGED, 0, 0, "exact")) is None
    assert ratio(Row(KEY, "status", Verdict.UNCHANGED, "ok", "ok")) is None


def test_the_compare_page_leads_with_the_verdict(compare_report, sweep_run, regressed_head, capsys):
    import json

    from kvbench.cli import main

    page = parse(compare_report.read_text())
    assert section_ids(page) == ["headline", "plots", "points", "provenance"]
    assert main(["compare", str(sweep_run), str(regressed_head), "--format", "json"]) == 1
    judged = json.loads(capsys.readouterr().out)
    regressed = [r for r in judged["rows"] if r["verdict"] == "regressed"]
    assert by_id(page, "verdict-headline").text() == (
        f"FAIL: {len(regressed)} regressed of {len(judged['rows'])} compared metrics"
    )
    changed = table_rows(page, "headline-table")
    completed = next(r for r in changed if r["metric"] == "completed")
    assert completed["point"] == "paged c=4 quick" and completed["verdict"] == "regressed"
    assert completed["base"] == "6" and completed["head"] == "5" and completed["ratio"] == "×0.83"
    assert completed["why"] == "judged exactly: deterministic for the same seed and settings"
    unchanged = [r for r in judged["rows"] if r["verdict"] == "unchanged"]
    assert len(table_rows(page, "metrics-table")) == len(judged["rows"]) - len(unchanged)
    assert len(table_rows(page, "unchanged-table")) == len(unchanged) > 0  # drawn closed, one click away
    assert by_id(page, "unchanged-table").parent.parent.tag == "details"
    assert [f.attrs["data-plot"] for f in page.find_all("figure")] == [
        "compare_throughput.png",
        "compare_ratio.png",
    ]
    assert by_id(page, "provenance-base") and by_id(page, "provenance-head")
