"""Routing policies: each one's choice on hand-made instance states, and the registry."""

from __future__ import annotations

import pytest

from kvbench.engine.request import Request
from kvbench.errors import KvbenchError
from kvbench.studies.fleet.routing import POLICIES, InstanceView, PrefixAffinity, make_policy


def view(index, free=100, queued=0, in_flight=0, total=100):
    return InstanceView(index, total, free, queued, running=in_flight, waiting=0, in_flight=in_flight)


REQUEST = Request(0, 8, 4)


def test_round_robin_cycles_by_instance_number_and_skips_missing_ones():
    policy = make_policy("round-robin")
    views = [view(0), view(1), view(2)]
    assert [views[policy.choose(REQUEST, views)].index for _ in range(4)] == [0, 1, 2, 0]
    fewer = [view(0), view(2)]  # instance 1 is draining
    assert fewer[policy.choose(REQUEST, fewer)].index == 2


def test_random_is_seeded():
    views = [view(i) for i in range(5)]
    first = [make_policy("random", seed=3).choose(REQUEST, views) for _ in range(1)]
    a, b = make_policy("random", seed=3), make_policy("random", seed=3)
    assert [a.choose(REQUEST, views) for _ in range(20)] == [b.choose(REQUEST, views) for _ in range(20)]
    assert len({a.choose(REQUEST, views) for _ in range(50)}) > 1 and first


def test_least_requests_and_most_free_blocks():
    views = [view(0, free=10, in_flight=1), view(1, free=90, in_flight=5), view(2, free=50, in_flight=2)]
    assert make_policy("least-requests").choose(REQUEST, views) == 0
    assert make_policy("most-free-blocks").choose(REQUEST, views) == 1
    # queued prefills count against the free blocks: demand already routed there
    queued = [view(0, free=60), view(1, free=90, queued=40)]
    assert make_policy("most-free-blocks").choose(REQUEST, queued) == 0


def test_prefix_affinity_sticks_to_one_instance_and_spills_over_the_load_cap():
    policy = make_policy("prefix-affinity", block_size=4)
    prefix = list(range(100, 116))
    requests = [Request(i, 20, 4, prompt_token_ids=prefix + [i, i, i, i]) for i in range(10)]
    views = [view(i) for i in range(4)]
    chosen = {policy.choose(r, views) for r in requests}
    assert len(chosen) == 1  # same first 4 blocks -> same instance
    home = chosen.pop()
    loaded = [view(i, in_flight=20 if i == home else 0) for i in range(4)]
    assert policy.choose(requests[0], loaded) != home  # over the cap: the next in rendezvous order
    others = [Request(50 + i, 20, 4, prompt_token_ids=list(range(1000 * i, 1000 * i + 20))) for i in range(40)]
    assert len({policy.choose(r, views) for r in others}) == 4  # different prefixes spread


def test_prefix_affinity_keeps_its_choice_when_another_instance_leaves():
    policy = PrefixAffinity(block_size=4)
    request = Request(0, 20, 4, prompt_token_ids=list(range(20)))
    views = [view(i) for i in range(5)]
    home = views[policy.choose(request, views)].index
    remaining = [v for v in views if v.index != (home + 1) % 5]
    assert remaining[policy.choose(request, remaining)].index == home


def test_registry_and_unknown_names():
    assert set(POLICIES) == {
        "round-robin",
        "random",
        "least-requests",
        "most-free-blocks",
        "prefix-affinity",
        "approx-prefix",
        "precise-prefix",
    }
    with pytest.raises(KvbenchError, match="unknown routing policy 'fastest'"):
        make_policy("fastest")
