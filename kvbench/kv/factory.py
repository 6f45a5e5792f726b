"""Build a KV manager and its block pool by name: the one place that maps a name to a manager class."""

from __future__ import annotations

from kvbench.kv.contiguous import ContiguousManager
from kvbench.kv.manager import KVManager
from kvbench.kv.paged import PagedManager
from kvbench.kv.policies import MANAGERS, check_choice

MANAGER_CLASSES: dict[str, type[KVManager]] = {"paged": PagedManager, "contiguous": ContiguousManager}
assert tuple(MANAGER_CLASSES) == MANAGERS, "kv.policies.MANAGERS names the classes registered here"


def manager_class(kind: str) -> type[KVManager]:
    """The class of the manager named ``kind``: what callers ask of its capabilities (``can_fork``, ...)."""
    check_choice(kind, MANAGERS, "KV manager")
    return MANAGER_CLASSES[kind]


def build_manager(
    kind: str,
    num_blocks: int,
    block_size: int,
    reserve: str = "max",
    max_len: int = 2048,
    enable_prefix_caching: bool = False,
) -> KVManager:
    """``paged`` (blocks on demand) or ``contiguous`` (a slab per request, reserved by ``reserve``)."""
    return manager_class(kind).create(num_blocks, block_size, reserve, max_len, enable_prefix_caching)
