"""Scheduler: intake, FCFS admission by free memory, preemption by recompute, finish, running totals."""

import pytest

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.scheduler import Scheduler
from kvbench.errors import KvbenchError
from kvbench.kv.block_pool import BlockPool, OutOfBlocks
from kvbench.kv.contiguous import ContiguousManager
from kvbench.kv.paged import PagedManager


def _paged(num_blocks, block_size, **config):
    manager = PagedManager(BlockPool(num_blocks, block_size))
    return Scheduler(manager, EngineConfig(**config))


def _contiguous(num_blocks, policy="max", max_len=16, **config):
    manager = ContiguousManager(BlockPool(num_blocks, 1), policy, max_len)
    return Scheduler(manager, EngineConfig(max_len=max_len, **config))


def _check_totals(scheduler, clock):
    """The O(1) running totals equal a walk over the running requests."""
    running = list(scheduler.running.values())
    assert scheduler.used_slots(clock) == sum(r.kv_len(clock) for r in running)
    assert scheduler.capped_held == sum(min(r.held_slots, r.expected_kv_len) for r in running)
    assert scheduler.internal == sum(max(r.held_slots - r.expected_kv_len, 0) for r in running)
    assert sum(r.held_slots for r in running) == scheduler.held_slots()


def test_request_lengths():
    request = Request(1, prompt_len=5, max_tokens=3)
    assert request.expected_kv_len == 7 and request.prefill_len() == 5
    with pytest.raises(ValueError):
        Request(2, 0, 3)
    with pytest.raises(ValueError):
        Request(3, 3, 0)


def test_bad_config_is_refused():
    with pytest.raises(KvbenchError, match="queue, reject"):
        EngineConfig(admission="drop")
    with pytest.raises(KvbenchError, match="max num seqs"):
        EngineConfig(max_num_seqs=0)
    with pytest.raises(KvbenchError, match="paged, contiguous"):
        EngineConfig(engine="turbo")
    with pytest.raises(KvbenchError, match="max, pow2, oracle"):
        EngineConfig(reserve="exact")


def test_add_rejects_what_can_never_run_with_a_reason():
    scheduler = _paged(4, 4, max_len=20)
    too_long = Request(1, 15, 6)
    assert scheduler.add(too_long) is False
    assert too_long.status is RequestStatus.REJECTED and "max-len 20" in too_long.reject_reason
    too_big = Request(2, 10, 8)  # 17 KV slots > a 16-slot pool
    assert scheduler.add(too_big) is False and "whole pool" in too_big.reject_reason
    fits = Request(3, 10, 7)  # exactly 16 KV slots
    assert scheduler.add(fits) is True and fits.status is RequestStatus.WAITING
    assert scheduler.rejected == [too_long, too_big] and list(scheduler.waiting) == [fits]


def test_admission_is_fcfs_and_respects_batch_and_prefill_limits():
    scheduler = _paged(64, 4, max_num_seqs=2, max_prefill_tokens=10)
    requests = [Request(i, 6, 4) for i in range(4)]
    for request in requests:
        scheduler.add(request)
    # the first always goes in even alone over budget; the second would exceed 10 prefill tokens
    assert scheduler.admit(clock=0) == requests[:1]
    assert scheduler.admit(clock=0) == requests[1:2]
    assert scheduler.admit(clock=0) == []  # batch full
    assert [r.admit_seq for r in requests[:2]] == [0, 1]
    assert requests[0].status is RequestStatus.RUNNING and requests[2].status is RequestStatus.WAITING
    _check_totals(scheduler, 0)


def test_paged_admission_keeps_a_watermark_for_running_requests():
    scheduler = _paged(100, 1, watermark=0.1, max_len=200)  # 10 blocks kept free once something runs
    first, second = Request(0, 50, 10), Request(1, 41, 10)
    scheduler.add(first)
    scheduler.add(second)
    assert scheduler.admit(0) == [first]  # 50 free left: 41 + 10 > 50
    assert list(scheduler.waiting) == [second]


def test_preemption_takes_the_newest_and_recomputes_it_later():
    scheduler = _paged(4, 2, max_len=16)  # 8 slots
    old, new = Request(0, 3, 5), Request(1, 3, 5)  # each 2 blocks after prefill, final kv 7
    scheduler.add(old)
    scheduler.add(new)
    assert scheduler.admit(0) == [old, new]
    assert scheduler.manager.pool.num_free == 0
    # clock 0 -> 1 writes the 4th token of each: both still fit; at clock 1 the 5th needs a block
    assert not scheduler.needs_room(old, 0)
    assert scheduler.needs_room(old, 1) and scheduler.next_room_clock(old) == 1
    copies, preempted = scheduler.make_room(old, 1)
    assert copies == [] and preempted == [new]
    assert new.status is RequestStatus.WAITING and list(scheduler.waiting) == [new]
    assert new.num_outputs == 2 and new.num_preemptions == 1 and scheduler.num_preemptions == 1
    assert new.prefill_len() == 5  # prompt + the outputs it keeps
    assert scheduler.manager.held_slots(old.request_id) == 6
    _check_totals(scheduler, 1)


def test_the_newest_request_asking_for_room_preempts_itself():
    scheduler = _paged(4, 2, max_len=16)
    old, new = Request(0, 3, 5), Request(1, 3, 5)
    scheduler.add(old)
    scheduler.add(new)
    scheduler.admit(0)
    copies, preempted = scheduler.make_room(new, 1)
    assert copies == [] and preempted == [new]
    assert new.status is RequestStatus.WAITING and old.status is RequestStatus.RUNNING
    assert scheduler.manager.pool.num_free == 2
    assert scheduler.make_room(old, 1) == ([], [])  # room again without preempting anyone
    _check_totals(scheduler, 1)


def test_recomputed_request_finishes_with_all_its_outputs():
    scheduler = _paged(4, 2, max_len=16)
    request = Request(0, 3, 5)
    scheduler.add(request)
    scheduler.admit(0)
    scheduler.preempt(request, 2)  # 3 outputs so far, 4 token states
    assert request.num_outputs == 3
    assert scheduler.admit(2) == [request]
    assert request.kv_len(2) == 6 and request.outputs(2) == 4
    assert request.finish_clock() == 3
    scheduler.make_room(request, 2)
    scheduler.finish(request, 3)
    assert request.status is RequestStatus.FINISHED and request.num_outputs == 5
    assert request.final_kv_len == 7 == request.expected_kv_len
    assert scheduler.manager.pool.num_free == 4 and not scheduler.has_work


def test_contiguous_queue_mode_waits_and_reject_mode_rejects_as_oom():
    for admission in ("queue", "reject"):
        scheduler = _contiguous(20, "max", max_len=16, admission=admission)
        a, b, c = Request(0, 2, 2), Request(1, 2, 2), Request(2, 30, 2)
        for request in (a, b, c):
            scheduler.add(request)
        assert c.status is RequestStatus.REJECTED and "max-len" in c.reject_reason
        assert scheduler.admit(0) == [a]  # 16 of 20 slots reserved: b does not fit
        if admission == "queue":
            assert list(scheduler.waiting) == [b] and b.status is RequestStatus.WAITING
        else:
            assert not scheduler.waiting and b.status is RequestStatus.REJECTED
            assert b.reject_reason.startswith("oom")


def test_paged_reject_mode_still_queues_because_it_can_preempt():
    scheduler = _paged(2, 4, admission="reject", max_len=16)
    a, b = Request(0, 8, 1), Request(1, 8, 1)
    scheduler.add(a)
    scheduler.add(b)
    assert scheduler.admit(0) == [a]
    assert b.status is RequestStatus.WAITING


def test_contiguous_make_room_cannot_preempt():
    scheduler = _contiguous(8, "oracle", max_len=16)
    request = Request(0, 2, 3)  # reserves exactly 4 slots
    scheduler.add(request)
    scheduler.admit(0)
    assert scheduler.make_room(request, 1) == ([], [])
    with pytest.raises(OutOfBlocks):
        scheduler.make_room(request, 2)  # a 5th slot was never reserved


def test_running_totals_for_contiguous_reservations():
    scheduler = _contiguous(64, "pow2", max_len=32)
    requests = [Request(0, 3, 3), Request(1, 5, 12)]  # kv 5 -> 8 slots, kv 16 -> 16 slots
    for request in requests:
        scheduler.add(request)
    scheduler.admit(0)
    assert [r.held_slots for r in requests] == [8, 16]
    assert scheduler.internal == 3 and scheduler.capped_held == 5 + 16
    _check_totals(scheduler, 0)
    scheduler.finish(requests[0], 2)
    _check_totals(scheduler, 2)
    assert scheduler.internal == 0


def test_external_slots_need_a_waiting_head():
    scheduler = _contiguous(4, "oracle", max_len=16)
    assert scheduler.external_slots() == 0


def test_prefix_cache_only_keeps_blocks_whose_token_states_were_written():
    """The last sampled token is returned but never written to the KV cache: a block it would complete
    must not be cached as full, or a later prompt reuses a slot that holds no token state."""
    manager = PagedManager(BlockPool(8, 4), enable_prefix_caching=True)
    scheduler = Scheduler(manager, EngineConfig(max_len=32))
    first = Request(0, 3, 1, prompt_token_ids=[1, 2, 3])
    scheduler.add(first)
    scheduler.admit(0)
    first.output_token_ids.append(10)  # the engine samples one token at the prefill ...
    scheduler.finish(first, 0)  # ... and finishes: 3 token states written, 4 token ids known
    assert first.final_kv_len == 3
    second = Request(1, 6, 1, prompt_token_ids=[1, 2, 3, 10, 5, 6])
    scheduler.add(second)
    scheduler.admit(0)
    assert manager.prefix_hits == 0  # block [1, 2, 3, 10] was never fully written
    manager.check_invariants()


def test_prefix_cache_hits_after_a_finished_request():
    manager = PagedManager(BlockPool(8, 4), enable_prefix_caching=True)
    scheduler = Scheduler(manager, EngineConfig(max_len=32))
    first = Request(0, 4, 2, prompt_token_ids=[1, 2, 3, 4])
    scheduler.add(first)
    scheduler.admit(0)
    first.output_token_ids += [10, 11]  # kv: 1 2 3 4 10 (11 is never written)
    scheduler.make_room(first, 0)
    scheduler.finish(first, 1)
    assert first.final_kv_len == 5
    second = Request(1, 9, 1, prompt_token_ids=[1, 2, 3, 4, 10, 11, 12, 13, 14])
    scheduler.add(second)
    scheduler.admit(1)
    assert manager.prefix_hits == 1  # only [1, 2, 3, 4]; [10, 11, ...] was never full
