"""The router's two views of where a prompt's blocks are cached, and the KV-aware policies that read them.

The precise view is checked against the paged manager it listens to: fed that manager's own cache events, it
must say for any prompt exactly how many leading blocks the manager would serve from its prefix cache.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.cli import main
from kvbench.engine.instance import InstanceStats
from kvbench.engine.request import Request
from kvbench.engine.step_totals import StepTotals
from kvbench.engine.timing import MeasuredTiming
from kvbench.kv.block_pool import BlockPool, OutOfBlocks
from kvbench.kv.paged import PagedManager
from kvbench.measure.kv_events import AllBlocksCleared, BlockRemoved, BlockStored
from kvbench.studies.fleet.core import SERVING, InstanceSlot
from kvbench.studies.fleet.prefix_index import HeldBlocks, SentBlocks, block_keys, feed_events, reusable_keys
from kvbench.studies.fleet.routing import InstanceView, KvWeights, make_policy
from kvbench.studies.fleet.sim_check import counted_timing, fit_timing

BLOCK = 4


def test_a_key_names_a_block_and_everything_before_it():
    a = block_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], BLOCK)
    b = block_keys([1, 2, 3, 4, 5, 6, 7, 8], BLOCK)
    c = block_keys([0, 2, 3, 4, 5, 6, 7, 8], BLOCK)
    assert len(a) == 2 and a == b  # full blocks only
    assert c[0] != a[0] and c[1] != a[1]  # a different first block changes every later key
    assert reusable_keys([1, 2, 3, 4, 5, 6, 7, 8], BLOCK) == a[:1]  # never the block of the last token


def test_held_blocks_follow_stored_removed_and_cleared_events_from_the_wire():
    held = HeldBlocks()
    tokens = list(range(12))
    keys = block_keys(tokens, BLOCK)
    feed_events(held, [BlockStored([11, 12], None, tokens[:8], BLOCK)], BLOCK)
    feed_events(held, [BlockStored([13], 12, tokens[8:], BLOCK)], BLOCK)  # chained on its parent's content
    assert held.overlap(keys) == 3
    feed_events(held, [BlockRemoved([12])], BLOCK)
    assert held.overlap(keys) == 1  # the chain breaks at the removed block
    feed_events(held, [BlockStored([99], 12345, tokens[:4], BLOCK)], BLOCK)  # a parent never heard of
    assert held.unchained == 1
    feed_events(held, [AllBlocksCleared()], BLOCK)
    assert held.overlap(keys) == 0 and len(held) == 0


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.integers(0, 5), st.lists(st.integers(0, 2), min_size=1, max_size=14)),
        min_size=1,
        max_size=40,
    )
)
def test_the_precise_view_agrees_with_the_manager_it_listens_to(operations):
    """Random admissions and frees over a small pool (so blocks are evicted): after each, for every prompt seen,
    the view's overlap equals the leading blocks the manager holds under its own hashes."""
    manager = PagedManager(BlockPool(10, BLOCK), enable_prefix_caching=True)
    manager.events = []
    held = HeldBlocks()
    live: dict[int, list[int]] = {}
    seen: list[list[int]] = []
    for number, (admit, slot, tokens) in enumerate(operations):
        if admit or not live:
            try:
                manager.allocate(number, len(tokens), token_ids=tokens)
            except OutOfBlocks:
                continue
            live[number] = tokens
            seen.append(tokens)
        else:
            rid = sorted(live)[slot % len(live)]
            manager.free(rid, live.pop(rid))
        feed_events(held, manager.events, BLOCK)
        manager.events.clear()
        for prompt in seen:
            full = (len(prompt) - 1) // BLOCK
            truth = 0
            for chain_hash in manager._chain_hashes(prompt, full):
                if chain_hash not in manager._hash_to_block:
                    break
                truth += 1
            assert held.overlap(reusable_keys(prompt, BLOCK)) == truth


def test_sent_blocks_are_remembered_for_their_time_to_live_only():
    sent = SentBlocks(ttl_s=10.0)
    keys = block_keys(list(range(16)), BLOCK)
    sent.record(keys[:2], instance=1, now=0.0)
    assert sent.overlap(keys, 1, now=5.0) == 2 and sent.overlap(keys, 0, now=5.0) == 0
    assert sent.overlap(keys, 1, now=10.5) == 0  # forgotten
    sent.record(keys, instance=1, now=8.0)
    assert sent.overlap(keys, 1, now=17.0) == 4


def _view(index: int, used: int, in_flight: int = 0, total: int = 100) -> InstanceView:
    return InstanceView(index, total, total - used, 0, 0, 0, in_flight)


def _request(rid: int, ids: list[int]) -> Request:
    return Request(rid, len(ids), 4, prompt_token_ids=ids)


def test_approx_prefix_follows_its_own_choices_and_weighs_them_against_load():
    policy = make_policy("approx-prefix", block_size=BLOCK, weights=KvWeights(prefix=1.0, load=1.0, ttl_s=60.0))
    prompt = list(range(33))  # 8 reusable blocks, 9 in all
    views = [_view(0, used=0), _view(1, used=0)]
    first = policy.choose(_request(0, prompt), views, now=0.0)
    assert first == 0  # a tie goes to the lower number
    # the other instance is 5 blocks emptier: the 8 blocks the router sent to instance 0 still win ...
    assert policy.choose(_request(1, prompt), [_view(0, used=5), _view(1, used=0)], now=1.0) == 0
    # ... 9 emptier, they do not; and after the time to live, load alone decides
    assert policy.choose(_request(2, prompt), [_view(0, used=9), _view(1, used=0)], now=2.0) == 1
    assert policy.choose(_request(3, prompt), [_view(0, used=1), _view(1, used=0)], now=200.0) == 1


def test_precise_prefix_goes_where_the_events_say_the_blocks_are():
    policy = make_policy("precise-prefix", block_size=BLOCK, weights=KvWeights(prefix=1.0, load=0.0))
    prompt = list(range(20))
    held = HeldBlocks()
    feed_events(held, [BlockStored([1, 2, 3], None, prompt[:12], BLOCK)], BLOCK)
    policy.held = {0: HeldBlocks(), 1: held}
    assert policy.choose(_request(0, prompt), [_view(0, 0), _view(1, 90)]) == 1
    assert policy.choose(_request(1, [7, *prompt[1:]]), [_view(0, 0), _view(1, 90)]) == 0  # another prefix


def test_fitted_step_times_recover_the_ones_that_made_the_timings():
    truth = MeasuredTiming(decode_s=0.02, prefill_base_s=0.01, prefill_per_token_s=0.001)
    rng = np.random.default_rng(0)
    requests = []
    for rid in range(200):
        prompt, cached, outputs = int(rng.integers(20, 400)), int(rng.integers(0, 10)) * 16, int(rng.integers(2, 50))
        cached = min(cached, prompt - 1)
        request = Request(rid, prompt, outputs, arrival_time=float(rid))
        queued = float(rng.exponential(0.05)) if rid % 2 else 0.0  # half waited in a queue first
        request.first_token_time = rid + queued + truth.prefill_seconds([prompt], [cached])
        request.finish_time = request.first_token_time + truth.decode_s * (outputs - 1)
        request.num_outputs, request.num_cached_tokens = outputs, cached
        request.status = request.status.FINISHED
        requests.append(request)

    class Run:  # what fit_timing reads of a fleet run
        pass

    run = Run()
    run.requests = requests  # type: ignore[attr-defined]
    run.samples, run.placement = [], {}  # type: ignore[attr-defined]  # no scrapes: one decode step for any batch
    fitted = fit_timing([run])  # type: ignore[list-item]
    assert fitted.decode_s == pytest.approx(0.02) and fitted.decode_per_running_s == 0.0
    assert fitted.prefill_per_token_s == pytest.approx(0.001, rel=0.05)
    assert fitted.prefill_base_s == pytest.approx(0.01, abs=0.005)


def test_the_decode_step_grows_with_the_batch_its_server_was_running():
    """Each request decodes at a + b x the batch its server's scrapes saw; some were held up by prefills (slower
    than the line): the fit finds a and b, where one median per token would give every batch the same step."""
    truth = MeasuredTiming(decode_s=0.001, prefill_base_s=0.002, prefill_per_token_s=1e-5, decode_per_running_s=5e-4)
    rng = np.random.default_rng(1)
    requests, samples, placement = [], [], {}
    for rid in range(120):
        instance, batch, outputs = rid % 2, int(rng.integers(1, 9)), int(rng.integers(10, 60))
        start = 10.0 * rid
        request = Request(rid, 100, outputs, arrival_time=start)
        request.first_token_time = start + truth.prefill_seconds([100])
        step = truth.decode_coefficients(batch)[0] * (1.5 if rid % 5 == 0 else 1.0)  # a fifth held up
        request.finish_time = request.first_token_time + step * (outputs - 1)
        request.num_outputs, request.num_cached_tokens = outputs, 0
        request.status = request.status.FINISHED
        requests.append(request)
        placement[rid] = instance
        samples.append((request.first_token_time + 0.001, instance, 0, 100, batch, 0))
        samples.append((request.first_token_time + 0.001, 1 - instance, 0, 100, 99, 0))  # the other server's

    class Run:  # what fit_timing reads of a fleet run
        pass

    run = Run()
    run.requests, run.samples, run.placement = requests, samples, placement  # type: ignore[attr-defined]
    fitted = fit_timing([run])  # type: ignore[list-item]
    assert fitted.decode_s == pytest.approx(0.001, rel=0.05)
    assert fitted.decode_per_running_s == pytest.approx(5e-4, rel=0.05)


def test_a_servers_step_counters_give_its_step_times_free_of_its_requests_waits():
    """Two servers' cumulative step counters at each scrape, from decode steps of 0.3 ms + 0.12 ms per token (one
    per running request) and prefill steps of 2 ms + 20 us per computed token, each interval's seconds off by a
    few per cent; one server restarts midway (its counters begin again). The fit recovers all four terms."""
    rng = np.random.default_rng(3)
    samples: list[tuple[float, int, StepTotals]] = []
    totals = {0: StepTotals(), 1: StepTotals()}
    for tick in range(1, 80):
        for instance in (0, 1):
            if instance == 1 and tick == 40:
                totals[1] = StepTotals()  # restarted: the difference across it is no interval's
            decode, batch = int(rng.integers(5, 200)), float(rng.uniform(1, 12))
            prefill, prompt = int(rng.integers(0, 4)), float(rng.uniform(16, 900))
            noise = float(rng.uniform(0.97, 1.03))
            totals[instance] = StepTotals(
                totals[instance].decode_steps + decode,
                totals[instance].decode_seconds + noise * decode * (3e-4 + 1.2e-4 * batch),
                totals[instance].decode_tokens + decode * batch,
                totals[instance].prefill_steps + prefill,
                totals[instance].prefill_seconds + noise * prefill * (2e-3 + 2e-5 * prompt),
                totals[instance].prefill_tokens + prefill * prompt,
            )
            samples.append((0.05 * tick, instance, totals[instance]))
    run = SimpleNamespace(step_samples=samples)
    fitted = counted_timing([run])  # type: ignore[list-item]
    assert fitted is not None
    assert fitted.decode_s == pytest.approx(3e-4, rel=0.1)
    assert fitted.decode_per_running_s == pytest.approx(1.2e-4, rel=0.05)
    assert fitted.prefill_base_s == pytest.approx(2e-3, rel=0.1)
    assert fitted.prefill_per_token_s == pytest.approx(2e-5, rel=0.05)
    assert counted_timing([SimpleNamespace(step_samples=samples[:10])]) is None  # too few intervals: requests instead
    assert counted_timing([SimpleNamespace(step_samples=[])]) is None  # servers without counters (vLLM)


def test_a_simulated_fleet_hears_its_instances_events_and_keeps_groups_together(tmp_path, capsys):
    args = ["fleet", "--simulate", "--prefix-groups", "24", "--prefix-len", "512", "--requests", "300"]
    args += ["--policies", "round-robin,precise-prefix", "--load-weight", "0.1", "--out", str(tmp_path / "run")]
    assert main(args) == 0, capsys.readouterr()
    points = {p["policy"]: p for p in json.loads((tmp_path / "run" / "summary.json").read_text())["points"]}
    assert points["precise-prefix"]["prefix_hit_rate"] > points["round-robin"]["prefix_hit_rate"]


def test_a_router_that_reads_at_intervals_sees_the_last_report_not_the_instance_now():
    now = InstanceStats(1.0, 100, 10, 5, 0, 0, 0, 0, 0, 0, 0)
    scraped = InstanceStats(0.5, 100, 90, 1, 0, 0, 0, 0, 0, 0, 0)
    slot = InstanceSlot(0, None, SERVING, started_at=0.0, stats=now)
    assert slot.view().free_blocks == 10
    slot.seen = scraped
    assert slot.view().free_blocks == 90
