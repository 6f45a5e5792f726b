"""BlockPool: O(1) free queue, ref counts, share/release, take/take_run and its invariant check."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvbench.kv.block_pool import BlockPool, BlockPoolError, OutOfBlocks


def test_fresh_pool_hands_out_blocks_in_order():
    pool = BlockPool(4, 16)
    assert (pool.num_free, pool.num_used) == (4, 0)
    assert [pool.allocate() for _ in range(4)] == [0, 1, 2, 3]
    assert pool.ref_counts == [1, 1, 1, 1]
    assert (pool.num_free, pool.num_used) == (0, 4)
    with pytest.raises(OutOfBlocks):
        pool.allocate()
    with pytest.raises(OutOfBlocks):
        pool.peek_free()
    pool.check_invariants()


def test_freed_blocks_go_to_the_tail():
    pool = BlockPool(3, 1)
    a, b, c = pool.allocate(), pool.allocate(), pool.allocate()
    assert pool.release(b) is True
    assert pool.release(a) is True
    assert pool.free_blocks() == [b, a]  # least recently freed first
    assert pool.allocate() == b
    assert pool.allocate() == a
    assert pool.total_allocations == 5
    assert c == 2


def test_shared_block_survives_until_its_last_owner_releases_it():
    pool = BlockPool(2, 4)
    block = pool.allocate()
    pool.share(block)
    pool.share(block)
    assert pool.ref_counts[block] == 3 and pool.is_shared(block)
    assert pool.release(block) is False
    assert pool.release(block) is False
    assert not pool.is_shared(block) and not pool.is_free(block)
    assert pool.release(block) is True
    assert pool.is_free(block) and pool.num_free == 2
    pool.check_invariants()


def test_double_free_and_sharing_a_free_block_raise():
    pool = BlockPool(2, 4)
    block = pool.allocate()
    pool.release(block)
    with pytest.raises(BlockPoolError, match="double free"):
        pool.release(block)
    with pytest.raises(BlockPoolError):
        pool.release(1)  # never allocated
    with pytest.raises(BlockPoolError):
        pool.share(block)
    pool.check_invariants()
    assert pool.num_free == 2


def test_take_specific_blocks_and_runs():
    pool = BlockPool(6, 2)
    pool.take_run(2, 3)
    assert [pool.is_free(b) for b in range(6)] == [True, True, False, False, False, True]
    assert pool.free_blocks() == [0, 1, 5]
    with pytest.raises(BlockPoolError, match="not free"):
        pool.take(3)
    pool.take(5)
    assert pool.free_blocks() == [0, 1]
    assert pool.peek_free() == 0
    pool.check_invariants()


@pytest.mark.parametrize("num_blocks, block_size", [(0, 16), (-1, 16), (4, 0), (4, -2)])
def test_bad_sizes_are_refused(num_blocks, block_size):
    with pytest.raises(ValueError):
        BlockPool(num_blocks, block_size)


def test_check_invariants_catches_corruption():
    pool = BlockPool(3, 1)
    block = pool.allocate()
    pool.ref_counts[block] = 0  # an allocated block without an owner
    with pytest.raises(BlockPoolError):
        pool.check_invariants()
    pool = BlockPool(3, 1)
    pool.ref_counts[1] = 2  # a free block with owners
    with pytest.raises(BlockPoolError):
        pool.check_invariants()


class BlockPoolMachine(RuleBasedStateMachine):
    """The pool against a model: a ref count per block and the free queue as an ordered list."""

    @initialize(num_blocks=st.integers(1, 12), block_size=st.sampled_from([1, 2, 16]))
    def start(self, num_blocks, block_size):
        self.pool = BlockPool(num_blocks, block_size)
        self.refs = [0] * num_blocks
        self.queue = list(range(num_blocks))  # the model's free queue, head first

    def _allocated(self):
        return [b for b, count in enumerate(self.refs) if count > 0]

    @rule()
    def allocate(self):
        if not self.queue:
            with pytest.raises(OutOfBlocks):
                self.pool.allocate()
            return
        block = self.pool.allocate()
        assert block == self.queue.pop(0)
        self.refs[block] = 1

    @rule(data=st.data())
    def take(self, data):
        block = data.draw(st.integers(0, len(self.refs) - 1))
        if self.refs[block]:
            with pytest.raises(BlockPoolError):
                self.pool.take(block)
            return
        self.pool.take(block)
        self.queue.remove(block)
        self.refs[block] = 1

    @rule(data=st.data())
    def take_run(self, data):
        start = data.draw(st.integers(0, len(self.refs) - 1))
        count = data.draw(st.integers(1, len(self.refs) - start))
        run = range(start, start + count)
        if any(self.refs[b] for b in run):
            return  # take_run of a partly used run is not atomic; the managers never ask for one
        self.pool.take_run(start, count)
        for block in run:
            self.queue.remove(block)
            self.refs[block] = 1

    @precondition(lambda self: any(self.refs))
    @rule(data=st.data())
    def share(self, data):
        block = data.draw(st.sampled_from(self._allocated()))
        self.pool.share(block)
        self.refs[block] += 1

    @precondition(lambda self: any(self.refs))
    @rule(data=st.data())
    def release(self, data):
        block = data.draw(st.sampled_from(self._allocated()))
        returned = self.pool.release(block)
        self.refs[block] -= 1
        assert returned == (self.refs[block] == 0)
        if returned:
            self.queue.append(block)

    @precondition(lambda self: self.queue)
    @rule(data=st.data())
    def double_free_raises(self, data):
        block = data.draw(st.sampled_from(self.queue))
        with pytest.raises(BlockPoolError):
            self.pool.release(block)
        with pytest.raises(BlockPoolError):
            self.pool.share(block)

    @rule()
    def release_everything(self):
        for block in self._allocated():
            self.pool.release_all([block] * self.refs[block])
            self.refs[block] = 0
            self.queue.append(block)
        assert self.pool.num_free == self.pool.num_blocks  # no leak

    @invariant()
    def matches_model(self):
        self.pool.check_invariants()
        assert self.pool.ref_counts == self.refs
        assert self.pool.free_blocks() == self.queue
        assert self.pool.num_free == len(self.queue) == self.refs.count(0)
        assert self.pool.num_used + self.pool.num_free == self.pool.num_blocks
        for block, count in enumerate(self.refs):
            assert self.pool.is_free(block) == (count == 0)
            assert self.pool.is_shared(block) == (count > 1)

    def teardown(self):
        if hasattr(self, "pool"):
            self.release_everything()
            self.pool.check_invariants()


TestBlockPoolStateful = BlockPoolMachine.TestCase
TestBlockPoolStateful.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


def test_a_pool_costs_little_until_its_blocks_are_used():
    """Never-used blocks are a range, not list nodes: four 8-byte slots per block, no object per block (a
    simulated fleet holds a thousand pools of thousands of blocks, most never touched)."""
    import tracemalloc

    tracemalloc.start()
    try:
        pool = BlockPool(200_000, 16)
        size, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert size < 34 * 200_000  # an int object per link would be 2 x 36 bytes per block more
    blocks = [pool.allocate() for _ in range(3)]
    assert blocks == [0, 1, 2] and pool.num_free == 200_000 - 3
    pool.take(10)  # a never-used block out of order: the queue keeps its order
    assert pool.free_blocks()[:9] == [3, 4, 5, 6, 7, 8, 9, 11, 12]
    pool.release(1)
    assert pool.free_blocks()[-1] == 1 and pool.peek_free() == 3
    pool.check_invariants()
