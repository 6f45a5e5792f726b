"""A server point's timeline file, typed: files ``kvbench sweep --target`` wrote (one with the server's KV events,
one whose every scrape failed) read back key for key, and an older file without its KV events or a series read as
empty."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.results.endpoint_timeline import ClientSeries, EndpointTimeline, ScrapeRow

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("name", ["endpoint_timeline_kv_events.json", "endpoint_timeline_failed_scrapes.json"])
def test_a_written_timeline_reads_back_key_for_key(name):
    data = json.loads((DATA / name).read_text())
    assert json.dumps(EndpointTimeline.from_json(data).to_json()) == json.dumps(data)


def test_its_parts_are_typed():
    events = EndpointTimeline.from_json(json.loads((DATA / "endpoint_timeline_kv_events.json").read_text()))
    assert events.kv_events is not None and events.kv_events.resident_blocks[-1] == 33
    assert events.meta["load"] == {"pattern": "trace"} and events.bin_s > 0
    assert events.usage_rows and all(row.error is None and row.total_blocks == 512.0 for row in events.usage_rows)
    failed = EndpointTimeline.from_json(json.loads((DATA / "endpoint_timeline_failed_scrapes.json").read_text()))
    assert failed.kv_events is None and failed.server and failed.usage_rows == []
    assert all(row.error is not None and "503" in row.error for row in failed.server)
    assert ScrapeRow(1.0, "down").to_json() == {"elapsed_s": 1.0, "error": "down"}


def test_an_older_timeline_reads_what_it_has():
    timeline = EndpointTimeline.from_json({"server": [{"elapsed_s": 0.1, "kv_usage": 0.3}]})
    assert timeline.bin_s == 0.0 and timeline.client == ClientSeries() and timeline.kv_events is None
    (row,) = timeline.usage_rows
    assert row.kv_usage == 0.3 and row.waiting is None and row.total_blocks is None
