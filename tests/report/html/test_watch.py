"""The watch's report, from a timeline alone: the peak KV usage, the diagnosis over time, the plot, the scrapes."""

from __future__ import annotations

from report_page import by_id, parse, section_ids, table_rows

from kvbench.report.diagnose import read_states
from kvbench.report.html import write_report
from kvbench.results.watch_records import append_records, error_record, header_record, sample_records

URL = "http://127.0.0.1:8000/metrics"


def test_a_watch_timeline_becomes_a_page(tmp_path, vllm_exposition):
    folder = tmp_path / "watch"
    folder.mkdir()
    timeline = folder / "timeline.jsonl"
    append_records(timeline, [header_record(URL, 1.0)])
    for elapsed, usage, waiting in ((0.0, 0.2, 0), (1.0, 0.5, 4), (2.0, 0.95, 9)):
        append_records(
            timeline,
            sample_records(
                elapsed,
                URL,
                read_states(vllm_exposition(usage=usage, waiting=waiting, waiting_capacity=waiting)),
            ),
        )
    append_records(timeline, [error_record(3.0, URL, "cannot scrape: timed out")])
    written = write_report(folder)
    assert written.path == folder / "report.html"
    page = parse(written.path.read_text())
    assert section_ids(page) == ["headline", "findings", "plots", "points", "provenance"]
    assert by_id(page, "verdict-headline").text() == (
        "KV cache usage peaked at 95.0% (vLLM engine=0 model_name=smollm2-135m-instruct-hf) over 3 scrapes in 2.0 s"
    )
    assert "1 scrape(s) failed and are left out." in by_id(page, "verdict").text()
    assert by_id(page, "findings").find("li") is not None  # the queue grew: the rules say so
    assert [f.attrs["data-plot"] for f in page.find_all("figure")] == ["watch.png"]
    scrapes = by_id(page, "scrapes-1").find("tbody").find_all("tr")
    assert [row.find("td").text() for row in scrapes] == ["0.0", "1.0", "2.0"]
    (row,) = table_rows(page, "headline-table")
    assert (
        row["instance"] == "vLLM engine=0 model_name=smollm2-135m-instruct-hf"
        and row["scrapes"] == "3"
        and row["usage_peak"] == "95.0"
    )
    assert row["usage_mean"] == "55.0" and row["waiting_peak"] == "9"
    facts = {dt.text(): dd.text() for dt, dd in zip(page.find_all("dt"), page.find_all("dd"), strict=True)}
    assert facts["endpoint"] == URL and facts["scrape interval"] == "1 s" and "kvbench version" in facts
