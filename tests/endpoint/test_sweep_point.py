"""An endpoint point as a sweep point: vLLM's names, the server's figures in extra, unknown stays None."""

from __future__ import annotations

import json

import pytest
from fake_server import serve_in_thread

from kvbench.endpoint.client import Target
from kvbench.endpoint.client_metrics import client_metrics
from kvbench.endpoint.load import ClosedLoop, OpenLoop
from kvbench.endpoint.run_point import PointSettings, run_point_sync
from kvbench.endpoint.server_metrics import point_server_metrics
from kvbench.endpoint.sweep_point import sweep_point
from kvbench.endpoint.workloads import shared_prefix
from kvbench.results.client_figures import ClientMetrics
from kvbench.results.endpoint_figures import CacheReset, ServerMetrics, is_endpoint_point
from kvbench.results.schema import LATENCY_FIELDS


def _conversations(n: int = 8):
    return shared_prefix(groups=2, per_group=n // 2, prefix_len=32, suffix_len=8, output_len=6, vocab_size=500, seed=1)


def test_a_closed_loop_point_maps_onto_the_schema_with_the_servers_figures():
    with serve_in_thread(itl_s=0.03, capacity_blocks=40) as server:  # ~0.2 s a request: scrapes during the load
        measured = run_point_sync(
            Target(server.url, name="fake"),
            _conversations(),
            PointSettings(ClosedLoop(4), scrape_interval_s=0.02, slo={"ttft": 10_000}),
        )
    point = sweep_point(measured, "fake", 4, "article", {"ttft": 10_000}).to_json()
    assert is_endpoint_point(point) and point["engine"] == "fake" and point["concurrency"] == 4
    assert point["status"] == "ok" and point["completed"] == 8 and point["failed"] == 0
    assert point["total_output_tokens"] == 8 * 6 and point["server_generation_tokens"] == 48
    for name in LATENCY_FIELDS:  # every schema latency, p50 from vLLM's median
        assert name in point
    assert point["p50_ttft_ms"] == measured.metrics.latency("p50_ttft_ms")
    assert point["p99_tpot_ms"] == measured.metrics.latency("p99_tpot_ms")
    assert 0 < point["kv_usage_peak"] <= 1 and point["prefix_cache_queries"] > 0
    assert point["prefix_cache_hit_rate"] == pytest.approx(point["prefix_cache_hits"] / point["prefix_cache_queries"])
    assert point["request_goodput"] == pytest.approx(point["request_throughput"]) and point["slo"] == {"ttft": 10_000}
    assert point["kv_pool_bytes"] is None and point["effective_usage_pct"] is None  # unknown over HTTP
    assert "request_rate" not in point and point["endpoint"]["load"]["pattern"] == "closed"
    # the client's metrics typed and written back key for key (with an SLO: slo_ms)
    client, raw = measured.metrics, client_metrics(measured.records, measured.duration_s, {"ttft": 10_000})
    assert json.dumps(ClientMetrics.from_json(raw).to_json()) == json.dumps(raw) == json.dumps(client.to_json())
    assert client.slo_ms == {"ttft": 10_000} and client.latency("p50_ttft_ms") == client.latencies["median_ttft_ms"]
    # the server's metrics too: what point_server_metrics made of the scrapes, key for key
    server = point_server_metrics(measured.scrapes, measured.duration_s).to_json()
    assert measured.server is not None and measured.server.block_size is not None
    assert json.dumps(ServerMetrics.from_json(server).to_json()) == json.dumps(server)
    assert json.dumps(measured.server.to_json()) == json.dumps(server)


def test_failed_requests_mark_the_point_and_say_how_many_of_each_kind():
    with serve_in_thread(faults=["", "500", "429"]) as server:
        measured = run_point_sync(
            Target(server.url, name="flaky"),
            _conversations(6),
            PointSettings(OpenLoop(100.0, max_concurrency=2), scrape=False),
        )
    point = sweep_point(measured, "flaky", 0, "article").to_json()
    assert point["status"] == "error" and point["request_rate"] == 100.0
    assert point["completed"] == 2 and point["failed"] == 4 and point["failed_by_kind"] == {"http": 4}
    assert point["error"].startswith("4 of 6 requests failed: http 4")
    assert point["kv_usage_peak"] is None and point["preemptions"] is None  # no scrape: unknown, never 0
    assert measured.metrics.slo_ms is None and "slo_ms" not in measured.metrics.to_json()


def test_the_cache_state_a_point_found():
    assert CacheReset.from_json({"asked": True, "reset": True}).state == "reset"
    assert CacheReset.from_json({"asked": True, "reset": False}).state == "unknown"
    assert CacheReset.from_json({"asked": True, "reset": None}).state == "unknown"
    assert CacheReset.from_json({"asked": False, "reset": None}).state == "warm"
