"""A point's reuse: the requests' cached tokens against the counters, and what the workload itself allows."""

import pytest

from kvbench.endpoint.conversation import Conversation, Turn
from kvbench.endpoint.prefix_reuse import prefix_reuse, workload_reuse
from kvbench.endpoint.record import RequestRecord
from kvbench.results.endpoint_figures import ServerMetrics
from kvbench.results.prefix_reuse_figures import ReuseSpread


def _record(conversation: int, prompt: int, cached: int | None, turn: int = 0, ok: bool = True) -> RequestRecord:
    return RequestRecord(conversation, turn, ok=ok, prompt_tokens=prompt, cached_tokens=cached, output_tokens=1)


def test_rates_by_request_turn_and_conversation_beside_the_counters():
    records = [_record(0, 100, 0), _record(0, 200, 96, turn=1), _record(1, 100, 48), _record(2, 50, None, ok=False)]
    server = {"prefix_cache_hits": 144, "prefix_cache_queries": 400, "prefix_cache_hit_rate": 0.36, "block_size": 16}
    out = prefix_reuse(records, ServerMetrics.from_json(server))
    assert out.hit_rate_requests == pytest.approx(144 / 400) and out.hit_rate_counters == 0.36
    assert out.hit_rate_by_turn == {"0": pytest.approx(48 / 200), "1": pytest.approx(96 / 200)}
    assert out.hit_rate_by_conversation == ReuseSpread(
        2, pytest.approx(96 / 300), pytest.approx((96 / 300 + 0.48) / 2), pytest.approx(0.48)
    )
    assert out.difference_tokens == 0 and out.difference_pct_points == pytest.approx(0) and out.flag is None


def test_a_server_that_does_not_say_leaves_the_rate_unknown_never_zero():
    out = prefix_reuse([_record(0, 100, None), _record(1, 100, None)], ServerMetrics(prefix_cache_hit_rate=0.5))
    assert out.hit_rate_requests is None and out.cached_tokens is None and out.hit_rate_counters == 0.5


@pytest.mark.parametrize(
    "hits, queries, reason",
    [
        (400, 2000, "another client shared the server"),  # the counter looked up far more than was sent
        (400, 300, "another client shared the server during the point, or"),
        (0, 300, "counts queries differently"),
    ],
)
def test_counters_more_than_a_block_per_request_apart_are_flagged_with_the_likely_reason(hits, queries, reason):
    records = [_record(i, 100, 48) for i in range(3)]
    out = prefix_reuse(records, ServerMetrics(prefix_cache_hits=hits, prefix_cache_queries=queries, block_size=16))
    assert out.flag is not None and reason in out.flag


def test_counters_ahead_of_the_answers_under_preemption_name_the_re_admissions_first():
    records = [_record(i, 100, 48) for i in range(3)]
    server = {"prefix_cache_hits": 400, "prefix_cache_queries": 2000, "block_size": 16, "preemptions": 12}
    flag = prefix_reuse(records, ServerMetrics.from_json(server)).flag
    assert flag.startswith("the server's counters count 256 more cached tokens") and "preempted 12 times" in flag


def test_within_a_block_per_request_is_not_flagged_and_an_unknown_block_size_is_said():
    records = [_record(i, 100, 48) for i in range(3)]
    assert prefix_reuse(records, ServerMetrics(prefix_cache_hits=144 + 40, block_size=16)).flag is None
    assert "block size is unknown" in prefix_reuse(records, ServerMetrics(prefix_cache_hits=144)).flag


def _conversations(prompts):
    return [Conversation(i, (Turn(tuple(p), 4),)) for i, p in enumerate(prompts)]


def test_an_unbounded_cache_serves_each_requests_leading_full_blocks_seen_before():
    prefix = list(range(100, 150))  # 50 tokens: 3 full blocks of 16
    prompts = [prefix + [1, 2, 3], prefix + [4, 5, 6], list(range(200, 248)), list(range(200, 248))]
    out = workload_reuse(_conversations(prompts), 16)
    # the second request finds 3 blocks; the fourth finds 2 (its last token's block is never served)
    assert out.ideal_cached_tokens == 48 + 32
    assert out.ideal_hit_rate == pytest.approx(80 / (53 + 53 + 48 + 48))
    assert out.requests_sharing_under_one_block == 0


def test_prefixes_shorter_than_a_block_are_counted_and_text_prompts_say_nothing():
    head = list(range(10, 20))  # 10 shared tokens: more than half a block of 16, less than one
    prompts = [head + [i] * 30 for i in range(1, 5)]
    assert workload_reuse(_conversations(prompts), 16).requests_sharing_under_one_block == 3
    assert workload_reuse(_conversations(prompts), None) is None
    assert workload_reuse([Conversation(0, (Turn("hello", 4),))], 16) is None
