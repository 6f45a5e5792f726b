"""Build a KV manager and its block pool by name: the one place that knows both kinds."""

from __future__ import annotations

from kvbench.kv.block_pool import BlockPool
from kvbench.kv.contiguous import ContiguousManager
from kvbench.kv.paged import PagedManager


def build_manager(kind: str, num_blocks: int, block_size: int, reserve: str = "max", max_len: int = 2048):
    """``paged`` (blocks on demand) or ``contiguous`` (a slab per request, reserved by ``reserve``).

    The contiguous pool hands out runs only: its free extents already say where free space is.
    """
    if kind == "paged":
        return PagedManager(BlockPool(num_blocks, block_size))
    if kind == "contiguous":
        return ContiguousManager(BlockPool(num_blocks, block_size, free_queue=False), reserve, max_len)
    raise ValueError(f"unknown KV manager {kind!r}; choose paged or contiguous")
