"""A pool of fixed-size KV blocks with ref counts and an O(1) free queue.

The free queue is the blocks never handed out, in id order, followed by a doubly linked list of the blocks
freed after use (over block ids, in two arrays), so that taking the head, appending at the tail and removing
any given free block (a prefix-cache hit) are all O(1). Freed blocks go to the tail, so the least recently
freed block is reused first; this keeps prefix-cached blocks alive as long as possible. The never-used
blocks are a range, not list nodes: a pool costs little until its blocks are used (a simulated fleet holds a
thousand pools of thousands of blocks, most of them never touched).
"""

from __future__ import annotations

from collections.abc import Iterable


class BlockPoolError(RuntimeError):
    """An allocator contract was broken (double free, freeing a free block, ...): a bug, not bad input."""


class OutOfBlocks(RuntimeError):
    """No free block is left."""


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks of ``block_size`` slots that ``tokens`` token states need."""
    return -(-tokens // block_size)


class BlockPool:
    """Blocks handed out one at a time from the free queue (the paged manager's pool)."""

    _NIL = -1

    def __init__(self, num_blocks: int, block_size: int) -> None:
        _check_size(num_blocks, block_size)
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.num_shared = 0  # blocks with more than one owner: none means no write needs copy-on-write
        self.num_free = num_blocks
        self.total_allocations = 0  # block allocations over the pool's life (metrics)
        self._fresh = 0  # blocks _fresh .. num_blocks - 1 were never handed out: the head of the queue, in order
        self._prev = [self._NIL] * num_blocks  # the linked part: blocks freed after use, oldest first
        self._next = [self._NIL] * num_blocks
        self._head = self._NIL
        self._tail = self._NIL
        self._in_free_queue = [True] * num_blocks

    # -- free queue -------------------------------------------------------------------------------------
    def _unlink(self, block: int) -> None:
        prev, nxt = self._prev[block], self._next[block]
        if prev == self._NIL:
            self._head = nxt
        else:
            self._next[prev] = nxt
        if nxt == self._NIL:
            self._tail = prev
        else:
            self._prev[nxt] = prev
        self._prev[block] = self._next[block] = self._NIL
        self._in_free_queue[block] = False
        self.num_free -= 1

    def _append(self, block: int) -> None:
        self._prev[block] = self._tail
        self._next[block] = self._NIL
        if self._tail == self._NIL:
            self._head = block
        else:
            self._next[self._tail] = block
        self._tail = block
        self._in_free_queue[block] = True
        self.num_free += 1

    # -- allocation -------------------------------------------------------------------------------------
    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def is_free(self, block: int) -> bool:
        return self.ref_counts[block] == 0

    def peek_free(self) -> int:
        """The block ``allocate`` would hand out next (the head of the free queue)."""
        if self._fresh < self.num_blocks:
            return self._fresh
        if self._head == self._NIL:
            raise OutOfBlocks("no free KV block")
        return self._head

    def allocate(self) -> int:
        """Take the least recently freed block; its ref count becomes 1."""
        block = self.peek_free()
        self._take_free(block)
        self.ref_counts[block] = 1
        self.total_allocations += 1
        return block

    def take(self, block: int) -> None:
        """Take a specific free block (a contiguous run, or a prefix-cache hit)."""
        if not self._in_free_queue[block]:
            raise BlockPoolError(f"block {block} is not free")
        self._take_free(block)
        self.ref_counts[block] = 1
        self.total_allocations += 1

    def _take_free(self, block: int) -> None:
        if block == self._fresh:  # the next never-used block
            self._fresh += 1
            self._in_free_queue[block] = False
            self.num_free -= 1
            return
        if block > self._fresh:  # a never-used block out of order: the rest of the range becomes list nodes
            self._link_fresh()
        self._unlink(block)

    def _link_fresh(self) -> None:
        """Turn the never-used range into list nodes ahead of the freed ones (same queue order)."""
        for block in range(self.num_blocks - 1, self._fresh - 1, -1):
            self._next[block] = self._head
            self._prev[block] = self._NIL
            if self._head == self._NIL:
                self._tail = block
            else:
                self._prev[self._head] = block
            self._head = block
        self._fresh = self.num_blocks

    def take_run(self, start: int, count: int) -> None:
        """Take the free blocks ``start .. start+count-1``."""
        for block in range(start, start + count):
            self.take(block)

    def release_run(self, start: int, count: int) -> None:
        """Free an unshared run taken with ``take_run``."""
        if self.ref_counts[start : start + count] != [1] * count:
            raise BlockPoolError(f"run {start}+{count} is not an allocated, unshared run (double free?)")
        for block in range(start, start + count):
            self.release(block)

    def share(self, block: int) -> None:
        """One more owner for an allocated block (fork, prefix sharing)."""
        count = self.ref_counts[block]
        if count <= 0:
            raise BlockPoolError(f"cannot share free block {block}")
        self.ref_counts[block] = count + 1
        if count == 1:
            self.num_shared += 1

    def release(self, block: int) -> bool:
        """Drop one owner; returns True when the block went back to the free queue."""
        count = self.ref_counts[block]
        if count <= 0:
            raise BlockPoolError(f"double free of block {block}")
        self.ref_counts[block] = count - 1
        if count == 2:
            self.num_shared -= 1
        if count == 1:
            self._append(block)
            return True
        return False

    def release_all(self, blocks: Iterable[int]) -> None:
        for block in blocks:
            self.release(block)

    def is_shared(self, block: int) -> bool:
        """Writing into a shared block must first copy it (copy-on-write)."""
        return self.ref_counts[block] > 1

    def free_blocks(self) -> list[int]:
        """Free block ids in queue order (for invariant checks and extent rebuilding)."""
        blocks, block = list(range(self._fresh, self.num_blocks)), self._head
        while block != self._NIL:
            blocks.append(block)
            block = self._next[block]
        return blocks

    def check_invariants(self) -> None:
        """Raise BlockPoolError if the pool is inconsistent. O(num_blocks): for tests and debugging."""
        queue = self.free_blocks()
        if len(queue) != self.num_free or len(set(queue)) != len(queue):
            raise BlockPoolError("free queue length or uniqueness broken")
        for block in range(self.num_blocks):
            free = self._in_free_queue[block]
            if free and self.ref_counts[block] != 0:
                raise BlockPoolError(f"free block {block} has ref count {self.ref_counts[block]}")
            if not free and self.ref_counts[block] <= 0:
                raise BlockPoolError(f"allocated block {block} has ref count {self.ref_counts[block]}")
        if self.num_used + self.num_free != self.num_blocks:
            raise BlockPoolError("used + free != total")
        if sum(1 for count in self.ref_counts if count > 1) != self.num_shared:
            raise BlockPoolError("shared-block count is off")


def _check_size(num_blocks: int, block_size: int) -> None:
    if num_blocks <= 0:
        raise ValueError(f"num_blocks must be positive, got {num_blocks}")
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
