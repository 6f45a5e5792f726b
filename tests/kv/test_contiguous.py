"""Contiguous baseline: reservation policies, first-fit free extents, runs that never grow; stateful."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request, RequestStatus
from kvbench.engine.scheduler import Scheduler
from kvbench.errors import KvbenchError
from kvbench.kv.block_pool import BlockPool, BlockPoolError, OutOfBlocks, blocks_for
from kvbench.kv.contiguous import ContiguousManager, FreeExtents, next_pow2, reservation_tokens


@pytest.mark.parametrize("value, expected", [(0, 1), (1, 1), (2, 2), (3, 4), (500, 512), (512, 512), (513, 1024)])
def test_next_pow2(value, expected):
    assert next_pow2(value) == expected


@pytest.mark.parametrize(
    "policy, final, max_len, expected",
    [
        ("max", 500, 2048, 2048),
        ("max", 1, 2048, 2048),
        ("pow2", 500, 2048, 512),
        ("pow2", 512, 2048, 512),
        ("pow2", 513, 2048, 1024),
        ("pow2", 1500, 2048, 2048),
        ("pow2", 1500, 1800, 1800),  # capped at max_len
        ("oracle", 500, 2048, 500),
        ("oracle", 1, 2048, 1),
    ],
)
def test_reservation_tokens(policy, final, max_len, expected):
    assert reservation_tokens(policy, final, max_len) == expected


def test_unknown_policy_is_refused():
    with pytest.raises(KvbenchError, match="max, pow2, oracle"):
        reservation_tokens("exact", 10, 20)
    with pytest.raises(KvbenchError):
        ContiguousManager(BlockPool(4, 1), "exact")


def test_reservation_blocks_round_up_to_whole_blocks():
    manager = ContiguousManager(BlockPool(64, 16), "pow2", max_len=1000)
    assert manager.reservation_blocks(500) == 32  # 512 slots
    assert manager.reservation_blocks(600) == blocks_for(1000, 16) == 63  # capped at max_len, rounded up
    assert ContiguousManager(BlockPool(64, 16), "oracle").reservation_blocks(17) == 2


def test_free_extents_first_fit_and_merging():
    extents = FreeExtents(10)
    assert extents.first_fit(10) == 0 and extents.first_fit(11) is None
    extents.take(0, 10)
    assert extents.starts == [] and extents.largest() == 0 and extents.first_fit(1) is None
    extents.give_back(2, 2)
    extents.give_back(7, 3)
    assert extents.starts == [2, 7] and extents.lengths == {2: 2, 7: 3}
    assert extents.first_fit(2) == 2  # lowest address that fits, not the best fit
    assert extents.first_fit(3) == 7
    extents.give_back(4, 3)  # bridges both neighbours
    assert extents.starts == [2] and extents.lengths == {2: 8}
    extents.give_back(0, 2)
    assert extents.starts == [0] and extents.lengths == {0: 10}


def test_free_extents_refuse_overlaps():
    extents = FreeExtents(10)
    extents.take(0, 10)
    extents.give_back(3, 3)
    with pytest.raises(BlockPoolError):
        extents.give_back(5, 2)  # overlaps [3, 6) from the right
    with pytest.raises(BlockPoolError):
        extents.give_back(2, 2)  # overlaps [3, 6) from the left


def test_first_fit_picks_the_lowest_address_hole_and_runs_never_grow():
    manager = ContiguousManager(BlockPool(10, 1), "oracle", max_len=10)
    for rid, length in enumerate([2, 3, 2, 3]):
        manager.allocate(rid, 1, length)
    assert manager.runs == {0: (0, 2), 1: (2, 3), 2: (5, 2), 3: (7, 3)}
    manager.free(1)
    manager.free(3)  # holes [2, 5) and [7, 10)
    manager.allocate(4, 1, 2)
    assert manager.runs[4] == (2, 2)  # lowest address that fits
    manager.allocate(5, 1, 3)
    assert manager.runs[5] == (7, 3)  # [4, 5) is too small
    assert manager.block_table(5) == [7, 8, 9]
    assert manager.ensure_capacity(5, 3) == []
    with pytest.raises(OutOfBlocks, match="outgrew"):
        manager.ensure_capacity(5, 4)
    assert manager.lengths[5] == 3
    with pytest.raises(BlockPoolError):
        manager.allocate(5, 1, 1)  # the same id twice
    with pytest.raises(OutOfBlocks):
        manager.allocate(6, 3, 2)  # prompt longer than its own reservation
    manager.check_invariants()


def test_external_fragmentation_appears_when_the_middle_run_is_freed():
    pool = BlockPool(12, 1)
    manager = ContiguousManager(pool, "oracle", max_len=12)
    manager.allocate(1, 1, 4)  # [0, 4)
    manager.allocate(2, 1, 4)  # [4, 8)
    manager.allocate(3, 1, 3)  # [8, 11); [11, 12) free
    manager.free(2)  # free extents [4, 8) and [11, 12): 5 slots, the largest 4
    assert manager.extents.largest() == 4 and pool.num_free == 5
    assert manager.external_slots(5) == 5  # fits the free total, not any extent
    assert manager.external_slots(4) == 0  # fits an extent
    assert manager.external_slots(6) == 0  # more than is free at all: not fragmentation
    assert manager.external_slots(None) == 0
    assert not manager.can_admit(1, 5) and manager.can_admit(1, 4)


def test_scheduler_reports_external_slots_for_the_waiting_head():
    manager = ContiguousManager(BlockPool(12, 1), "oracle", max_len=12)
    scheduler = Scheduler(manager, EngineConfig(max_num_seqs=8, max_len=12))
    a, b, c = Request(1, 1, 4), Request(2, 1, 4), Request(3, 1, 3)  # kv lengths 4, 4, 3
    head = Request(4, 2, 4)  # kv length 5
    for request in (a, b, c, head):
        scheduler.add(request)
    assert scheduler.admit(clock=0) == [a, b, c]  # the head does not fit the one free slot
    assert scheduler.external_slots() == 0  # 1 free slot < 5: plain shortage, not fragmentation
    scheduler.finish(b, clock=0)
    assert scheduler.admit(clock=0) == []
    assert scheduler.external_slots() > 0
    assert scheduler.external_slots() == 5
    assert head.status is RequestStatus.WAITING


def test_free_twice_and_shared_runs_raise():
    manager = ContiguousManager(BlockPool(4, 1), "oracle", max_len=4)
    manager.allocate(1, 1, 2)
    manager.pool.share(0)
    with pytest.raises(BlockPoolError, match="shared"):
        manager.free(1)
    manager = ContiguousManager(BlockPool(4, 1), "oracle", max_len=4)
    manager.allocate(1, 1, 2)
    manager.free(1)
    with pytest.raises(KeyError):
        manager.free(1)
    with pytest.raises(BlockPoolError):
        manager.pool.release(0)
    manager.check_invariants()


def _free_runs(free):
    """Maximal runs of consecutive free block ids, in address order."""
    runs, start = [], None
    for block in range(len(free) + 1):
        is_free = block < len(free) and free[block]
        if is_free and start is None:
            start = block
        elif not is_free and start is not None:
            runs.append((start, block - start))
            start = None
    return runs


class ContiguousMachine(RuleBasedStateMachine):
    @initialize(
        num_blocks=st.integers(1, 24),
        block_size=st.sampled_from([1, 2, 4]),
        policy=st.sampled_from(["max", "pow2", "oracle"]),
        max_len=st.integers(2, 40),
    )
    def start(self, num_blocks, block_size, policy, max_len):
        self.manager = ContiguousManager(BlockPool(num_blocks, block_size), policy, max_len)
        self.pool = self.manager.pool
        self.bs = block_size
        self.max_len = max_len
        self.runs = {}  # rid -> (start, count)
        self.lengths = {}
        self.next_id = 0

    def _free_map(self):
        free = [True] * self.pool.num_blocks
        for start, count in self.runs.values():
            for block in range(start, start + count):
                free[block] = False
        return free

    @rule(data=st.data())
    def allocate(self, data):
        final = data.draw(st.integers(1, self.max_len))
        prompt = data.draw(st.integers(1, final))
        self.next_id += 1
        rid = self.next_id
        count = blocks_for(reservation_tokens(self.manager.policy, final, self.max_len), self.bs)
        assert self.manager.reservation_blocks(final) == count
        fits = [start for start, length in _free_runs(self._free_map()) if length >= count]
        if not fits:
            assert not self.manager.can_admit(prompt, final)
            with pytest.raises(OutOfBlocks):
                self.manager.allocate(rid, prompt, final)
            return
        assert self.manager.can_admit(prompt, final)
        self.manager.allocate(rid, prompt, final)
        assert self.manager.runs[rid] == (fits[0], count)  # first fit: the lowest address that fits
        assert self.manager.block_table(rid) == list(range(fits[0], fits[0] + count))
        self.runs[rid] = (fits[0], count)
        self.lengths[rid] = prompt

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def append(self, data):
        rid = data.draw(st.sampled_from(sorted(self.runs)))
        total = self.lengths[rid] + data.draw(st.integers(0, 2 * self.bs + 2))
        held = self.runs[rid][1] * self.bs
        if total > held:
            with pytest.raises(OutOfBlocks):
                self.manager.ensure_capacity(rid, total)
        else:
            assert self.manager.ensure_capacity(rid, total) == []
            self.lengths[rid] = total
        assert self.manager.runs[rid] == self.runs[rid]  # never grows or moves

    @precondition(lambda self: self.runs)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.runs)))
        start, count = self.runs.pop(rid)
        del self.lengths[rid]
        self.manager.free(rid)
        assert all(self.pool.is_free(b) for b in range(start, start + count))

    @precondition(lambda self: self.pool.num_free)
    @rule()
    def double_free_raises(self):
        with pytest.raises(BlockPoolError):
            self.pool.release(self.pool.peek_free())

    @rule(final=st.integers(1, 40))
    def external_slots_match_the_definition(self, final):
        need = self.manager.reservation_blocks(final)
        largest = max((length for _, length in _free_runs(self._free_map())), default=0)
        expected = self.pool.num_free * self.bs if self.pool.num_free >= need > largest else 0
        assert self.manager.external_slots(final) == expected

    @invariant()
    def consistent(self):
        self.manager.check_invariants()
        assert self.manager.runs == self.runs
        assert self.manager.lengths == self.lengths
        taken = [b for start, count in self.runs.values() for b in range(start, start + count)]
        assert len(taken) == len(set(taken))  # runs never overlap
        assert all(self.pool.ref_counts[b] == 1 for b in taken)
        assert self.pool.num_used == len(taken)
        assert self.pool.num_used + self.pool.num_free == self.pool.num_blocks
        extents = [(s, self.manager.extents.lengths[s]) for s in self.manager.extents.starts]
        assert extents == _free_runs(self._free_map())  # sorted, merged, exactly the free blocks
        assert self.manager.extents.largest() == max((n for _, n in extents), default=0)
        for rid, length in self.lengths.items():
            assert length <= self.manager.held_slots(rid)

    def teardown(self):
        if not hasattr(self, "manager"):
            return
        for rid in list(self.runs):
            self.manager.free(rid)
        assert self.pool.num_free == self.pool.num_blocks  # no leak
        assert self.manager.extents.starts == [0]
        self.manager.check_invariants()


TestContiguousStateful = ContiguousMachine.TestCase
TestContiguousStateful.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
