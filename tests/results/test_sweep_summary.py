"""A sweep's summary.json typed: the shipped baseline and a sweep of servers over HTTP read and written back byte for
byte, and an older summary without the article's table or the findings still read."""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.results.sweep_summary import SweepSummary

BASELINE = Path(__file__).resolve().parents[2] / "reports" / "baseline" / "sweep" / "summary.json"
CPU_RUN = Path(__file__).resolve().parents[1] / "report" / "data" / "article-interleaved-a.json"
ENDPOINT_RUN = Path(__file__).parent / "data" / "endpoint_sweep_summary.json"  # sweep --target --find-max


def test_shipped_summaries_round_trip_byte_for_byte():
    for path in (BASELINE, CPU_RUN):
        text = path.read_text()
        document = json.loads(text)
        summary = SweepSummary.from_json(document)
        assert json.dumps(summary.to_json(), indent=2) == json.dumps(document, indent=2)
        assert summary.meta.scenario == document["meta"]["scenario"]
        assert [row.concurrency for row in summary.article_table or []] == [
            row["concurrency"] for row in document["article_table"]
        ]
        assert [p.engine for p in summary.typed_points] == [p["engine"] for p in document["points"]]


def test_an_older_summary_without_table_or_findings_keeps_them_out():
    document = json.loads(BASELINE.read_text())
    del document["article_table"], document["findings"]
    summary = SweepSummary.from_json(document)
    assert summary.article_table is None and summary.findings is None
    assert list(summary.to_json()) == ["schema_version", "kind", "meta", "points"]
    empty = SweepSummary.from_json({"meta": {}, "points": [], "article_table": []})
    assert empty.article_table == [] and empty.to_json()["article_table"] == []


def test_a_sweep_of_servers_reads_its_searches_and_writes_them_back_byte_for_byte():
    text = ENDPOINT_RUN.read_text()
    document = json.loads(text)
    summary = SweepSummary.from_json(document)
    assert json.dumps(summary.to_json(), indent=2) == json.dumps(document, indent=2)
    assert list(summary.to_json()) == ["schema_version", "kind", "meta", "endpoint", "findings", "points"]
    assert summary.endpoint is not None and summary.article_table is None
    (search,) = summary.endpoint.find_max
    assert search.engine == document["endpoint"]["find_max"][0]["engine"] and summary.endpoint.slo == {"e2el": 600000.0}
    assert summary.findings == document["findings"]
    assert SweepSummary.from_json(json.loads(BASELINE.read_text())).endpoint is None
