"""The waste run's report: effective usage per strategy against the article's estimate, equal to summary.json."""

from __future__ import annotations

import json

from report_page import by_id, parse, table_rows

from kvbench.report.html import REPORT_FILE


def test_the_headline_is_summary_json_in_words(waste_run):
    summary = json.loads((waste_run / "summary.json").read_text())
    page = parse((waste_run / REPORT_FILE).read_text())
    points = {p["engine"]: p for p in summary["points"]}
    best = max(
        (p for p in summary["points"] if p["engine"].startswith("paged")),
        key=lambda p: p["effective_usage_pct"],
    )
    worst = points["contiguous-max"]
    assert by_id(page, "verdict-headline").text() == (
        f"Effective KV memory usage: {best['engine']} {best['effective_usage_pct']:.1f}%, contiguous-max "
        f"{worst['effective_usage_pct']:.1f}%"
    )
    analytic = summary["analytic"]
    assert f"= {analytic['at_mean_len_pct']:.1f}% of its slots wasted" in by_id(page, "verdict").text()
    rows = table_rows(page, "headline-table")
    assert [r["engine"] for r in rows] == [p["engine"] for p in summary["points"]]
    for row in rows:
        point = points[row["engine"]]
        assert row["effective_usage_pct"] == f"{point['effective_usage_pct']:.1f}"  # % of the pool, as headed
        for key in ("token_state_pct", "reservation_pct", "internal_pct", "external_pct", "free_pct"):
            assert row[f"waste.{key}"] == f"{point['waste'][key]:.1f}"
        assert row["peak_running"] == f"{point['peak_running']:,}"
    assert [f.attrs["data-plot"] for f in page.find_all("figure")] == ["waste.png"]
    facts = {dt.text(): dd.text() for dt, dd in zip(page.find_all("dt"), page.find_all("dd"), strict=True)}
    assert facts["model shape"] == (
        "llama, 40 layers, hidden 5,120, 40 heads (40 KV heads) × 128, 13.02 B parameters, "
        "fp16: 800.00 KiB of KV per token"
    )
    assert facts["gpu memory utilization"] == "0.9"
