"""A paged prefix cache counted per trace block, fast enough to run an hour of traffic at many KV sizes.

The rules are the paged manager's with vLLM's prefix caching: a request reuses the leading cached blocks of its
prompt (never the block of its last token), blocks of running requests are pinned, free blocks are reused least
recently freed first (never-used blocks before any), a finished request frees its tail first so its prefix
survives longest, and a request's blocks join the cache once taken (a copy already cached stays the cached
one). A trace names its prompt by blocks of ``sub`` KV blocks ("nodes"); counting each node's cached
KV blocks instead of holding them one by one keeps a step O(nodes), not O(blocks). One approximation: a node is
pinned whole while any running request uses part of it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field


@dataclass
class Holding:
    """What one admitted request holds: the nodes it pins and its blocks that belong to no node."""

    nodes: list[int]  # the request's chain of nodes
    sizes: list[int]  # KV blocks of each node the request can cache (the last node maybe fewer)
    hit_blocks: int  # leading blocks reused from the cache
    pinned: list[int] = field(default_factory=list)  # nodes it pins, in chain order
    plain: int = 0  # its blocks cached under no node (outputs, a partial tail, duplicates of cached blocks)


class PrefixCache:
    """``num_blocks`` KV blocks; nodes are numbered 0 .. ``num_nodes - 1`` (a trie of hash-id chains)."""

    def __init__(self, num_blocks: int, num_nodes: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.num_blocks = num_blocks
        self.cached = [0] * num_nodes  # leading KV blocks of each node in the cache
        self.refs = [0] * num_nodes  # running requests pinning each node
        self.fresh = num_blocks  # never-used blocks: the head of the free queue
        # The rest of the free queue, oldest first: entry -> [blocks, node or -1 for blocks of no node].
        self._queue: OrderedDict[int, list[int]] = OrderedDict()
        self._entry_of: dict[int, int] = {}  # node -> its entry in the queue (a node there has refs == 0)
        self._next_entry = 0
        self.free = num_blocks  # fresh + every queue entry
        self.evicted_blocks = 0  # cached blocks given to other content

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    def lookup(self, nodes: list[int], sizes: list[int], limit: int) -> int:
        """Leading cached blocks of a chain, at most ``limit``."""
        hit = 0
        for node, size in zip(nodes, sizes, strict=True):
            take = min(self.cached[node], size, limit - hit)
            hit += take
            if take < size or hit >= limit:
                break
        return hit

    def admit(self, nodes: list[int], sizes: list[int], limit: int, total_blocks: int) -> Holding | None:
        """Pin the cached prefix and take the other ``total_blocks - hit`` blocks; None (nothing changed) when
        the free blocks, less the pinned prefix's, are too few."""
        hit = self.lookup(nodes, sizes, limit)
        hit_nodes, counted = [], 0
        for node in nodes:
            if counted >= hit:
                break
            hit_nodes.append(node)
            counted += self.cached[node]
        unpinned = sum(self.cached[n] for n in hit_nodes if self.refs[n] == 0)
        new = total_blocks - hit
        if new > self.free - unpinned:
            return None
        for node in hit_nodes:
            self._pin(node)
        self._take(new)
        return Holding(list(nodes), list(sizes), hit, hit_nodes, new)

    def register(self, holding: Holding) -> None:
        """The request's blocks become the cached copy of each node not cached as far (vLLM registers blocks as it
        allocates them, before they are computed)."""
        cached, refs = self.cached, self.refs
        start = max(len(holding.pinned) - 1, 0)  # the nodes before the last one hit are cached in full
        pinned = set(holding.pinned[start:])
        nodes, sizes = holding.nodes, holding.sizes
        for position in range(start, len(nodes)):
            node, size = nodes[position], sizes[position]
            have = cached[node]
            if have >= size:
                continue
            if node not in pinned:
                if refs[node] == 0 and have:  # an unreachable older copy: its blocks become plain free ones
                    self._queue[self._entry_of.pop(node)][1] = -1
                    cached[node] = have = 0
                refs[node] += 1
                holding.pinned.append(node)
            moved = size - have
            if moved > holding.plain:
                moved = holding.plain
            cached[node] = have + moved
            holding.plain -= moved

    def release(self, holding: Holding) -> None:
        """The request finished: its plain blocks go free first, then its nodes from the last to the first."""
        if holding.plain:
            self._append(-1, holding.plain)
        refs, cached, queue, entry_of = self.refs, self.cached, self._queue, self._entry_of
        entry = self._next_entry
        freed = 0
        for node in reversed(holding.pinned):
            refs[node] -= 1
            if refs[node] == 0 and cached[node]:
                queue[entry] = [cached[node], node]
                entry_of[node] = entry
                freed += cached[node]
                entry += 1
        self._next_entry = entry
        self.free += freed
        holding.pinned, holding.plain = [], 0

    # -- the free queue -----------------------------------------------------------------------------------
    def _pin(self, node: int) -> None:
        if self.refs[node] == 0:
            entry = self._entry_of.pop(node, None)
            if entry is not None:
                self.free -= self._queue.pop(entry)[0]
        self.refs[node] += 1

    def _append(self, node: int, blocks: int) -> int:
        entry = self._next_entry
        self._next_entry += 1
        self._queue[entry] = [blocks, node]
        self.free += blocks
        return entry

    def _take(self, count: int) -> None:
        """``count`` free blocks: never-used ones first, then the least recently freed (evicting what they cache)."""
        self.free -= count
        fresh = min(count, self.fresh)
        self.fresh -= fresh
        count -= fresh
        if not count:
            return
        queue, cached, entry_of = self._queue, self.cached, self._entry_of
        evicted = 0
        while count:
            entry, item = queue.popitem(last=False)
            blocks, node = item
            if blocks <= count:
                count -= blocks
                if node >= 0:
                    cached[node] -= blocks  # a node's tail blocks were freed first: they go first
                    evicted += blocks
                    del entry_of[node]
            else:
                item[0] = blocks - count
                queue[entry] = item
                queue.move_to_end(entry, last=False)  # what is left of it stays at the head
                if node >= 0:
                    cached[node] -= count
                    evicted += count
                count = 0
        self.evicted_blocks += evicted

    def check_invariants(self) -> None:
        """Raise AssertionError when the counts disagree (tests)."""
        queued = sum(blocks for blocks, _ in self._queue.values())
        assert self.free == self.fresh + queued, "free != fresh + queued"
        for node, entry in self._entry_of.items():
            blocks, owner = self._queue[entry]
            assert owner == node and self.refs[node] == 0 and self.cached[node] == blocks, f"node {node} entry"
        assert all(r >= 0 for r in self.refs), "negative ref count"
