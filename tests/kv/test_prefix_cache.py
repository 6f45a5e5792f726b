"""The node-counted prefix cache: hand-computed hits, pinning, and block for block against an explicit LRU."""

from __future__ import annotations

from collections import OrderedDict

from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.kv.prefix_cache import PrefixCache


def run_sequential(cache: PrefixCache, requests: list[tuple[list[int], list[int], int, int]]) -> list[int]:
    """Each request admitted, prefilled and finished before the next: the hit blocks of each."""
    hits = []
    for nodes, sizes, limit, total in requests:
        holding = cache.admit(nodes, sizes, limit, total)
        assert holding is not None
        hits.append(holding.hit_blocks)
        cache.register(holding)
        cache.release(holding)
        cache.check_invariants()
    return hits


def test_every_second_request_repeats_the_first_prefix():
    # four blocks of prompt each: A B C D, then A B C E: the second reuses three blocks, the fourth too
    cache = PrefixCache(100, 10)
    first = ([0, 1, 2, 3], [1, 1, 1, 1], 3, 5)  # limit: (4 blocks x 1 token... ) three blocks may hit
    other = ([0, 1, 2, 4], [1, 1, 1, 1], 3, 5)
    fresh = ([5, 6, 7, 8], [1, 1, 1, 1], 3, 5)
    assert run_sequential(cache, [first, other, fresh, other]) == [0, 3, 0, 3]


def test_the_last_prompt_block_is_never_a_hit():
    cache = PrefixCache(100, 4)
    same = ([0, 1, 2], [1, 1, 1], 2, 4)  # a prompt of exactly three blocks: at most two reused
    assert run_sequential(cache, [same, same]) == [0, 2]


def test_a_cache_one_block_too_small_loses_the_prefix_tail_first():
    # a request holds 4 blocks (3 prompt + 1 output); its prefix is 3 cached blocks. With 4 blocks in all, a
    # different request of 4 blocks evicts everything; with one block more than the first request needs, the
    # unrelated request evicts the plain output block and the prefix's last block only
    request = ([0, 1, 2, 3], [1, 1, 1, 1], 3, 5)
    other = ([4, 5, 6, 7], [1, 1, 1, 1], 3, 5)
    assert run_sequential(PrefixCache(5, 8), [request, other, request]) == [0, 0, 0]
    # 9 blocks: after `other` (5 new blocks: 4 fresh + the output block), all four prefix blocks remain
    assert run_sequential(PrefixCache(9, 8), [request, other, request]) == [0, 0, 3]
    # 8 blocks: `other` takes 3 fresh and 2 freed (the output block, then node 3's block): 0 1 2 remain
    assert run_sequential(PrefixCache(8, 8), [request, other, request]) == [0, 0, 3]
    # 7 blocks: 2 fresh + output + nodes 3 and 2: only 0 1 remain
    assert run_sequential(PrefixCache(7, 8), [request, other, request]) == [0, 0, 2]


def test_pinned_blocks_cannot_be_evicted():
    cache = PrefixCache(6, 8)
    running = cache.admit([0, 1, 2], [1, 1, 1], 2, 4)  # holds 4 of 6 blocks
    assert running is not None
    cache.register(running)
    # a second request of 3 blocks does not fit: only 2 are free and the 4 held are pinned
    assert cache.admit([3, 4], [1, 1], 1, 3) is None
    cache.check_invariants()
    # one sharing the running request's prefix fits: its 2 hit blocks are already held
    sharing = cache.admit([0, 1, 5], [1, 1, 1], 2, 3)
    assert sharing is not None and sharing.hit_blocks == 2 and cache.free == 1
    cache.release(running)
    cache.release(sharing)
    cache.check_invariants()
    assert cache.free == 6


def test_partially_evicted_node_keeps_its_leading_blocks():
    # nodes of 4 blocks: eviction removes a node's tail blocks first, so a later request reuses the head
    cache = PrefixCache(12, 4)
    first = ([0, 1], [4, 4], 7, 9)
    assert run_sequential(cache, [first])[0] == 0
    other = cache.admit([2, 3], [4, 4], 7, 9)  # 3 fresh + plain output + 4 of node 1 + 1 of node 0
    assert other is not None and cache.cached[0] == 3 and cache.cached[1] == 0
    cache.release(other)
    again = cache.admit([0, 1], [4, 4], 7, 9)
    assert again is not None and again.hit_blocks == 3


class ExplicitLru:
    """Every KV block one by one: a free list ordered by release, each block knowing (node, index)."""

    def __init__(self, num_blocks: int) -> None:
        self.fresh = list(range(num_blocks))
        self.free: OrderedDict[int, None] = OrderedDict()
        self.content: dict[int, tuple[int, int]] = {}  # block -> (node, index in node)
        self.where: dict[tuple[int, int], int] = {}

    def run(self, nodes: list[int], sizes: list[int], limit: int, total: int) -> int:
        hit_blocks: list[int] = []
        for node, size in zip(nodes, sizes, strict=True):
            for index in range(size):
                block = self.where.get((node, index))
                if block is None or len(hit_blocks) >= limit:
                    break
                hit_blocks.append(block)
            else:
                continue
            break
        for block in hit_blocks:
            self.free.pop(block, None)
        new = []
        for _ in range(total - len(hit_blocks)):
            if self.fresh:
                block = self.fresh.pop(0)
            else:
                block, _ = self.free.popitem(last=False)
                old = self.content.pop(block, None)
                if old is not None:
                    del self.where[old]
            new.append(block)
        table = list(hit_blocks)
        keys = [(node, index) for node, size in zip(nodes, sizes, strict=True) for index in range(size)]
        for key in keys[len(hit_blocks) :]:
            block = new.pop(0)
            if key not in self.where:
                self.where[key] = block
                self.content[block] = key
            table.append(block)
        table += new  # the output and any partial tail: plain blocks
        plain = [b for b in table if b not in self.content]
        cached = [b for b in table if b in self.content]
        for block in plain:  # the paged manager frees a request's tail first; plain blocks are its tail here
            self.free[block] = None
        for block in reversed(cached):
            self.free[block] = None
        return len(hit_blocks)


@settings(max_examples=80, deadline=None)
@given(
    st.integers(2, 30),
    st.integers(1, 4),
    st.lists(
        st.tuples(st.integers(0, 5), st.integers(1, 4), st.integers(0, 3), st.integers(0, 5)), min_size=1, max_size=25
    ),
)
def test_sequential_requests_match_an_explicit_lru(num_blocks, sub, shapes):
    # Prompts from a small trie (a branch, a depth): prefixes repeat and diverge. Every node has one size, and
    # every hit node is used whole (no last-token limit), where the node count is exact; a node used in part
    # is pinned whole, the one approximation the module states.
    cache, explicit = PrefixCache(num_blocks, 10_000), ExplicitLru(num_blocks)
    for branch, depth, partial, output in shapes:
        nodes = [branch * 100 + level * 10 for level in range(depth)]
        sizes = [sub] * depth
        if partial and sub > 1:  # a partial last block: a node of its own
            nodes[-1] = 5000 + branch * 100 + depth * 10 + partial
            sizes[-1] = max(1, sub - partial)
        prompt_blocks = sum(sizes)
        total = prompt_blocks + output
        if total > num_blocks:
            continue
        holding = cache.admit(nodes, sizes, prompt_blocks, total)
        assert holding is not None
        assert holding.hit_blocks == explicit.run(nodes, sizes, prompt_blocks, total)
        cache.register(holding)
        cache.release(holding)
        cache.check_invariants()
