"""WasteAccountant: closed-form spans against step-by-step sums, and hand-computed traces.

The hand-computed traces run two or four tiny requests through ``simulate`` with UniformTiming(1.0), so every
step lasts one second and each share is a plain count of slot-steps that the comments work out by hand.
Convention: a step's ``used`` counts the token states after that step's write.
"""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.simulator import simulate
from kvbench.engine.timing import UniformTiming
from kvbench.kv.accounting import PARTS, PoolParts, WasteAccountant
from kvbench.kv.block_pool import BlockPool
from kvbench.kv.contiguous import ContiguousManager
from kvbench.kv.paged import PagedManager


def test_single_span_by_hand():
    acct = WasteAccountant(pool_slots=20, block_size=4)
    # 3 steps of 2 s; used 5, 7, 9 (two requests growing); they hold 12 slots, 10 of them below their
    # final lengths (so 2 internal); 4 external; free = 20 - 12 - 4 = 4.
    total = acct.add_span(3, used0=5, grow=2, capped_held=10, internal=2, external=4, held=12, running=2, base_s=2.0)
    assert total == 6.0 and acct.elapsed_s == 6.0 and acct.steps == 3
    assert acct.slot_seconds.as_dict() == {
        "used": 42.0,
        "reserved": 18.0,
        "internal": 12.0,
        "external": 24.0,
        "free": 24.0,
    }
    assert acct.shares_pct().as_dict() == pytest.approx(
        {"used": 35.0, "reserved": 15.0, "internal": 10.0, "external": 20.0, "free": 20.0}
    )
    assert acct.peak.as_dict() == {"used": 9, "reserved": 5, "internal": 2, "external": 4, "free": 4}
    assert acct.peak_allocated == 12
    # online fragmentation 1 - used/held at used 5, 7, 9 of 12: (7 + 5 + 3) / 12 / 3
    assert acct.fragmentation_mean() == pytest.approx(15 / 36)
    assert acct.effective_usage() == pytest.approx(42 / 96)
    assert acct.mean_slots().used == 7.0 and acct.mean_running() == 2.0
    assert acct.timeline == [(0.0, 3, 5)]
    assert acct.waste_pct() == pytest.approx(
        {"token_state_pct": 35.0, "reservation_pct": 15.0, "internal_pct": 10.0, "external_pct": 20.0, "free_pct": 20.0}
    )


def test_empty_accountant_and_zero_length_span():
    acct = WasteAccountant(16, 4)
    assert acct.add_span(0, used0=1, grow=1, capped_held=1, internal=0, external=0, held=4, running=1, base_s=1) == 0
    assert acct.shares_pct().as_dict() == dict.fromkeys(PARTS, 0.0)
    assert acct.fragmentation_mean() == 0.0 and acct.effective_usage() == 0.0 and acct.mean_running() == 0.0
    assert acct.mean_slots().used == 0.0


def _step_by_step(pool, spans):
    """The definition, one step at a time: t_j = max(floor, base + per_used * used_j)."""
    slot_s = dict.fromkeys(PARTS, 0.0)
    elapsed = frag = alloc_s = 0.0
    for k, used0, grow, capped, internal, external, held, base, per_used, floor in spans:
        for j in range(k):
            used = used0 + grow * j
            t = max(floor, base + per_used * used)
            slot_s["used"] += used * t
            slot_s["reserved"] += (capped - used) * t
            slot_s["internal"] += internal * t
            slot_s["external"] += external * t
            slot_s["free"] += (pool - held - external) * t
            elapsed += t
            if held:
                frag += (1 - used / held) * t
                alloc_s += t
    return slot_s, elapsed, frag, alloc_s


@st.composite
def _spans(draw):
    spans = []
    for _ in range(draw(st.integers(1, 4))):
        k = draw(st.integers(1, 40))
        running = draw(st.integers(0, 8))
        grow = running
        used0 = draw(st.integers(running, 20))
        capped = used0 + grow * (k - 1) + draw(st.integers(0, 20))
        internal = draw(st.integers(0, 10))
        external = draw(st.integers(0, 50))
        base = draw(st.floats(1e-4, 1e-2))
        per_used = draw(st.sampled_from([0.0, 1e-6, 1e-4]))
        floor = draw(st.sampled_from([0.0, 1e-3, 2e-2]))
        spans.append((k, used0, grow, capped, internal, external, capped + internal, base, per_used, floor))
    pool = max(s[5] + s[6] for s in spans) + draw(st.integers(1, 100))
    return pool, spans


@settings(max_examples=60, deadline=None)
@given(_spans())
def test_closed_form_spans_equal_the_step_by_step_sum(case):
    """The roofline switch (fixed floor, then growing memory time) inside one span is integrated exactly."""
    pool, spans = case
    acct = WasteAccountant(pool, 1)
    total = 0.0
    for k, used0, grow, capped, internal, external, held, base, per_used, floor in spans:
        total += acct.add_span(
            k,
            used0=used0,
            grow=grow,
            capped_held=capped,
            internal=internal,
            external=external,
            held=held,
            running=grow,
            base_s=base,
            per_used_s=per_used,
            floor_s=floor,
        )
    slot_s, elapsed, frag, alloc_s = _step_by_step(pool, spans)
    assert total == pytest.approx(elapsed, rel=1e-9) and acct.elapsed_s == pytest.approx(elapsed, rel=1e-9)
    for part in PARTS:
        assert acct.slot_seconds.as_dict()[part] == pytest.approx(slot_s[part], rel=1e-9, abs=1e-9)
    assert sum(acct.shares_pct().as_dict().values()) == pytest.approx(100.0)
    assert acct.steps == sum(s[0] for s in spans)
    if alloc_s:  # the time average of 1 - used/held, weighted by each step's own time
        assert acct.fragmentation_mean() == pytest.approx(frag / alloc_s, rel=1e-9)
    assert 0.0 <= acct.fragmentation_mean() <= 1.0


def test_roofline_split_by_hand():
    acct = WasteAccountant(100, 1)
    # t_j = max(3, 1 + 1 * used_j) with used 0, 1, 2, 3, 4: 3, 3, 3, 4, 5
    total = acct.add_span(
        5,
        used0=0,
        grow=1,
        capped_held=10,
        internal=0,
        external=0,
        held=10,
        running=1,
        base_s=1.0,
        per_used_s=1.0,
        floor_s=3.0,
    )
    assert total == 18.0
    assert acct.slot_seconds.used == 0 * 3 + 1 * 3 + 2 * 3 + 3 * 4 + 4 * 5
    assert acct.slot_seconds.reserved == 10 * 18 - 41
    assert acct.slot_seconds.free == 90 * 18


def _run(requests, manager, concurrency, max_len):
    config = EngineConfig(max_num_seqs=concurrency, max_len=max_len)
    result = simulate(requests, manager, UniformTiming(1.0), concurrency, config)
    assert all(r.status is RequestStatus.FINISHED for r in requests)
    assert manager.pool.num_used == 0
    return result.accountant, result


def test_hand_computed_paged_trace():
    # Paged pool: 4 blocks of 4 slots = 16 slots; watermark int(0.01 * 4) = 0 blocks.
    # A: prompt 3, 3 outputs -> final KV length 5.  B: prompt 2, 2 outputs -> final KV length 3.
    #
    # step 1 (prefill A+B, 1 s): A holds 1 block (kv 3), B 1 block (kv 2): held 8.
    #   used 3+2 = 5; capped min(4,5)+min(4,3) = 7 -> reserved 2; internal (B: 4-3) 1; free 16-8 = 8.
    #   fragmentation 1 - 5/8 = 3/8.
    # step 2 (decode clock 0->1): A kv 4, B kv 3. used 7, reserved 0, internal 1, free 8; frag 1/8.
    # clock 1: B has 2 outputs -> finishes (final kv 3). A needs its 5th slot: a second block.
    # step 3 (decode 1->2): A kv 5, holds 8 slots: used 5, capped min(8,5) = 5 -> reserved 0,
    #   internal 3, free 16-8 = 8; frag 3/8.
    # clock 2: A finishes (final kv 5).
    # Totals over 3 s x 16 slots = 48 slot-s: used 5+7+5 = 17, reserved 2+0+0 = 2, internal 1+1+3 = 5,
    #   external 0, free 8+8+8 = 24.
    a, b = Request(0, 3, 3), Request(1, 2, 2)
    acct, result = _run([a, b], PagedManager(BlockPool(4, 4)), concurrency=2, max_len=16)
    assert acct.elapsed_s == 3.0 and acct.steps == 3
    assert acct.slot_seconds.as_dict() == {
        "used": 17.0,
        "reserved": 2.0,
        "internal": 5.0,
        "external": 0.0,
        "free": 24.0,
    }
    assert acct.shares_pct().as_dict() == {
        "used": 100 * 17 / 48,
        "reserved": 100 * 2 / 48,
        "internal": 100 * 5 / 48,
        "external": 0.0,
        "free": 50.0,
    }
    assert acct.peak.as_dict() == {"used": 7, "reserved": 2, "internal": 3, "external": 0, "free": 8}
    assert acct.peak_allocated == 8
    assert acct.fragmentation_mean() == pytest.approx((3 / 8 + 1 / 8 + 3 / 8) / 3)
    assert acct.effective_usage() == pytest.approx(17 / 24)
    assert (a.final_kv_len, b.final_kv_len) == (5, 3)
    assert (a.num_outputs, b.num_outputs) == (3, 2)
    assert result.num_preemptions == 0 and result.peak_running == 2
    assert acct.mean_running() == pytest.approx((2 + 2 + 1) / 3)
    assert (a.first_token_time, a.finish_time, b.finish_time) == (1.0, 3.0, 2.0)


def test_hand_computed_contiguous_trace_with_external_fragmentation():
    # Contiguous oracle, 10 blocks of 1 slot; 4 in flight, so D waits from the start.
    # A: prompt 2, 3 outputs (kv 4) -> run [0,4);  B: prompt 1, 2 outputs (kv 2) -> [4,6);
    # C: prompt 1, 3 outputs (kv 3) -> [6,9);      D: prompt 2, 2 outputs (kv 3) waits: 1 slot free.
    #
    # step 1 (prefill A,B,C): used 2+1+1 = 4, held 9 = capped (oracle) -> reserved 5; D needs 3 > 1 free
    #   -> external 0; free 1. frag 1 - 4/9 = 5/9.
    # step 2 (0->1): used 7, reserved 2, external 0, free 1; frag 2/9.
    # clock 1: B finishes, freeing the middle run [4,6): free extents [4,6) and [9,10) = 3 slots, the largest 2.
    # step 3 (1->2): A kv 4, C kv 3: used 7, held 7 -> reserved 0; D needs 3 <= 3 free but no extent
    #   holds 3 -> external 3; free 10-7-3 = 0. frag 0.
    # clock 2: A and C finish; D is placed first-fit at block 0.
    # step 4 (prefill D): used 2, held 3 -> reserved 1, external 0 (nothing waits), free 7; frag 1/3.
    # step 5 (2->3): used 3, reserved 0, free 7; frag 0.  D finishes.
    # Totals over 5 s x 10 slots = 50: used 4+7+7+2+3 = 23, reserved 5+2+0+1+0 = 8, internal 0,
    #   external 3, free 1+1+0+7+7 = 16.
    reqs = [Request(0, 2, 3), Request(1, 1, 2), Request(2, 1, 3), Request(3, 2, 2)]
    manager = ContiguousManager(BlockPool(10, 1), "oracle", max_len=16)
    acct, result = _run(reqs, manager, concurrency=4, max_len=16)
    assert acct.elapsed_s == 5.0
    assert acct.slot_seconds.as_dict() == {
        "used": 23.0,
        "reserved": 8.0,
        "internal": 0.0,
        "external": 3.0,
        "free": 16.0,
    }
    assert acct.shares_pct().as_dict() == {
        "used": 46.0,
        "reserved": 16.0,
        "internal": 0.0,
        "external": 6.0,
        "free": 32.0,
    }
    assert acct.peak.as_dict() == {"used": 7, "reserved": 5, "internal": 0, "external": 3, "free": 7}
    assert acct.peak_allocated == 9
    assert acct.fragmentation_mean() == pytest.approx((5 / 9 + 2 / 9 + 0 + 1 / 3 + 0) / 5)
    assert acct.effective_usage() == pytest.approx(23 / 34)
    assert [r.final_kv_len for r in reqs] == [4, 2, 3, 3]
    assert result.peak_running == 3 and result.num_preemptions == 0


def test_hand_computed_contiguous_max_trace_has_internal_waste():
    # Contiguous max, max_len 8, 16 slots of 1: both requests reserve 8 slots.
    # A: prompt 2, 2 outputs (kv 3); B: prompt 4, 1 output (kv 4, finishes at its prefill).
    # step 1 (prefill A+B): used 2+4 = 6, held 16, capped min(8,3)+min(8,4) = 7 -> reserved 1,
    #   internal 5+4 = 9, free 0. B finishes right after (1 output).
    # step 2 (0->1): A kv 3: used 3, held 8, capped 3 -> reserved 0, internal 5, free 8.
    # Totals over 2 s x 16 = 32: used 9, reserved 1, internal 14, external 0, free 8.
    a, b = Request(0, 2, 2), Request(1, 4, 1)
    acct, _ = _run([a, b], ContiguousManager(BlockPool(16, 1), "max", max_len=8), concurrency=2, max_len=8)
    assert acct.slot_seconds.as_dict() == {"used": 9.0, "reserved": 1.0, "internal": 14.0, "external": 0.0, "free": 8.0}
    assert acct.peak.as_dict() == {"used": 6, "reserved": 1, "internal": 9, "external": 0, "free": 8}
    assert acct.fragmentation_mean() == pytest.approx((1 - 6 / 16 + 1 - 3 / 8) / 2)
    assert (a.final_kv_len, b.final_kv_len) == (3, 4)
    assert math.isclose(sum(acct.shares_pct().as_dict().values()), 100.0)


def test_pool_parts_name_the_parts_in_order_and_add_up_what_is_occupied():
    parts = PoolParts(used=4, reserved=3, internal=2, external=1, free=10)
    assert PARTS == ("used", "reserved", "internal", "external", "free")
    assert list(parts.as_dict()) == list(PARTS) and parts.as_dict()["free"] == 10
    assert parts.occupied == 10
