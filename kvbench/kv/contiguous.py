"""The contiguous baseline: each request reserves one run of consecutive blocks up front.

This is how FasterTransformer, Orca and static caches behave: the slab is sized by a reservation policy
when the request is admitted and never grows in place. Runs are placed first-fit over the free extents of
the same block pool the paged manager uses, so external fragmentation is real and measurable.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from typing import ClassVar

from kvbench.kv.block_pool import BlockPool, BlockPoolError, OutOfBlocks, blocks_for
from kvbench.kv.extent_pool import RunPool
from kvbench.kv.manager import BlockCopy
from kvbench.kv.policies import RESERVATION_POLICIES, check_choice


def next_pow2(value: int) -> int:
    return 1 if value <= 1 else 1 << (value - 1).bit_length()


def reservation_tokens(policy: str, final_length: int, max_len: int) -> int:
    """Token slots reserved for a request whose KV will reach ``final_length`` tokens.

    ``max``: the model's max length for everyone; ``pow2``: the next power of two of the real length
    (capped at max_len); ``oracle``: exactly the real length (an upper bound no real system reaches).
    """
    if policy == "max":
        return max_len
    if policy == "pow2":
        return min(next_pow2(final_length), max_len)
    if policy == "oracle":
        return final_length
    check_choice(policy, RESERVATION_POLICIES, "reservation policy")
    raise AssertionError("unreachable")


class FreeExtents:
    """Free runs of consecutive block ids, kept sorted and merged; first-fit placement."""

    def __init__(self, num_blocks: int) -> None:
        self.starts: list[int] = [0]
        self.lengths: dict[int, int] = {0: num_blocks}

    def largest(self) -> int:
        return max(self.lengths.values(), default=0)

    def first_fit(self, count: int) -> int | None:
        for start in self.starts:
            if self.lengths[start] >= count:
                return start
        return None

    def take(self, start: int, count: int) -> None:
        length = self.lengths.pop(start)
        index = bisect.bisect_left(self.starts, start)
        if length == count:
            del self.starts[index]
        else:
            self.starts[index] = start + count
            self.lengths[start + count] = length - count

    def give_back(self, start: int, count: int) -> None:
        index = bisect.bisect_left(self.starts, start)
        if index < len(self.starts) and self.starts[index] < start + count:
            raise BlockPoolError(f"extent {start}+{count} overlaps a free extent")
        end = start + count
        if index < len(self.starts) and self.starts[index] == end:  # merge with the next extent
            count += self.lengths.pop(end)
            del self.starts[index]
        if index > 0:
            prev = self.starts[index - 1]
            if prev + self.lengths[prev] == start:  # merge with the previous extent
                self.lengths[prev] += count
                return
            if prev + self.lengths[prev] > start:
                raise BlockPoolError(f"extent {start}+{count} overlaps a free extent")
        self.starts.insert(index, start)
        self.lengths[start] = count


class ContiguousManager:
    kind = "contiguous"
    can_preempt: ClassVar[bool] = False  # a slab is never evicted
    can_fork: ClassVar[bool] = False  # a child gets a copy of its own
    supports_prefix_caching: ClassVar[bool] = False  # a slab is private from start to end
    reserves_up_front: ClassVar[bool] = True  # the slab is sized by the reservation policy at admission
    enable_prefix_caching = False

    @classmethod
    def create(
        cls,
        num_blocks: int,
        block_size: int,
        reserve: str = "max",
        max_len: int = 2048,
        enable_prefix_caching: bool = False,
    ) -> ContiguousManager:
        """A manager over a fresh pool that hands out runs only (its free extents already say where space is)."""
        return cls(RunPool(num_blocks, block_size), reserve, max_len)

    @staticmethod
    def slots_for(final_length: int, reserve: str, max_len: int) -> int:
        """Token slots a request of ``final_length`` holds at most: its reservation (before rounding to blocks)."""
        return reservation_tokens(reserve, final_length, max_len)

    def __init__(self, pool: RunPool | BlockPool, policy: str = "max", max_len: int = 2048) -> None:
        check_choice(policy, RESERVATION_POLICIES, "reservation policy")
        self.pool = pool
        self.block_size = pool.block_size
        self.policy = policy
        self.max_len = max_len
        self.extents = FreeExtents(pool.num_blocks)
        self.runs: dict[int, tuple[int, int]] = {}  # request id -> (first block, block count)
        self.lengths: dict[int, int] = {}

    @property
    def num_cached_blocks(self) -> int:
        return 0  # a slab caches nothing for another request

    def reset_prefix_cache(self) -> bool:
        return False  # no prefix cache to empty

    def reservation_blocks(self, final_length: int) -> int:
        return blocks_for(reservation_tokens(self.policy, final_length, self.max_len), self.block_size)

    def live_ids(self) -> list[int]:
        return list(self.runs)

    def held_slots(self, request_id: int) -> int:
        return self.runs[request_id][1] * self.block_size

    def writes_shared_block(self, request_id: int, position: int) -> bool:
        """Runs are private: the baseline holds full copies instead of sharing."""
        return False

    def block_table(self, request_id: int) -> list[int]:
        start, count = self.runs[request_id]
        return list(range(start, start + count))

    def can_admit(self, prefill_tokens: int, final_length: int, reserve_blocks: int = 0) -> bool:
        return self.extents.first_fit(self.reservation_blocks(final_length)) is not None

    def external_slots(self, head_final_length: int | None) -> int:
        """Free slots stranded by fragmentation: the head request fits in the free total but in no extent."""
        if head_final_length is None:
            return 0
        need = self.reservation_blocks(head_final_length)
        if self.pool.num_free >= need and self.extents.largest() < need:
            return self.pool.num_free * self.block_size
        return 0

    def fits_empty_pool(self, final_length: int) -> bool:
        return self.reservation_blocks(final_length) <= self.pool.num_blocks

    def allocate(
        self, request_id: int, total_tokens: int, final_length: int, token_ids: Sequence[int] | None = None
    ) -> int:
        """Reserve the request's whole slab now; ``total_tokens`` are written at once (the prompt)."""
        if request_id in self.runs:
            raise BlockPoolError(f"request {request_id} already holds a run")
        count = self.reservation_blocks(final_length)
        if total_tokens > count * self.block_size:
            raise OutOfBlocks(f"request {request_id}: {total_tokens} tokens exceed its reservation")
        start = self.extents.first_fit(count)
        if start is None:
            raise OutOfBlocks(
                f"request {request_id} needs {count} consecutive blocks; largest free run is {self.extents.largest()}"
            )
        self.extents.take(start, count)
        self.pool.take_run(start, count)
        self.runs[request_id] = (start, count)
        self.lengths[request_id] = total_tokens
        return 0

    def ensure_capacity(self, request_id: int, total_tokens: int) -> list[BlockCopy]:
        """A run never grows in place: writing past the reservation is an error."""
        if total_tokens > self.held_slots(request_id):
            raise OutOfBlocks(f"request {request_id} outgrew its reservation of {self.held_slots(request_id)} slots")
        self.lengths[request_id] = max(self.lengths[request_id], total_tokens)
        return []

    def fork(self, parent_id: int, child_id: int) -> None:
        raise BlockPoolError("the contiguous baseline never shares a slab: give the child its own copy")

    def free(self, request_id: int, token_ids: Sequence[int] | None = None) -> None:
        start, count = self.runs.pop(request_id)
        del self.lengths[request_id]
        self.pool.release_run(start, count)
        self.extents.give_back(start, count)

    def check_invariants(self) -> None:
        self.pool.check_invariants()
        free = set(self.pool.free_blocks())
        from_extents = {b for s in self.extents.starts for b in range(s, s + self.extents.lengths[s])}
        if free != from_extents:
            raise BlockPoolError("free extents disagree with the pool's free blocks")
        if self.extents.starts != sorted(self.extents.starts):
            raise BlockPoolError("free extents not sorted")
        for s in self.extents.starts:  # merged: no two extents touch
            if s + self.extents.lengths[s] in self.extents.lengths:
                raise BlockPoolError("adjacent free extents not merged")
        held = sum(count for _, count in self.runs.values())
        if held != self.pool.num_used:
            raise BlockPoolError("runs disagree with the pool's used blocks")
