"""What the scheduler, the engine and the studies may ask of a KV manager: one explicit contract.

Two managers implement it: :class:`~kvbench.kv.paged.PagedManager` (block tables grown one block at a time)
and :class:`~kvbench.kv.contiguous.ContiguousManager` (one slab per request, reserved up front). Every
``manager`` parameter in the project is typed with :class:`KVManager`, so nothing needs to know which kind
it holds: a contiguous request's block table is simply a run of consecutive blocks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar, Protocol


@dataclass(frozen=True)
class BlockCopy:
    """Copy block ``src`` onto ``dst`` before writing (copy-on-write, or a private copy of a beam)."""

    src: int
    dst: int


class BlockSource(Protocol):
    """The pool a manager draws from, as its users see it (counts, and the invariant check)."""

    num_blocks: int
    block_size: int
    num_free: int
    num_shared: int
    total_allocations: int
    ref_counts: list[int]

    @property
    def num_used(self) -> int: ...

    def free_blocks(self) -> list[int]: ...

    def check_invariants(self) -> None: ...


class KVManager(Protocol):
    """A KV manager. What callers may ask of its kind, without naming it, are class-level capabilities
    (``can_fork``, ``supports_prefix_caching``, ...: ``kv.factory.manager_class(name)`` gives the class)."""

    kind: str  # its name in kv.policies.MANAGERS
    can_preempt: ClassVar[bool]  # a request can be evicted and recomputed (paged); never (contiguous)
    can_fork: ClassVar[bool]  # a child request can share its parent's blocks (parallel sampling, beams)
    supports_prefix_caching: ClassVar[bool]  # full blocks can be reused by a later request with the same prefix
    reserves_up_front: ClassVar[bool]  # a request's memory is sized at admission (a slab), not as it grows
    block_size: int
    enable_prefix_caching: bool
    lengths: dict[int, int]  # tokens written or being written, per live request

    @property
    def pool(self) -> BlockSource:
        """The pool it draws from (read-only here, so a manager may hold a narrower pool type)."""
        ...

    @classmethod
    def create(
        cls,
        num_blocks: int,
        block_size: int,
        reserve: str = "max",
        max_len: int = 2048,
        enable_prefix_caching: bool = False,
    ) -> KVManager:
        """A manager over a fresh pool of ``num_blocks`` blocks."""
        ...

    @staticmethod
    def slots_for(final_length: int, reserve: str, max_len: int) -> int:
        """Token slots a request whose KV reaches ``final_length`` holds at most (before rounding to blocks)."""
        ...

    def live_ids(self) -> list[int]:
        """Requests holding KV memory now."""
        ...

    def block_table(self, request_id: int) -> list[int]:
        """The request's blocks in order, for the attention kernels."""
        ...

    def held_slots(self, request_id: int) -> int: ...

    def writes_shared_block(self, request_id: int, position: int) -> bool:
        """Whether writing token ``position`` needs a copy first (copy-on-write)."""
        ...

    def can_admit(self, prefill_tokens: int, final_length: int, reserve_blocks: int = 0) -> bool: ...

    def fits_empty_pool(self, final_length: int) -> bool: ...

    def external_slots(self, head_final_length: int | None) -> int:
        """Free slots the request at the head of the queue cannot use (external fragmentation)."""
        ...

    def allocate(
        self, request_id: int, total_tokens: int, final_length: int, token_ids: Sequence[int] | None = None
    ) -> int:
        """Memory for a new request's first ``total_tokens``; returns the tokens a prefix cache covers."""
        ...

    def ensure_capacity(self, request_id: int, total_tokens: int) -> list[BlockCopy]:
        """Room for the request to reach ``total_tokens``; the copies to run before writing."""
        ...

    def fork(self, parent_id: int, child_id: int) -> None:
        """The child shares every block of the parent (paged only: the contiguous baseline copies)."""
        ...

    def free(self, request_id: int, token_ids: Sequence[int] | None = None) -> None: ...

    @property
    def num_cached_blocks(self) -> int:
        """Blocks whose content a prefix cache can hand out (0 without one)."""
        ...

    def reset_prefix_cache(self) -> bool:
        """Forget every cached block; False when refused (a block is held) or there is no prefix cache."""
        ...

    def check_invariants(self) -> None: ...


class KVLeak(RuntimeError):
    """A run ended with KV memory still held: a bug in the engine or a manager, never bad input."""


def assert_drained(manager: KVManager, what: str = "run") -> None:
    """After a run: the manager's invariants hold, no request is live and every block is back in the pool."""
    manager.check_invariants()
    live = manager.live_ids()
    if live or manager.pool.num_used:
        raise KVLeak(f"{what} leaked {manager.pool.num_used} KV block(s) held by {len(live)} live request(s)")
