"""``--find-max``: the bisection's answer and bound checked against a server whose limit is known, and the reason
it stops judged from scrapes made by hand (KV full, batch cap, prefill queue, compute, failures)."""

from __future__ import annotations

from typing import Any

import pytest

from kvbench.endpoint.scraper import Scrape
from kvbench.errors import KvbenchError
from kvbench.results.point import Point
from kvbench.results.servers import ServerState
from kvbench.studies.find_max import find_max, limit_of, meets_slo


def _point(meets: bool, **extra: Any) -> Point:
    return Point.from_json(_json(meets, **extra))


def _json(meets: bool, **extra: Any) -> dict[str, Any]:
    return {
        "engine": "s",
        "concurrency": 8,
        "status": "ok",
        "completed": 10,
        "request_throughput": 2.0,
        "request_goodput": 2.0 if meets else 1.0,
        "failed": 0,
        **extra,
    }


def _server(limit: float, calls: list[float]):
    def measure(level: float) -> tuple[Point, list[Scrape], float]:
        calls.append(level)
        return _point(level <= limit), [], 1.0

    return measure


@pytest.mark.parametrize("limit", [1, 2, 13, 31, 63])
def test_bisection_over_concurrency_finds_the_highest_level_meeting_the_slo(limit):
    calls: list[float] = []
    search = find_max("s", 1, 64, "concurrency", 10, 0.9, _server(limit, calls))
    assert search.best == limit and search.first_miss == limit + 1
    assert calls[:2] == [64, 1] and len(calls) == len(set(calls)) <= 10
    assert search.stopped == "bracket closed"
    assert [p.meets for p in search.probes] == [c <= limit for c in calls]


def test_the_point_budget_bounds_the_search_and_says_where_the_limit_lies():
    calls: list[float] = []
    search = find_max("s", 1, 1024, "concurrency", 4, 0.9, _server(700, calls))
    assert calls == [1024, 1, 512, 768] and search.best == 512 and search.first_miss == 768
    assert "between C=512 and C=768" in search.stopped


def test_the_ends_of_the_range():
    calls: list[float] = []
    top = find_max("s", 1, 8, "concurrency", 6, 0.9, _server(100, calls))
    assert top.best == 8 and calls == [8] and "raise it to look further" in top.stopped and top.limit is None
    calls.clear()
    none = find_max("s", 2, 8, "concurrency", 6, 0.9, _server(1, calls))
    assert none.best is None and none.first_miss == 2 and calls == [8, 2] and "even the lowest" in none.stopped


def test_bisection_over_rate_narrows_to_ten_percent():
    calls: list[float] = []
    search = find_max("s", 0.5, 32.0, "rate", 20, 0.9, _server(5.0, calls))
    assert search.best is not None and search.first_miss is not None
    assert search.best <= 5.0 < search.first_miss <= search.best * 1.1


def test_a_point_meets_the_slo_only_with_every_request_done_and_enough_within_it():
    assert meets_slo(_point(True), 0.9)
    assert not meets_slo(_point(False), 0.9)  # half the requests within the SLO
    assert meets_slo(_point(False), 0.5)
    assert not meets_slo(_point(True, status="error"), 0.9)
    with pytest.raises(KvbenchError, match="needs an SLO"):
        meets_slo(_point(True, request_goodput=None), 0.9)


def _scrapes(rows: list[tuple[float, float, float, float, float]], family: str = "vllm") -> list[Scrape]:
    """(elapsed s, KV usage, running, waiting, preemptions so far) per scrape."""
    return [
        Scrape(
            t,
            [
                ServerState(
                    family,
                    {"engine": "0"},
                    total_blocks=100,
                    block_size=16,
                    usage=usage,
                    running=running,
                    waiting=waiting,
                    preemptions=pre,
                    finished=10.0 * t,
                )
            ],
        )
        for t, usage, running, waiting, pre in rows
    ]


def test_a_full_kv_cache_that_preempts_is_named_with_the_servers_knob():
    scrapes = _scrapes([(0.5, 0.7, 20, 0, 0), (1.0, 0.99, 24, 3, 2), (1.5, 1.0, 22, 6, 5)])
    limit = limit_of(_point(False, kv_usage_peak=1.0, kv_usage_mean=0.9, preemptions=5, waiting_peak=6), scrapes, 2.0)
    assert limit.kind == "kv_full" and "100%" in limit.evidence and "5 preemptions" in limit.evidence
    assert "--gpu-memory-utilization" in limit.suggestion


def test_requests_waiting_at_low_kv_usage_are_the_batch_cap():
    scrapes = _scrapes([(0.5, 0.2, 8, 2, 0), (1.0, 0.25, 8, 6, 0), (1.5, 0.25, 8, 10, 0)])
    limit = limit_of(
        _point(False, kv_usage_peak=0.25, kv_usage_mean=0.23, preemptions=0, waiting_peak=10, peak_running=8),
        scrapes,
        2.0,
    )
    assert limit.kind == "batch_cap" and "--max-num-seqs" in limit.suggestion


def test_a_growing_queue_with_room_in_the_cache_is_the_prefill_queue():
    scrapes = _scrapes([(0.5, 0.6, 16, 0, 0), (1.0, 0.7, 16, 2, 0), (1.5, 0.8, 16, 5, 0)], "sglang")
    limit = limit_of(_point(False, kv_usage_peak=0.8, kv_usage_mean=0.7, preemptions=0, waiting_peak=5), scrapes, 2.0)
    assert limit.kind == "prefill_queue" and "--chunked-prefill-size" in limit.suggestion


def test_no_queue_and_room_in_the_cache_is_compute_and_failures_come_first():
    scrapes = _scrapes([(0.5, 0.3, 4, 0, 0), (1.0, 0.3, 4, 0, 0), (1.5, 0.3, 4, 0, 0)])
    figures = {"kv_usage_peak": 0.3, "kv_usage_mean": 0.3, "preemptions": 0, "waiting_peak": 0, "peak_running": 4}
    quiet = _point(False, **figures)
    assert limit_of(quiet, scrapes, 2.0).kind == "compute"
    failed = _point(False, **figures, failed=3, failed_by_kind={"timeout": 3})
    assert limit_of(failed, scrapes, 2.0).kind == "failures"
    assert limit_of(quiet, [], 2.0).kind == "unknown"
