"""The paged KV manager: per-request block tables grown one block at a time (PagedAttention).

A request holds ``ceil(tokens / block_size)`` blocks, so its waste is under one block. Requests can be
forked (parallel sampling, beam search): the child shares the parent's blocks by ref count, and the first
write into a shared, partly filled block gets a private copy (copy-on-write). Full blocks can optionally be
cached by a chained hash of their tokens, so a later request with the same prefix reuses them: a prompt's full
blocks are registered when the request is admitted (their KV is written in the step that prefills it, before any
later step reads it), the rest of its full blocks when it ends, as vLLM registers blocks once they fill.
With ``events`` set to a list, each change to the cached set is appended to it in the words vLLM's KV event
stream uses (:class:`CacheEvent`), for a server to publish.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Literal

from kvbench.kv.block_pool import BlockPool, BlockPoolError, OutOfBlocks, blocks_for
from kvbench.kv.manager import BlockCopy


@dataclass(frozen=True, slots=True)
class CacheEvent:
    """One change to the prefix cache: blocks stored (each with its chained hash, in chain order, after
    ``parent``; ``token_ids`` the blocks' tokens end to end), blocks removed (evicted for reuse), or everything
    cleared (a reset)."""

    kind: Literal["stored", "removed", "cleared"]
    hashes: tuple[int, ...] = ()
    parent: int | None = None
    token_ids: tuple[int, ...] = ()


class PagedManager:
    kind = "paged"
    can_preempt: ClassVar[bool] = True  # a request can be evicted and recomputed
    can_fork: ClassVar[bool] = True  # a child shares every block of its parent
    supports_prefix_caching: ClassVar[bool] = True
    reserves_up_front: ClassVar[bool] = False  # blocks come as the request grows

    @classmethod
    def create(
        cls,
        num_blocks: int,
        block_size: int,
        reserve: str = "max",
        max_len: int = 2048,
        enable_prefix_caching: bool = False,
    ) -> PagedManager:
        """A manager over a fresh pool (``reserve`` and ``max_len`` do not apply: nothing is reserved)."""
        return cls(BlockPool(num_blocks, block_size), enable_prefix_caching=enable_prefix_caching)

    @staticmethod
    def slots_for(final_length: int, reserve: str, max_len: int) -> int:
        """Token slots a request of ``final_length`` holds at most (before rounding to whole blocks)."""
        return final_length

    def __init__(self, pool: BlockPool, enable_prefix_caching: bool = False) -> None:
        self.pool = pool
        self.block_size = pool.block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.block_tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}  # tokens written or being written, per request
        self._hash_to_block: dict[int, int] = {}
        self._block_to_hash: dict[int, int] = {}
        self.prefix_hits = 0  # blocks reused from the prefix cache
        self.events: list[CacheEvent] | None = None  # a list: every change to the cached set is appended

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose content the prefix cache can hand out (held by a request or free but not yet reused)."""
        return len(self._block_to_hash)

    # -- queries ----------------------------------------------------------------------------------------
    def live_ids(self) -> list[int]:
        return list(self.block_tables)

    def block_table(self, request_id: int) -> list[int]:
        return self.block_tables[request_id]

    def writes_shared_block(self, request_id: int, position: int) -> bool:
        """Whether writing token ``position`` lands in a block another request also holds (copy-on-write)."""
        if not self.pool.num_shared:  # the common case: nothing is shared, nothing to check
            return False
        table = self.block_tables[request_id]
        index = position // self.block_size
        return index < len(table) and self.pool.is_shared(table[index])

    def held_slots(self, request_id: int) -> int:
        return len(self.block_tables[request_id]) * self.block_size

    def can_admit(self, prefill_tokens: int, final_length: int, reserve_blocks: int = 0) -> bool:
        """Room for the prefill now, keeping ``reserve_blocks`` free for the running requests to grow."""
        return blocks_for(prefill_tokens, self.block_size) + reserve_blocks <= self.pool.num_free

    def fits_empty_pool(self, final_length: int) -> bool:
        return blocks_for(final_length, self.block_size) <= self.pool.num_blocks

    def external_slots(self, head_final_length: int | None) -> int:
        """Paging places any block anywhere: no external fragmentation by construction."""
        return 0

    # -- allocation -------------------------------------------------------------------------------------
    def _new_block(self) -> int:
        block = self.pool.allocate()
        cached_hash = self._block_to_hash.pop(block, None)
        if cached_hash is not None:  # reusing an evictable cached block: forget its content
            del self._hash_to_block[cached_hash]
            if self.events is not None:
                self.events.append(CacheEvent("removed", (cached_hash,)))
        return block

    def allocate(
        self,
        request_id: int,
        total_tokens: int,
        final_length: int | None = None,
        token_ids: Sequence[int] | None = None,
    ) -> int:
        """Give a new request blocks for ``total_tokens``. Returns how many tokens the prefix cache covers.

        ``final_length`` is accepted for symmetry with the contiguous manager; paging needs no forecast.
        """
        if request_id in self.block_tables:
            raise BlockPoolError(f"request {request_id} already holds blocks")
        table: list[int] = []
        cached_tokens = 0
        prompt = token_ids if self.enable_prefix_caching else None
        if prompt is not None:
            table, cached_tokens = self._lookup_prefix(prompt, total_tokens)
        needed = blocks_for(total_tokens, self.block_size) - len(table)
        if needed > self.pool.num_free:
            self.pool.release_all(table)
            raise OutOfBlocks(f"request {request_id} needs {needed} blocks, {self.pool.num_free} free")
        table.extend(self._new_block() for _ in range(needed))
        self.block_tables[request_id] = table
        self.lengths[request_id] = total_tokens
        if prompt is not None:
            self._remember_prefix(table, prompt[:total_tokens])
        return cached_tokens

    def ensure_capacity(self, request_id: int, total_tokens: int) -> list[BlockCopy]:
        """Make room for the request to reach ``total_tokens`` tokens (written so far + about to be written).

        Blocks the new tokens will land in that are shared with another request get a private copy first
        (copy-on-write); the returned copies must be executed on the KV tensors before the write. Raises
        OutOfBlocks, leaving the request unchanged, when the pool cannot supply the blocks.
        """
        table = self.block_tables[request_id]
        old_length = self.lengths[request_id]
        if total_tokens <= old_length:
            return []
        if not self.pool.num_shared:  # the common case: no block is shared, nothing to copy first
            needed = blocks_for(total_tokens, self.block_size) - len(table)
            if needed > self.pool.num_free:
                raise OutOfBlocks(f"request {request_id} needs {needed} blocks, {self.pool.num_free} free")
            for _ in range(needed):
                table.append(self._new_block())
            self.lengths[request_id] = total_tokens
            return []
        first_written = old_length // self.block_size
        shared = [
            i
            for i in range(first_written, min(len(table), blocks_for(total_tokens, self.block_size)))
            if self.pool.is_shared(table[i])
        ]
        needed = max(0, blocks_for(total_tokens, self.block_size) - len(table))
        if needed + len(shared) > self.pool.num_free:
            raise OutOfBlocks(f"request {request_id} needs {needed + len(shared)} blocks, {self.pool.num_free} free")
        copies = []
        for index in shared:
            old, new = table[index], self._new_block()
            self.pool.release(old)
            table[index] = new
            copies.append(BlockCopy(old, new))
        table.extend(self._new_block() for _ in range(needed))
        self.lengths[request_id] = total_tokens
        return copies

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent (ref counts +1)."""
        if child_id in self.block_tables:
            raise BlockPoolError(f"request {child_id} already holds blocks")
        table = list(self.block_tables[parent_id])
        for block in table:
            self.pool.share(block)
        self.block_tables[child_id] = table
        self.lengths[child_id] = self.lengths[parent_id]

    def free(self, request_id: int, token_ids: Sequence[int] | None = None) -> None:
        """Release a request's blocks. With prefix caching, its full blocks stay cached until reused."""
        table = self.block_tables.pop(request_id)
        del self.lengths[request_id]
        if self.enable_prefix_caching and token_ids is not None:
            self._remember_prefix(table, token_ids)
        self.pool.release_all(reversed(table))  # the tail is freed first so the prefix survives longest

    # -- prefix caching ---------------------------------------------------------------------------------
    def _chain_hashes(self, token_ids: Sequence[int], num_full_blocks: int) -> list[int]:
        hashes, parent = [], 0
        for index in range(num_full_blocks):
            chunk = tuple(token_ids[index * self.block_size : (index + 1) * self.block_size])
            parent = hash((parent, chunk))
            hashes.append(parent)
        return hashes

    def _lookup_prefix(self, token_ids: Sequence[int], total_tokens: int) -> tuple[list[int], int]:
        # never reuse the block holding the last prompt token: its state must be recomputed for sampling
        full = min(len(token_ids) - 1, total_tokens) // self.block_size
        table: list[int] = []
        for chain_hash in self._chain_hashes(token_ids, full):
            block = self._hash_to_block.get(chain_hash)
            if block is None:
                break
            if self.pool.is_free(block):
                self.pool.take(block)
            else:
                self.pool.share(block)
            table.append(block)
        self.prefix_hits += len(table)
        return table, len(table) * self.block_size

    def _remember_prefix(self, table: list[int], token_ids: Sequence[int]) -> None:
        full = min(len(token_ids) // self.block_size, len(table))
        stored: list[tuple[int, int]] = []  # (index in the chain, hash) of the blocks registered now
        hashes = self._chain_hashes(token_ids, full)
        for index, (block, chain_hash) in enumerate(zip(table[:full], hashes, strict=True)):
            if chain_hash in self._hash_to_block or block in self._block_to_hash:
                continue
            self._hash_to_block[chain_hash] = block
            self._block_to_hash[block] = chain_hash
            stored.append((index, chain_hash))
        if self.events is not None and stored:
            self._report_stored(stored, hashes, token_ids)

    def _report_stored(self, stored: list[tuple[int, int]], hashes: list[int], token_ids: Sequence[int]) -> None:
        """One stored event per unbroken run of newly registered blocks (each run names its parent)."""
        assert self.events is not None
        size = self.block_size
        start = 0
        for at in range(1, len(stored) + 1):
            if at == len(stored) or stored[at][0] != stored[at - 1][0] + 1:
                first, last = stored[start][0], stored[at - 1][0]
                self.events.append(
                    CacheEvent(
                        "stored",
                        tuple(hashes[first : last + 1]),
                        hashes[first - 1] if first else None,
                        tuple(token_ids[first * size : (last + 1) * size]),
                    )
                )
                start = at

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block, as vLLM's reset does: refused (False) while any block is held, or with
        prefix caching off."""
        if self.pool.num_used or not self.enable_prefix_caching:
            return False
        self._hash_to_block.clear()
        self._block_to_hash.clear()
        if self.events is not None:
            self.events.append(CacheEvent("cleared"))
        return True

    # -- invariants -------------------------------------------------------------------------------------
    def check_invariants(self) -> None:
        self.pool.check_invariants()
        owners = [0] * self.pool.num_blocks
        for table in self.block_tables.values():
            for block in table:
                owners[block] += 1
        for block, count in enumerate(owners):
            if count != self.pool.ref_counts[block]:
                raise BlockPoolError(f"block {block}: {count} owners but ref count {self.pool.ref_counts[block]}")
