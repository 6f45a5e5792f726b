"""The watch timeline's header line, typed: written as it always was, read back, and a first line that is not a
header (a scrape, a torn or missing file) read as none."""

from __future__ import annotations

import json

from kvbench.results.watch_records import KIND, WatchHeader, append_records, header_record, read_header

URL = "http://127.0.0.1:8000/metrics"


def test_the_header_line_keeps_its_keys_and_reads_back(tmp_path):
    record = header_record(URL, 0.5)
    assert list(record) == ["kind", "version", "url", "interval_s", "started", "meta"]
    assert record["kind"] == KIND and record["meta"]["command"].startswith("kvbench")
    line = json.loads(json.dumps(record))
    header = WatchHeader.from_json(line)
    assert header is not None and header.url == URL and header.interval_s == 0.5
    assert header.to_json() == line and json.dumps(header.to_json()) == json.dumps(line)
    timeline = tmp_path / "timeline.jsonl"
    append_records(timeline, [record])
    assert read_header(timeline) == header


def test_an_older_header_reads_with_nothing_it_lacks():
    header = WatchHeader.from_json({"kind": KIND, "url": URL, "meta": "not a mapping"})
    assert header == WatchHeader(URL, None, None, {}, None)


def test_a_first_line_that_is_no_header_reads_as_none(tmp_path):
    assert WatchHeader.from_json({"elapsed_s": 0.0, "time": 1.0, "url": URL, "error": "timed out"}) is None
    assert WatchHeader.from_json([KIND]) is None
    assert read_header(tmp_path / "missing.jsonl") is None
    torn = tmp_path / "torn.jsonl"
    torn.write_text('{"kind": "kvbench-watch", "ur')
    assert read_header(torn) is None
