"""Whole points against the fake server: the load and /metrics side by side, the prefix-cache reset and hit
rate, warm-up, and servers that misbehave, die or lose their /metrics. Nothing hangs; every request is
accounted for."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from fake_server import config_json, serve_in_thread

from kvbench.endpoint.client import RequestLimits, Target
from kvbench.endpoint.load import ClosedLoop, OpenLoop
from kvbench.endpoint.run_point import EndpointUnusable, PointSettings, run_point_sync
from kvbench.endpoint.timeline import write_watch_timeline
from kvbench.endpoint.workloads import multi_turn, shared_prefix
from kvbench.errors import KvbenchError
from kvbench.report.diagnose.thresholds import Thresholds
from kvbench.report.diagnose.watch_timeline import diagnose_timeline
from kvbench.results.endpoint_timeline import EndpointTimeline

FAST = RequestLimits(timeout_s=10.0, stall_s=1.0, connect_s=2.0)


def settings(pattern, **kw) -> PointSettings:
    kw.setdefault("limits", FAST)
    kw.setdefault("scrape_interval_s", 0.05)
    return PointSettings(pattern, **kw)


def test_a_closed_loop_point_is_seen_by_the_server_as_c_in_flight():
    workload = shared_prefix(groups=2, per_group=6, prefix_len=32, suffix_len=8, output_len=8, vocab_size=500, seed=1)
    warmup = shared_prefix(groups=1, per_group=2, prefix_len=32, suffix_len=8, output_len=4, vocab_size=500, seed=9)
    with serve_in_thread(ttft_s=0.02, itl_s=0.01) as server:
        point = run_point_sync(
            Target(server.url),
            workload,
            settings(ClosedLoop(3), warmup=warmup, reset_prefix_cache=True, slo={"ttft": 1000, "tpot": 1000}),
        )
        assert server.state.max_running == 3 and server.state.resets == 1
        assert server.state.count == 14  # 2 warm-up + 12
        # kept-alive connections, as a real client's: one per request in flight, and the one the scraper shares
        assert len(server.state.peers) <= 3 + 1
    m = point.metrics
    assert point.status == "ok" and (m.completed, m.failed) == (12, 0)
    assert m.total_output_tokens == 96 and m.total_input_tokens == 12 * 40
    assert m.request_goodput == pytest.approx(m.request_throughput)
    assert point.warmup == {"requests": 2, "completed": 2, "failed": 0, "failures": []}
    assert point.cache_reset["reset"] is True and point.model == "fake-model"
    s = point.server
    assert s.families == ["vllm"] and s.running_peak == 3 and s.scrapes_failed == 0
    # the cache was emptied after the warm-up: each group's first request misses, the 5 others hit their
    # 2 shared blocks of 16 tokens; suffixes never fill a block
    assert s.prefix_cache_queries == 12 * 40 and s.prefix_cache_hits == 2 * 5 * 32
    assert s.prefix_cache_hit_rate == pytest.approx(320 / 480)
    assert s.server_generation_tokens == 96 and s.server_ttft_count == 12
    assert point.agreement.output_tokens_client_over_server == 1.0
    assert 0 <= point.agreement.mean_ttft_client_minus_server_ms < 1000  # the client's includes HTTP
    assert s.notes == []
    json.dumps(point.as_json())  # JSON-ready
    timeline = point.timeline()
    assert sum(timeline.client.output_tokens_per_s) * timeline.bin_s == pytest.approx(96)
    assert max(timeline.client.in_flight) == 3
    assert [row.elapsed_s for row in timeline.server] == sorted(row.elapsed_s for row in timeline.server)
    assert json.dumps(EndpointTimeline.from_json(timeline.to_json()).to_json()) == json.dumps(timeline.to_json())


def test_without_a_reset_a_warm_cache_shows_in_the_hit_rate():
    workload = shared_prefix(groups=1, per_group=4, prefix_len=16, suffix_len=4, output_len=2, vocab_size=500, seed=1)
    with serve_in_thread() as server:
        point = run_point_sync(Target(server.url), workload, settings(ClosedLoop(1), warmup=workload[:1]))
    assert point.cache_reset == {"asked": False, "reset": None, "route": None, "detail": "not asked"}
    assert point.server.prefix_cache_hits == 4 * 16  # the warm-up left the prefix in the cache


def test_a_reset_the_server_does_not_offer_is_recorded_as_such():
    workload = shared_prefix(groups=1, per_group=2, prefix_len=16, suffix_len=4, output_len=2, vocab_size=500, seed=1)
    with serve_in_thread(offer_reset=False) as server:
        point = run_point_sync(Target(server.url), workload, settings(ClosedLoop(1), reset_prefix_cache=True))
    assert point.cache_reset["reset"] is False and "not offered" in point.cache_reset["detail"]
    assert "VLLM_SERVER_DEV_MODE=1" in point.cache_reset["detail"]


def test_an_open_loop_point_with_a_cap():
    workload = shared_prefix(groups=1, per_group=20, prefix_len=4, suffix_len=4, output_len=4, vocab_size=500, seed=2)
    with serve_in_thread(itl_s=0.01) as server:
        point = run_point_sync(
            Target(server.url), workload, settings(OpenLoop(rate=400.0, burstiness=0.5, max_concurrency=2, seed=4))
        )
        assert server.state.max_running <= 2
    assert point.metrics.completed == 20 and point.peak_in_flight == 2
    assert point.load == {"pattern": "open", "rate": 400.0, "burstiness": 0.5, "max_concurrency": 2, "seed": 4}


def test_multi_turn_conversations_resend_their_history():
    conversations = multi_turn(conversations=3, turns=3, user_len=5, output_len=3, seed=0, groups=1, system_len=4)
    with serve_in_thread() as server:
        point = run_point_sync(Target(server.url, api="chat"), conversations, settings(ClosedLoop(2)))
        bodies = server.state.bodies
    assert point.metrics.completed == 9
    third = [b for b in bodies if len(b["messages"]) == 6]
    assert len(third) == 3
    for body in third:
        roles = [m["role"] for m in body["messages"]]
        assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
        first, second = body["messages"][2]["content"], body["messages"][4]["content"]
        earlier = [b for b in bodies if len(b["messages"]) < 6 and b["messages"][1] == body["messages"][1]]
        assert len(earlier) == 2  # turns 1 and 2 of the same conversation, answered with what we resend
        assert first.startswith(" w") and second.startswith(" w") and first != second


def test_misbehaving_requests_are_each_accounted_for_and_the_point_goes_on():
    faults = ["", "500", "429", "stall", "close", "malformed", "error_event", "no_done", "json", ""]
    workload = shared_prefix(groups=1, per_group=20, prefix_len=4, suffix_len=4, output_len=6, vocab_size=500, seed=3)
    with serve_in_thread(faults=faults, itl_s=0.005, stall_s=30.0) as server:
        began = time.perf_counter()
        point = run_point_sync(Target(server.url), workload, settings(ClosedLoop(4), limits=RequestLimits(stall_s=1.0)))
        took = time.perf_counter() - began
    m = point.metrics
    assert took < 20.0 and point.status == "failed"  # a hang would wait for the server's 30 s stalls
    assert m.requests == 20 and m.completed + m.failed == 20 and m.completed == 4
    assert m.failed_by_kind == {"http": 4, "stall": 2, "disconnect": 4, "malformed": 4, "server_error": 2}
    assert len(point.records) == 20 and {(r.conversation, r.turn) for r in point.records} == {(i, 0) for i in range(20)}


def test_a_server_killed_during_a_point():
    process = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("fake_server.py")), config_json(itl_s=0.05, announce=True)],
        stdout=subprocess.PIPE,
        text=True,
    )

    def kill_once_four_stream():  # the server says when each request arrives; 40 tokens take it 2 s
        for line in process.stdout:
            if line.startswith("REQUEST 3"):
                time.sleep(0.2)
                process.kill()
                return

    try:
        port = int(process.stdout.readline().split()[1])
        workload = shared_prefix(
            groups=1, per_group=12, prefix_len=4, suffix_len=4, output_len=40, vocab_size=500, seed=0
        )
        killer = threading.Thread(target=kill_once_four_stream, daemon=True)
        killer.start()
        began = time.perf_counter()
        point = run_point_sync(Target(f"http://127.0.0.1:{port}"), workload, settings(ClosedLoop(4)))
        took = time.perf_counter() - began
    finally:
        process.kill()
        process.wait(10)
    m = point.metrics
    assert took < 30.0 and m.requests == 12 and m.completed == 0 and m.failed == 12
    # the 4 in flight when it died broke off; the refills fail to connect, or (a kept-alive connection the dead
    # server held) break off at once
    assert set(m.failed_by_kind) == {"disconnect", "connect"} and m.failed_by_kind["disconnect"] >= 4
    assert all(r.end - r.start < 3.0 for r in point.records if r.error_kind == "connect")  # refused at once
    assert point.server.scrapes_failed >= 1 and point.server.scrapes > point.server.scrapes_failed


@pytest.mark.parametrize("how", ["metrics_fail_after", "metrics_stall_after"])
def test_a_metrics_endpoint_that_disappears(how):
    workload = shared_prefix(groups=1, per_group=8, prefix_len=4, suffix_len=4, output_len=10, vocab_size=500, seed=0)
    with serve_in_thread(itl_s=0.02, stall_s=30.0, **{how: 5}) as server:
        began = time.perf_counter()
        point = run_point_sync(Target(server.url), workload, settings(ClosedLoop(2), scrape_interval_s=0.1))
        took = time.perf_counter() - began
    s = point.server
    assert point.metrics.completed == 8 and took < 25.0
    assert s.scrapes_failed >= 1 and s.scrape_errors
    assert "no scrape after the load: counters end at the last scrape during it" in s.notes
    assert s.running_peak == 2  # from the scrapes that worked


def test_every_warm_up_request_failing_stops_the_point_with_the_reason():
    workload = shared_prefix(groups=1, per_group=2, prefix_len=4, suffix_len=4, output_len=2, vocab_size=500, seed=0)
    with serve_in_thread(faults=["500"]) as server:
        with pytest.raises(EndpointUnusable, match="every warm-up request failed .http 500: planned 500"):
            run_point_sync(Target(server.url), workload, settings(ClosedLoop(1), warmup=workload))
    with serve_in_thread(refuse_ignore_eos=True) as server:
        with pytest.raises(EndpointUnusable, match="refuses ignore_eos"):
            run_point_sync(Target(server.url), workload, settings(ClosedLoop(1), warmup=workload))


def test_token_ids_cannot_go_to_the_chat_api():
    workload = shared_prefix(groups=1, per_group=1, prefix_len=4, suffix_len=4, output_len=2, vocab_size=500, seed=0)
    with pytest.raises(KvbenchError, match="chat API takes text"):
        run_point_sync(Target("http://127.0.0.1:9", api="chat"), workload, settings(ClosedLoop(1)))


def test_a_point_timeline_in_watch_format_is_judged_by_diagnose(tmp_path):
    workload = shared_prefix(groups=1, per_group=6, prefix_len=4, suffix_len=4, output_len=10, vocab_size=500, seed=0)
    with serve_in_thread(itl_s=0.02) as server:
        point = run_point_sync(Target(server.url), workload, settings(ClosedLoop(2)))
    path = write_watch_timeline(tmp_path / "timeline.jsonl", point.target["metrics_url"], 0.05, point.scrapes)
    diagnosis = diagnose_timeline(path, Thresholds())
    assert diagnosis.findings is not None and f"timeline of {len(point.scrapes)} scrape(s)" in diagnosis.notes[0]


def test_the_api_key_reaches_the_server_and_no_result(monkeypatch):
    monkeypatch.setenv("KVBENCH_TEST_KEY", "sk-never-in-results")
    workload = shared_prefix(groups=1, per_group=2, prefix_len=4, suffix_len=4, output_len=2, vocab_size=500, seed=0)
    with serve_in_thread(api_key="sk-never-in-results") as server:
        point = run_point_sync(Target(server.url, api_key_env="KVBENCH_TEST_KEY"), workload, settings(ClosedLoop(1)))
        unkeyed = run_point_sync(Target(server.url, api_key_env=None), workload, settings(ClosedLoop(1)))
    assert point.metrics.completed == 2 and unkeyed.metrics.failed_by_kind == {"http": 2}
    text = json.dumps([point.as_json(), point.timeline().to_json(), [r.as_json(with_text=True) for r in point.records]])
    assert "sk-never-in-results" not in text and '"api_key_env": "KVBENCH_TEST_KEY"' in text
