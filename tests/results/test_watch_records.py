"""The watch timeline's lines, typed: the header and the scrapes written as they always were and read back, a first
line that is not a header (a scrape, a torn or missing file) read as none, a line that is no scrape refused."""

from __future__ import annotations

import json

import pytest

from kvbench.results.servers import read_states
from kvbench.results.watch_records import (
    KIND,
    WatchHeader,
    WatchScrape,
    append_records,
    error_record,
    header_record,
    read_header,
    sample_records,
)

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


def test_scrape_lines_keep_their_keys_and_read_back(vllm_exposition):
    (state,) = read_states(vllm_exposition(usage=0.5, waiting=3))
    (line,) = json.loads(json.dumps(sample_records(2.5, URL, [state])))
    assert list(line) == ["elapsed_s", "time", "url", "state"]
    scrape = WatchScrape.from_json(line)
    assert scrape.elapsed_s == 2.5 and scrape.error is None and scrape.state is not None
    assert scrape.state.usage == 0.5 and scrape.state.waiting == 3
    assert json.dumps(scrape.to_json()) == json.dumps(line)
    failed = json.loads(json.dumps(error_record(3.0, URL, "cannot scrape: timed out")))
    assert list(failed) == ["elapsed_s", "time", "url", "error"]
    assert WatchScrape.from_json(failed).to_json() == failed and WatchScrape.from_json(failed).state is None


@pytest.mark.parametrize("line", [{"time": 1.0, "url": URL, "error": "x"}, {"elapsed_s": 1.0, "url": URL}])
def test_a_line_that_is_no_scrape_is_refused(line):
    with pytest.raises(ValueError, match="not a scrape"):
        WatchScrape.from_json(line)


@pytest.mark.parametrize("elapsed", [float("nan"), 1e300, -2e9, "soon"])
def test_a_state_at_no_finite_time_is_refused_and_a_failed_scrape_is_kept(vllm_exposition, elapsed):
    (state,) = read_states(vllm_exposition())
    with pytest.raises(ValueError, match="not a finite number of seconds"):
        WatchScrape.from_json({"elapsed_s": elapsed, "url": URL, "state": state.record()})
    assert WatchScrape.from_json({"elapsed_s": elapsed, "url": URL, "error": "x"}).error == "x"
