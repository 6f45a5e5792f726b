"""The client's series on the scrapes' time axis, by hand."""

from __future__ import annotations

import pytest

from kvbench.endpoint.record import RequestRecord
from kvbench.endpoint.scraper import Scrape
from kvbench.endpoint.timeline import client_series, point_timeline


def test_client_series_by_hand():
    origin = 1000.0
    a = RequestRecord(0, 0, start=1000.0, end=1000.9, ok=True, token_times=[0.2, 0.4, 0.6, 0.8], output_tokens=8)
    b = RequestRecord(1, 0, start=1000.5, end=1001.2, ok=True, token_times=[0.1, 0.6], output_tokens=2)
    c = RequestRecord(2, 0, start=1000.1, end=1000.3).fail("http", "x", 500)
    d = RequestRecord(3, 0, start=1001.2, end=1001.2).fail("not_sent", "stopped")
    series = client_series([a, b, c, d], origin, end_s=1.2, bin_s=0.5)
    assert series["t_s"] == [0.0, 0.5, 1.0]
    # a: 2 tokens per event at 0.2, 0.4 | 0.6, 0.8; b: 1 per event at 0.6 | 1.1
    assert series["output_tokens_per_s"] == pytest.approx([4 / 0.5, 5 / 0.5, 1 / 0.5])
    assert series["completed_per_s"] == pytest.approx([0, 2.0, 2.0])  # a at 0.9; b at 1.2 (the last bin's end)
    assert series["failed_per_s"] == pytest.approx([2.0, 0, 2.0])
    # in flight at 0.25: a and c; at 0.75: a and b; at 1.25: none (d was never sent)
    assert series["in_flight"] == [2, 2, 0]


def test_the_document():
    record = RequestRecord(0, 0, start=5.0, end=5.4, ok=True, token_times=[0.1, 0.3], output_tokens=2)
    doc = point_timeline(
        [record], [Scrape(-0.1, error="x"), Scrape(0.2)], origin=5.0, end_s=0.4, bin_s=0.2, meta={"target": "t"}
    )
    assert doc["version"] == 1 and doc["meta"] == {"target": "t"} and doc["bin_s"] == 0.2
    assert doc["client"]["output_tokens_per_s"] == pytest.approx([5.0, 5.0])
    assert doc["server"][0] == {"elapsed_s": -0.1, "error": "x"} and doc["server"][1]["kv_usage"] is None
    with pytest.raises(ValueError):
        client_series([record], 5.0, end_s=float("nan"), bin_s=0.2)
