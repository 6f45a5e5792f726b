"""PagedManager: block tables, copy-on-write on fork, free, prefix caching; stateful against a model."""

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvbench.kv.block_pool import BlockPool, BlockPoolError, OutOfBlocks, blocks_for
from kvbench.kv.manager import BlockCopy
from kvbench.kv.paged import PagedManager


def _manager(num_blocks, block_size, prefix=False):
    return PagedManager(BlockPool(num_blocks, block_size), enable_prefix_caching=prefix)


@pytest.mark.parametrize(
    "tokens, block_size, blocks", [(0, 4, 0), (1, 4, 1), (4, 4, 1), (5, 4, 2), (16, 16, 1), (17, 16, 2)]
)
def test_blocks_for(tokens, block_size, blocks):
    assert blocks_for(tokens, block_size) == blocks


def test_allocate_and_grow_one_block_at_a_time():
    manager = _manager(8, 4)
    assert manager.allocate(1, 5) == 0
    assert manager.block_tables[1] == [0, 1]
    assert manager.held_slots(1) == 8
    assert manager.ensure_capacity(1, 8) == []  # fills the second block: nothing new
    assert manager.block_tables[1] == [0, 1]
    assert manager.ensure_capacity(1, 9) == []
    assert manager.block_tables[1] == [0, 1, 2]
    assert manager.ensure_capacity(1, 3) == []  # shrinking is a no-op
    assert manager.lengths[1] == 9
    manager.free(1)
    assert manager.pool.num_free == 8
    manager.check_invariants()


def test_allocate_out_of_blocks_leaves_the_pool_unchanged():
    manager = _manager(3, 4)
    manager.allocate(1, 8)
    with pytest.raises(OutOfBlocks):
        manager.allocate(2, 5)
    assert 2 not in manager.block_tables and manager.pool.num_free == 1
    with pytest.raises(BlockPoolError):
        manager.allocate(1, 1)  # the same id twice
    manager.check_invariants()


def test_admission_queries():
    manager = _manager(4, 4)
    assert manager.can_admit(16, 100) and not manager.can_admit(17, 17)
    assert not manager.can_admit(13, 13, reserve_blocks=1)
    assert manager.fits_empty_pool(16) and not manager.fits_empty_pool(17)
    assert manager.external_slots(10) == 0 and manager.external_slots(None) == 0


def test_copy_on_write_of_a_shared_partly_filled_block():
    manager = _manager(8, 4)
    manager.allocate(1, 6)  # blocks [0, 1]; block 1 holds 2 of 4 tokens
    manager.fork(1, 2)
    assert manager.block_tables[2] == [0, 1] and manager.lengths[2] == 6
    assert manager.pool.ref_counts[:2] == [2, 2]
    copies = manager.ensure_capacity(1, 7)
    new = manager.block_tables[1][1]
    assert copies == [BlockCopy(src=1, dst=new)]
    assert manager.block_tables[1] == [0, new] and new not in (0, 1)
    assert manager.block_tables[2] == [0, 1]  # the other request's table is unchanged
    assert manager.pool.ref_counts[0] == 2 and manager.pool.ref_counts[1] == 1 and manager.pool.ref_counts[new] == 1
    # the parent's block is private again: the child now writes in place
    assert manager.ensure_capacity(2, 8) == []
    assert manager.block_tables[2] == [0, 1]
    manager.check_invariants()
    manager.free(1)
    manager.free(2)
    assert manager.pool.num_free == 8


def test_fork_with_a_full_last_block_appends_a_fresh_block_without_copying():
    manager = _manager(8, 4)
    manager.allocate(1, 8)  # two full blocks
    manager.fork(1, 2)
    copies = manager.ensure_capacity(2, 9)
    assert copies == []
    assert manager.block_tables[2][:2] == manager.block_tables[1] == [0, 1]
    fresh = manager.block_tables[2][2]
    assert manager.pool.ref_counts[fresh] == 1 and manager.pool.ref_counts[:2] == [2, 2]
    manager.check_invariants()


def test_copy_on_write_out_of_blocks_leaves_the_request_unchanged():
    manager = _manager(2, 4)
    manager.allocate(1, 6)
    manager.fork(1, 2)
    with pytest.raises(OutOfBlocks):
        manager.ensure_capacity(1, 7)
    assert manager.block_tables == {1: [0, 1], 2: [0, 1]}
    assert manager.lengths == {1: 6, 2: 6}
    manager.check_invariants()


def test_fork_into_an_existing_request_is_refused():
    manager = _manager(4, 4)
    manager.allocate(1, 3)
    manager.allocate(2, 3)
    with pytest.raises(BlockPoolError):
        manager.fork(1, 2)
    manager.check_invariants()


def test_prefix_cache_reuses_full_blocks_but_not_the_last_prompt_token():
    manager = _manager(8, 2, prefix=True)
    prompt = [1, 2, 3, 4, 5]
    assert manager.allocate(1, 5, token_ids=prompt) == 0
    first_two = manager.block_tables[1][:2]
    manager.free(1, token_ids=prompt)  # blocks [1,2] and [3,4] are full and cached
    assert manager.pool.num_free == 8
    assert manager.allocate(2, 6, token_ids=[1, 2, 3, 4, 5, 6]) == 4
    assert manager.block_tables[2][:2] == first_two and manager.prefix_hits == 2
    # the same prompt again while request 2 still holds the blocks: shared, not copied
    assert manager.allocate(3, 6, token_ids=[1, 2, 3, 4, 9, 9]) == 4
    assert manager.block_tables[3][:2] == first_two
    assert [manager.pool.ref_counts[b] for b in first_two] == [2, 2]
    # a prompt that ends with a cached block only reuses the blocks before its last token
    assert manager.allocate(4, 4, token_ids=[1, 2, 3, 4]) == 2
    # a different first block misses everything (chained hash)
    assert manager.allocate(5, 4, token_ids=[7, 2, 3, 4]) == 0
    manager.check_invariants()
    for rid in (2, 3, 4, 5):
        manager.free(rid)
    assert manager.pool.num_free == 8


def test_prefix_cache_forgets_a_block_once_it_is_reused():
    manager = _manager(2, 2, prefix=True)
    manager.allocate(1, 3, token_ids=[1, 2, 3])
    manager.free(1, token_ids=[1, 2, 3])  # block holding [1, 2] cached
    manager.allocate(2, 4, token_ids=[8, 8, 8, 8])  # takes both blocks, evicting the cached one
    manager.free(2)
    assert manager.allocate(3, 3, token_ids=[1, 2, 3]) == 0
    manager.check_invariants()


def test_prefix_cache_out_of_blocks_gives_the_cached_blocks_back():
    manager = _manager(3, 2, prefix=True)
    manager.allocate(1, 3, token_ids=[1, 2, 3])
    manager.free(1, token_ids=[1, 2, 3])
    manager.allocate(9, 2)  # one of the three blocks is busy
    with pytest.raises(OutOfBlocks):
        manager.allocate(2, 7, token_ids=[1, 2, 3, 4, 5, 6, 7])  # needs 4 blocks, 1 of them cached
    assert 2 not in manager.block_tables and manager.pool.num_free == 2
    manager.check_invariants()
    assert manager.allocate(3, 3, token_ids=[1, 2, 3]) == 2  # still cached
    manager.check_invariants()


def test_a_prompts_full_blocks_are_cached_at_admission_and_reported_as_stored():
    manager = _manager(8, 2, prefix=True)
    manager.events = []
    manager.allocate(1, 5, token_ids=[1, 2, 3, 4, 5])
    stored = manager.events[0]
    assert (stored.kind, len(stored.hashes), stored.parent, stored.token_ids) == ("stored", 2, None, (1, 2, 3, 4))
    # a request admitted while the first still runs finds its prefix (the first one's prefill wrote it)
    assert manager.allocate(2, 5, token_ids=[1, 2, 3, 4, 9]) == 4
    manager.free(1, [1, 2, 3, 4, 5, 6])  # its third block filled while decoding: stored at its end, after its parent
    third = manager.events[-1]
    assert third.kind == "stored" and third.parent == stored.hashes[-1] and third.token_ids == (5, 6)
    manager.free(2, [1, 2, 3, 4, 9])
    assert manager.num_cached_blocks == 3


def test_evicting_a_cached_block_is_reported_as_removed():
    manager = _manager(2, 2, prefix=True)
    manager.events = []
    manager.allocate(1, 3, token_ids=[1, 2, 3])
    manager.free(1, [1, 2, 3])
    (stored,) = manager.events
    manager.allocate(2, 4, token_ids=[7, 8, 9, 9])  # needs both blocks: the cached one is reused
    assert manager.events[1].kind == "removed" and manager.events[1].hashes == stored.hashes


def test_reset_is_refused_while_a_block_is_held_and_clears_everything_after():
    manager = _manager(4, 2, prefix=True)
    manager.events = []
    manager.allocate(1, 3, token_ids=[1, 2, 3])
    assert not manager.reset_prefix_cache() and manager.num_cached_blocks == 1
    manager.free(1, [1, 2, 3])
    assert manager.reset_prefix_cache()
    assert manager.num_cached_blocks == 0 and manager.events[-1].kind == "cleared"
    assert manager.allocate(2, 3, token_ids=[1, 2, 3]) == 0  # nothing is found any more


class PagedMachine(RuleBasedStateMachine):
    """Random allocate / fork / append / free (optionally prefix-cached) against a model of every table.

    In prefix mode the model also tracks what each block slot holds, so a prefix-cache hit can be checked
    to hand out blocks whose every slot holds exactly the requested tokens.
    """

    prefix = False

    @initialize(num_blocks=st.integers(1, 16), block_size=st.sampled_from([1, 2, 4]))
    def start(self, num_blocks, block_size):
        self.manager = _manager(num_blocks, block_size, self.prefix)
        self.manager.events = []  # the server's KV event stream: the cached set must follow from it alone
        self.pool = self.manager.pool
        self.bs = block_size
        self.lengths = {}
        self.tokens = {}  # request -> token ids written (prefix mode)
        self.content = {}  # block -> list of slot contents (prefix mode)
        self.next_id = 0

    # -- helpers --------------------------------------------------------------------------------------
    def _snapshot(self):
        return (
            {rid: list(t) for rid, t in self.manager.block_tables.items()},
            list(self.pool.ref_counts),
            self.pool.num_free,
        )

    def _write(self, rid, start, tokens):
        table = self.manager.block_tables[rid]
        for offset, token in enumerate(tokens):
            slot = start + offset
            self.content[table[slot // self.bs]][slot % self.bs] = token

    def _new_id(self):
        self.next_id += 1
        return self.next_id

    # -- rules ----------------------------------------------------------------------------------------
    @rule(data=st.data())
    def allocate(self, data):
        # mostly a block or two, sometimes more than the whole pool
        tokens = data.draw(
            st.one_of(st.integers(1, 2 * self.bs + 1), st.integers(1, self.pool.num_blocks * self.bs + 2))
        )
        rid = self._new_id()
        if self.prefix:
            ids = data.draw(st.lists(st.integers(0, 1), min_size=tokens, max_size=tokens))
            self._allocate_prefix(rid, ids)
            return
        before = self._snapshot()
        if blocks_for(tokens, self.bs) > self.pool.num_free:
            with pytest.raises(OutOfBlocks):
                self.manager.allocate(rid, tokens)
            assert self._snapshot() == before
            return
        assert self.manager.allocate(rid, tokens) == 0
        table = self.manager.block_tables[rid]
        assert len(table) == blocks_for(tokens, self.bs)
        assert all(self.pool.ref_counts[b] == 1 for b in table)
        assert not set(table) & {b for t in before[0].values() for b in t}
        self.lengths[rid] = tokens

    def _allocate_prefix(self, rid, ids):
        before = self._snapshot()
        try:
            cached = self.manager.allocate(rid, len(ids), token_ids=ids)
        except OutOfBlocks:
            tables, refs, free = self._snapshot()
            assert (tables, refs, free) == (before[0], before[1], before[2])
            return
        table = self.manager.block_tables[rid]
        assert len(table) == blocks_for(len(ids), self.bs)
        assert cached % self.bs == 0 and cached <= len(ids) - 1
        for index in range(cached // self.bs):  # a cache hit holds exactly these tokens, all written
            assert self.content[table[index]] == ids[index * self.bs : (index + 1) * self.bs]
        for block in table[cached // self.bs :]:
            assert self.pool.ref_counts[block] == 1
            self.content[block] = [None] * self.bs
        self._write(rid, cached, ids[cached:])
        self.lengths[rid] = len(ids)
        self.tokens[rid] = list(ids)

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def fork(self, data):
        self._fork(data.draw(st.sampled_from(sorted(self.lengths))))

    @precondition(lambda self: self.lengths)
    @rule(data=st.data(), write_child=st.booleans())
    def fork_then_append(self, data, write_child):
        """The copy-on-write path: fork, then one side writes its next token(s)."""
        parent = data.draw(st.sampled_from(sorted(self.lengths)))
        child = self._fork(parent)
        self._append(child if write_child else parent, data.draw(st.integers(1, self.bs + 1)), data)

    def _fork(self, parent):
        child = self._new_id()
        refs = list(self.pool.ref_counts)
        self.manager.fork(parent, child)
        table = self.manager.block_tables[child]
        assert table == self.manager.block_tables[parent]
        assert self.manager.lengths[child] == self.lengths[parent]
        for block in set(table):
            assert self.pool.ref_counts[block] == refs[block] + table.count(block)
        self.lengths[child] = self.lengths[parent]
        if self.prefix:
            self.tokens[child] = list(self.tokens[parent])
        return child

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def append(self, data):
        rid = data.draw(st.sampled_from(sorted(self.lengths)))
        self._append(rid, data.draw(st.integers(0, 2 * self.bs + 1)), data)

    def _append(self, rid, extra, data):
        old_len, new_len = self.lengths[rid], self.lengths[rid] + extra
        before = self._snapshot()
        old_table = before[0][rid]
        first = old_len // self.bs
        new_count = blocks_for(new_len, self.bs)
        shared = [i for i in range(first, min(len(old_table), new_count)) if extra and before[1][old_table[i]] > 1]
        needed = max(0, new_count - len(old_table))
        if extra and needed + len(shared) > before[2]:
            with pytest.raises(OutOfBlocks):
                self.manager.ensure_capacity(rid, new_len)
            assert self._snapshot() == before
            assert self.manager.lengths[rid] == old_len
            return
        copies = self.manager.ensure_capacity(rid, new_len)
        table = self.manager.block_tables[rid]
        assert copies == [BlockCopy(old_table[i], table[i]) for i in shared]
        if old_len % self.bs == 0:
            assert copies == []  # the last block was full: nothing shared gets written
        assert len(table) == new_count
        for index, block in enumerate(old_table):
            if index not in shared:
                assert table[index] == block
        for block in table[first:new_count] if extra else []:
            assert self.pool.ref_counts[block] == 1  # every block about to be written is private
        for other, other_table in before[0].items():
            if other != rid:
                assert self.manager.block_tables[other] == other_table  # nobody else's table moves
        self.lengths[rid] = new_len
        if self.prefix:
            for copy in copies:
                self.content[copy.dst] = list(self.content[copy.src])
            for block in table[len(old_table) :]:
                self.content[block] = [None] * self.bs
            new_ids = data.draw(st.lists(st.integers(0, 1), min_size=extra, max_size=extra))
            self._write(rid, old_len, new_ids)
            self.tokens[rid] += new_ids

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.lengths)))
        table = list(self.manager.block_tables[rid])
        refs, free = list(self.pool.ref_counts), self.pool.num_free
        self.manager.free(rid, self.tokens.pop(rid, None))
        del self.lengths[rid]
        assert rid not in self.manager.block_tables and rid not in self.manager.lengths
        returned = {b for b in table if refs[b] == table.count(b)}
        assert self.pool.num_free == free + len(returned)
        assert all(self.pool.is_free(b) for b in returned)

    @rule()
    def releasing_a_free_block_raises(self):
        if self.pool.num_free:
            block = self.pool.peek_free()
            with pytest.raises(BlockPoolError):
                self.pool.release(block)

    @invariant()
    def consistent(self):
        self.manager.check_invariants()
        owners = [0] * self.pool.num_blocks
        for table in self.manager.block_tables.values():
            for block in table:
                owners[block] += 1
        assert owners == self.pool.ref_counts  # exact ref counts
        assert self.pool.num_used == sum(1 for count in owners if count)
        assert self.pool.num_used + self.pool.num_free == self.pool.num_blocks
        assert self.manager.lengths == self.lengths
        for rid, length in self.lengths.items():
            held = self.manager.held_slots(rid)
            assert 0 <= held - length < self.bs  # paged waste: under one block per request

    def teardown(self):
        if not hasattr(self, "manager"):
            return
        for rid in list(self.lengths):
            self.manager.free(rid, self.tokens.pop(rid, None))
        assert self.pool.num_free == self.pool.num_blocks  # no leak
        self.manager.check_invariants()

    @invariant()
    def the_events_rebuild_the_cached_set(self):
        if not hasattr(self, "manager"):
            return
        cached: set[int] = set()
        for event in self.manager.events:
            if event.kind == "stored":
                assert not cached & set(event.hashes), "a block stored twice without a removal between"
                assert len(event.token_ids) == len(event.hashes) * self.bs
                cached |= set(event.hashes)
            elif event.kind == "removed":
                assert set(event.hashes) <= cached, "a block removed that was never stored"
                cached -= set(event.hashes)
            else:
                cached.clear()
        assert cached == set(self.manager._hash_to_block)
        assert self.manager.num_cached_blocks == len(cached)


class PrefixCachedPagedMachine(PagedMachine):
    prefix = True


TestPagedStateful = PagedMachine.TestCase
TestPagedStateful.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
TestPrefixCachedPagedStateful = PrefixCachedPagedMachine.TestCase
TestPrefixCachedPagedStateful.settings = settings(max_examples=80, stateful_step_count=30, deadline=None)
