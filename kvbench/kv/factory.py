"""Build a KV manager and its block pool by name: the one place that knows both kinds."""

from __future__ import annotations

from kvbench.kv.block_pool import BlockPool
from kvbench.kv.contiguous import ContiguousManager
from kvbench.kv.manager import KVManager
from kvbench.kv.paged import PagedManager
from kvbench.kv.policies import MANAGERS, check_choice
from kvbench.kv.run_pool import RunPool


def build_manager(kind: str, num_blocks: int, block_size: int, reserve: str = "max", max_len: int = 2048,
                  enable_prefix_caching: bool = False) -> KVManager:
    """``paged`` (blocks on demand) or ``contiguous`` (a slab per request, reserved by ``reserve``).

    The contiguous pool hands out runs only: its free extents already say where free space is.
    """
    check_choice(kind, MANAGERS, "KV manager")
    if kind == "paged":
        return PagedManager(BlockPool(num_blocks, block_size), enable_prefix_caching=enable_prefix_caching)
    return ContiguousManager(RunPool(num_blocks, block_size), reserve, max_len)
