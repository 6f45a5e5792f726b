"""The share run's report: the memory saved by sharing, as summary.json has it."""

from __future__ import annotations

import json

from report_page import by_id, parse, section_ids, table_rows

from kvbench.report.html import REPORT_FILE


def test_the_headline_is_the_saving_of_summary_json(share_run):
    summary = json.loads((share_run / "summary.json").read_text())
    page = parse((share_run / REPORT_FILE).read_text())
    saved = summary["savings"]
    assert by_id(page, "verdict-headline").text() == (
        f"Block sharing saved {saved['saved_by_sharing_pct_mean']:.1f}% of KV memory (step-averaged; "
        f"{saved['saved_by_sharing_pct_peak']:.1f}% at peak) for parallel sampling of width 2"
    )
    assert "The samples were identical with and without sharing." in by_id(page, "verdict").text()
    rows = table_rows(page, "headline-table")
    assert [(r["engine"], r["peak_blocks"]) for r in rows] == [
        (p["engine"], f"{p['peak_blocks']:,}") for p in summary["points"]
    ]
    assert section_ids(page) == ["headline", "plots", "provenance"]  # no diagnosis rule reads a share run
    assert [f.attrs["data-plot"] for f in page.find_all("figure")] == ["share.png"]
