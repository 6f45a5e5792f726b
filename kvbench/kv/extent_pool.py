"""A pool that hands out runs of consecutive blocks only: the contiguous baseline's slabs.

The contiguous manager's free extents already say where free space is, so this pool needs no free queue:
a run is marked taken or free with one slice assignment, O(1) Python calls per run instead of one per
block (a max-len slab of a 13B model spans thousands of blocks). Runs are never shared.
"""

from __future__ import annotations

from kvbench.kv.block_pool import BlockPoolError


class RunPool:
    """Ref counts (0 or 1) of ``num_blocks`` blocks taken and released a run at a time."""

    num_shared = 0  # runs are private: the baseline holds copies instead of sharing

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.ref_counts = [0] * num_blocks
        self.num_free = num_blocks
        self.total_allocations = 0  # block allocations over the pool's life (metrics)

    @property
    def num_used(self) -> int:
        return self.num_blocks - self.num_free

    def is_free(self, block: int) -> bool:
        return self.ref_counts[block] == 0

    def is_shared(self, block: int) -> bool:
        return False

    def take_run(self, start: int, count: int) -> None:
        """Take the free blocks ``start .. start+count-1``."""
        end = start + count
        if start < 0 or end > self.num_blocks or any(self.ref_counts[start:end]):
            raise BlockPoolError(f"run {start}+{count} is not free")
        self.ref_counts[start:end] = [1] * count
        self.num_free -= count
        self.total_allocations += count

    def release_run(self, start: int, count: int) -> None:
        """Free a run taken with ``take_run``."""
        end = start + count
        if self.ref_counts[start:end] != [1] * count:
            raise BlockPoolError(f"run {start}+{count} is not an allocated run (double free?)")
        self.ref_counts[start:end] = [0] * count
        self.num_free += count

    def free_blocks(self) -> list[int]:
        """Free block ids in order (for invariant checks)."""
        return [block for block, count in enumerate(self.ref_counts) if count == 0]

    def check_invariants(self) -> None:
        """Raise BlockPoolError if the pool is inconsistent. O(num_blocks): for tests and debugging."""
        if any(count not in (0, 1) for count in self.ref_counts):
            raise BlockPoolError("a run pool holds a shared or negative block")
        if self.ref_counts.count(0) != self.num_free:
            raise BlockPoolError("used + free != total")
