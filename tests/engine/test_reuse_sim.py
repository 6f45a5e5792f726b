"""A trace through the prefix cache at its arrival times: limits against arithmetic done here, by hand."""

from __future__ import annotations

import random

import pytest

from kvbench.engine.reuse_sim import ChainedTrace, reuse_distances, simulate
from kvbench.engine.timing import UniformTiming
from kvbench.workload.prefix_trace import PrefixTrace, TraceRequest

TIMING = UniformTiming(step_s=0.001)


def trace_of(rows: list[tuple[float, list[int], int]], block: int = 16, output: int = 4) -> PrefixTrace:
    """Requests of whole blocks: (arrival s, hash ids, tokens of the last block)."""
    return PrefixTrace(
        tuple(TraceRequest(arrival, (len(ids) - 1) * block + last, output, tuple(ids)) for arrival, ids, last in rows),
        block,
        "test",
    )


def seen_before_share(trace: PrefixTrace) -> float:
    """Prompt tokens in blocks whose hash id an earlier request had: the unbounded limit, counted directly."""
    seen: set[int] = set()
    hit = total = 0
    for request in trace.requests:
        for index, hash_id in enumerate(request.hash_ids):
            tokens = min(trace.block_size, request.input_len - index * trace.block_size)
            total += tokens
            hit += tokens if hash_id in seen else 0
        seen.update(request.hash_ids)
    return hit / total


def test_unbounded_limit_is_the_share_of_blocks_seen_before():
    # Hash ids in the Mooncake manner (an id always follows the same ids), last blocks unique to their request,
    # requests spaced so none overlaps another: the cache that never evicts serves exactly the blocks seen before.
    rng = random.Random(7)
    prefixes = [[g * 1000 + i for i in range(rng.randint(1, 6))] for g in range(8)]
    rows, unique = [], 100_000
    for index in range(300):
        prefix = prefixes[rng.randrange(8)]
        keep = prefix[: rng.randint(0, len(prefix))]
        own = list(range(unique, unique + rng.randint(1, 3)))
        unique += 10
        rows.append((index * 10.0, keep + own, 16))
    trace = trace_of(rows)
    chained = ChainedTrace.of(trace)
    outcome = simulate(chained, 16, 10**7, TIMING, 256)
    assert outcome.hit_rate == pytest.approx(seen_before_share(trace), abs=1e-12)
    assert outcome.evicted_blocks == 0 and outcome.refused == 0


def test_every_second_request_repeats_the_first_prefix():
    # A = [0 1 2 | own], each request 4 blocks of 16 tokens; every second request shares blocks 0 1 2
    rows = []
    for index in range(10):
        ids = [0, 1, 2, 50 + index] if index % 2 == 0 else [10 + index, 20 + index, 30 + index, 40 + index]
        rows.append((index * 1.0, ids, 16))
    outcome = simulate(ChainedTrace.of(trace_of(rows)), 16, 10_000, TIMING, 256)
    # 4 of the 5 even requests reuse 3 of their 4 blocks: 12 of 40 blocks
    assert outcome.hit_tokens == 4 * 3 * 16
    assert outcome.hit_rate == pytest.approx(12 / 40)


def test_smaller_blocks_than_the_trace_cache_the_partial_tail():
    # a trace block of 64 tokens is 4 KV blocks of 16; a prompt of 64 + 40 tokens caches 4 + 2 blocks
    rows = [(0.0, [1, 2], 40), (10.0, [1, 2, 3], 64)]
    outcome = simulate(ChainedTrace.of(trace_of(rows, block=64)), 16, 1000, TIMING, 256)
    assert outcome.hit_tokens == (4 + 2) * 16


def test_running_requests_pin_their_blocks():
    # two long-running requests hold the pool; the third waits for one to finish, then reuses its prefix
    rows = [(0.0, [1, 2, 3], 16), (0.0, [7, 8, 9], 16), (0.001, [1, 2, 4], 16)]
    timing = UniformTiming(step_s=1.0)
    outcome = simulate(ChainedTrace.of(trace_of(rows, output=16)), 16, 8, timing, 256)
    assert outcome.pinned_blocks_peak == 8
    assert outcome.queue_wait_mean_s > 0
    assert outcome.hit_tokens == 2 * 16


def test_a_request_larger_than_the_pool_is_refused():
    rows = [(0.0, [1, 2, 3, 4], 16), (1.0, [1, 2], 16)]
    outcome = simulate(ChainedTrace.of(trace_of(rows)), 16, 4, TIMING, 256)
    assert outcome.refused == 1 and outcome.requests == 1


def test_a_cpu_tier_serves_what_the_gpu_evicted():
    # each request evicts the other's blocks from a pool that holds one request; the CPU tier keeps both
    rows = [(i * 10.0, [1, 2, 3, 100 + i] if i % 2 == 0 else [4, 5, 6, 100 + i], 16) for i in range(6)]
    chained = ChainedTrace.of(trace_of(rows))
    without = simulate(chained, 16, 5, TIMING, 256)
    tier = simulate(chained, 16, 5, TIMING, 256, offload_blocks=100)
    assert without.hit_tokens == 0 and without.offload_hit_tokens == 0
    assert tier.offload_hit_tokens == 4 * 3 * 16


def test_reuse_distances_by_hand():
    rows = [(0.0, [1, 2], 16), (5.0, [3], 16), (12.0, [1, 2, 4], 16)]
    found = reuse_distances(ChainedTrace.of(trace_of(rows)), 16)
    # nodes 1 and 2 come back after 12 s; in between, one new block ([3]) was written (and [1,2]'s own before)
    assert found.seconds == [12.0, 12.0]
    assert found.new_blocks == [2, 1]
    assert found.weights == [1, 1]


def test_a_size_that_made_requests_wait_is_not_taken_for_larger_ones():
    # two requests at once, 1 prompt block and 7 output blocks each: 10 blocks make the second wait (without
    # evicting a cached block), 16 hold both at once; the larger size must be simulated, not copied
    from kvbench.studies.reuse import run_sizes

    rows = [(0.0, [1], 4), (0.0, [2], 4)]
    chained = ChainedTrace.of(trace_of(rows, block=4, output=28))
    timing = UniformTiming(step_s=1.0)
    outcomes = run_sizes(chained, 4, [10, 16], timing, 256, 0, lambda _: None)
    assert outcomes[10].kv_waits > 0 and outcomes[10].queue_wait_mean_s > 0
    assert outcomes[16] == simulate(chained, 4, 16, timing, 256)
    assert outcomes[16].queue_wait_mean_s == 0


def test_refused_requests_count_as_misses():
    # a request larger than the pool is refused: its prompt tokens are misses, so the rate cannot rise above the
    # never-evicting one by dropping it
    rows = [(0.0, [1, 2], 16), (1.0, [1, 2], 16), (2.0, list(range(10, 20)), 16)]
    chained = ChainedTrace.of(trace_of(rows))
    small = simulate(chained, 16, 4, TIMING, 256)
    unbounded = simulate(chained, 16, 10**6, TIMING, 256)
    assert small.refused == 1 and small.prompt_tokens == unbounded.prompt_tokens == 16 * 14
    assert small.hit_rate <= unbounded.hit_rate
