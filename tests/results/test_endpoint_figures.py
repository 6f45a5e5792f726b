"""A server point's own fields, typed: points written by ``kvbench sweep --target`` (closed and open loop, a trace
with KV events, --repeat, failed requests, a target hit rate, a time limit, failed scrapes) read and written back
key for key, and older or partial points read with the values the reports used for a missing field."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.results.endpoint_figures import (
    Agreement,
    CacheReset,
    EndpointFigures,
    LoadShape,
    ServerFigures,
    ServerMetrics,
    failure_text,
    is_endpoint_point,
    slo_share,
)
from kvbench.results.find_max_search import EndpointSummary, Limit, Probe, Search
from kvbench.results.point import Point
from kvbench.results.prefix_reuse_figures import PrefixReuse

DATA = Path(__file__).parent / "data"
POINTS = [json.loads(line) for line in (DATA / "endpoint_points.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.parametrize("data", POINTS, ids=[f"{p['engine']}-{i}" for i, p in enumerate(POINTS)])
def test_a_written_point_reads_back_key_for_key(data):
    figures = EndpointFigures.from_json(data)
    written = figures.to_json()
    assert json.dumps(written) == json.dumps({key: value for key, value in data.items() if key in written})
    point = Point.from_json(data)
    assert EndpointFigures.of(point) == figures and is_endpoint_point(point) and is_endpoint_point(data)
    figures.store_in(point)  # every field already there: nothing moves
    assert json.dumps(point.to_json()) == json.dumps(data)


def test_the_written_points_parts_are_typed():
    trace, repeated, open_loop, failed, target, cut, unscraped = (EndpointFigures.from_json(p) for p in POINTS)
    assert trace.pattern == "trace" and trace.trace is not None and trace.trace.requests == 12
    assert trace.kv_events is not None and trace.kv_events.kv_blocks_stored == 33
    assert trace.cache_reset.reset is True and trace.cache_reset.state == trace.cache_state == "reset"
    assert trace.prefix_reuse is not None and trace.prefix_reuse.workload is not None
    assert trace.prefix_reuse.workload.block_size == 16 and trace.prefix_reuse.hit_rate_by_conversation is not None
    assert repeated.repeat_files == ["timeline-f-c2-run1.json", "timeline-f-c2-run2.json"]
    assert open_loop.request_rate == 50.0 and open_loop.endpoint.load.max_concurrency == 3
    assert failed.failed > 0 and failed.failed_by_kind and failed.failure_examples
    assert target.prefix_reuse is not None and target.prefix_reuse.target is not None
    assert target.prefix_reuse.target.met is True and target.prefix_reuse.target.rate == 0.5
    assert cut.stopped == 198 and cut.endpoint.stopped_at_deadline
    assert unscraped.scrapes is not None and unscraped.scrapes.scrapes_failed == unscraped.scrapes.scrapes
    assert unscraped.server.kv_usage_peak is None


def test_an_older_or_partial_point_reads_as_not_measured():
    figures = EndpointFigures.from_json({"engine": "vllm", "concurrency": 8, "endpoint": {"url": "http://h:8000"}})
    assert figures.endpoint.url == "http://h:8000" and figures.pattern is None and figures.request_rate is None
    assert figures.failed == 0 and figures.stopped == 0 and figures.failed_by_kind == {}
    assert figures.cache_state == "warm" and figures.cache_reset.state == "warm"
    assert figures.prefix_reuse is None and figures.kv_events is None and figures.trace is None
    assert figures.agreement == Agreement() and figures.server == ServerFigures() and figures.scrapes is None
    assert figures.timeline_file is None and figures.repeat_files is None
    # parts that are not objects (a hand-edited file) read as not recorded, not as an error
    odd = EndpointFigures.from_json({"endpoint": {"load": "closed"}, "prefix_reuse": [], "kv_events": 3, "trace": ""})
    assert odd.pattern is None and odd.prefix_reuse is None and odd.kv_events is None and odd.trace is None
    assert not is_endpoint_point({"engine": "paged", "concurrency": 8})
    reuse = PrefixReuse.from_json({"hit_rate_requests": "n/a", "workload": None})
    assert reuse.hit_rate_requests is None and reuse.workload is None and reuse.requests == 0


def test_each_load_shape_writes_its_own_fields():
    for data in (
        {"pattern": "closed", "concurrency": 4},
        {"pattern": "open", "rate": None, "burstiness": 1.0, "max_concurrency": None, "seed": 0},
        {"pattern": "trace"},
    ):
        assert LoadShape.from_json(data).to_json() == data
    # an open loop with every request at once has no rate, and still writes its request_rate
    written = EndpointFigures.from_json({"endpoint": {"load": {"pattern": "open", "rate": None}}}).to_json()
    assert "request_rate" in written and written["request_rate"] is None
    closed = EndpointFigures.from_json({"endpoint": {"load": {"pattern": "closed", "concurrency": 2}}}).to_json()
    assert "request_rate" not in closed


def test_repeats_of_the_server_figures_take_the_peaks_maximum_and_the_rest_s_mean():
    runs = [ServerFigures(kv_usage_peak=0.5, kv_usage_mean=0.2, waiting_peak=3), ServerFigures(kv_usage_peak=0.9)]
    combined = ServerFigures.combined(runs)
    assert combined.kv_usage_peak == 0.9 and combined.kv_usage_mean == 0.2 and combined.waiting_peak == 3.0
    assert isinstance(combined.waiting_peak, float) and combined.running_mean is None


def test_the_cache_state_the_failure_text_and_the_share_meeting_the_slo():
    assert CacheReset(asked=True, reset=False).state == "unknown" and CacheReset().state == "warm"
    text = failure_text(3, 17, {"timeout": 1, "http": 2}, ["HTTP 500 ..."])
    assert text == "3 of 20 requests failed: http 2, timeout 1 (e.g. HTTP 500 ...)"
    assert failure_text(1, 0, {"http": 1}, []) == "1 of 1 requests failed: http 1"
    point = Point.from_json({"engine": "s", "concurrency": 1, "request_throughput": 4.0, "request_goodput": 3.0})
    assert slo_share(point) == 0.75
    assert slo_share(Point.from_json({"engine": "s", "concurrency": 1, "request_throughput": 4.0})) is None


def test_a_find_max_summary_reads_back_key_for_key():
    endpoint = json.loads((DATA / "find_max_endpoint.json").read_text())
    summary = EndpointSummary.from_json(endpoint)
    assert json.dumps(summary.to_json()) == json.dumps(endpoint) and summary.slo == {"e2el": 600000.0}
    assert EndpointSummary.from_json({}) == EndpointSummary([], None)
    for data in endpoint["find_max"]:
        search = Search.from_json(data)
        assert json.dumps(search.to_json()) == json.dumps(data)
        assert search.best == 8.0 and search.limit is None and search.probes == [Probe(8.0, True, 1.0, "ok")]
    limited = Search("s", "rate", [Probe(4.0, False, 0.5, "ok")], None, 4.0, Limit("kv_full", "full", "more"), "x")
    assert Search.from_json(json.loads(json.dumps(limited.to_json()))) == limited
    assert limited.level_text(2.5) == "2.5 req/s" and Search("s", "concurrency").level_text(8.0) == "C=8"


def test_the_server_metrics_give_the_point_its_figures_and_scrape_counts():
    server = ServerMetrics.from_json({"scrapes": 5, "scrapes_failed": 1, "kv_usage_peak": 0.9, "running_peak": 4.0})
    assert server.block_size is None and server.notes == [] and server.preemptions is None
    assert server.figures() == ServerFigures(kv_usage_peak=0.9)
    counts = server.scrape_counts()
    assert (counts.scrapes, counts.scrapes_failed, counts.scrapes_during_load, counts.families) == (5, 1, 0, [])
    assert list(server.to_json())[:5] == ["scrapes", "scrapes_failed", "scrape_errors", "families", "engines"]
