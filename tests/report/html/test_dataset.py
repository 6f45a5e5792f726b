"""The dataset run's report: the waste a max-len reservation implies, and the length table."""

from __future__ import annotations

import json

from report_page import by_id, parse, table_rows

from kvbench.report.html import REPORT_FILE


def test_the_headline_is_the_max_len_waste_of_summary_json(dataset_run):
    summary = json.loads((dataset_run / "summary.json").read_text())
    page = parse((dataset_run / REPORT_FILE).read_text())
    contiguous = next(p for p in summary["points"] if p["engine"] == "contiguous-max")
    assert by_id(page, "verdict-headline").text() == (
        f"A max-len reservation (2,048 tokens) would leave {contiguous['waste_pct']:.1f}% of its slots unwritten "
        "on these requests"
    )
    rows = table_rows(page, "headline-table")
    assert [(r["engine"], r["waste_pct"]) for r in rows] == [
        (p["engine"], f"{p['waste_pct']:.1f}%") for p in summary["points"]
    ]
    lengths = by_id(page, "lengths-table").find("tbody").find_all("tr")
    assert [row.find("td").text() for row in lengths] == ["prompt", "output", "total"]
    assert [f.attrs["data-plot"] for f in page.find_all("figure")] == ["lengths.png"]
