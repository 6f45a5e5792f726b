"""Where a prompt's leading blocks are cached, as a KV-aware router knows it: two ways, keyed by content.

A block is named by a chained digest of its tokens and every token before it (:func:`block_keys`), the router's
own name, so it never needs a server's hash function or seed. :class:`HeldBlocks` is the precise view (llm-d's
precise prefix scorer): an instance's resident blocks rebuilt from its KV events (stored, removed, cleared), each
server hash mapped to the content key of the tokens the event carried. :class:`SentBlocks` is the approximate
view (Dynamo's approximate indexer): the router remembers which instance it sent each block to, for a time to
live, and never hears of evictions. Both answer one question: how many leading blocks of a prompt an instance
holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence

from kvbench.kv.paged import CacheEvent
from kvbench.measure.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, Event

ROOT = b"kvbench-prefix-root"


def block_keys(token_ids: Sequence[int], block_size: int, blocks: int | None = None) -> list[bytes]:
    """The content keys of the first ``blocks`` full blocks of ``token_ids`` (all full blocks by default)."""
    full = len(token_ids) // block_size
    count = full if blocks is None else min(blocks, full)
    keys: list[bytes] = []
    parent = ROOT
    for index in range(count):
        chunk = token_ids[index * block_size : (index + 1) * block_size]
        parent = _digest(parent, chunk)
        keys.append(parent)
    return keys


def reusable_keys(token_ids: Sequence[int], block_size: int) -> list[bytes]:
    """The keys of the blocks a prefix cache can serve: full blocks, never the prompt's last token (whose
    logits the server must compute), as vLLM and kvbench serve count a hit."""
    return block_keys(token_ids, block_size, max(0, len(token_ids) - 1) // block_size)


def _digest(parent: bytes, tokens: Sequence[int]) -> bytes:
    data = parent + b"".join(int(t).to_bytes(8, "little", signed=True) for t in tokens)
    return hashlib.blake2b(data, digest_size=16).digest()


def leading(keys: Sequence[bytes], holds) -> int:
    """How many of ``keys``, from the first, ``holds(key)`` is true for."""
    count = 0
    for key in keys:
        if not holds(key):
            break
        count += 1
    return count


class HeldBlocks:
    """One instance's resident blocks as its KV events describe them."""

    def __init__(self) -> None:
        self._key_of: dict[int | bytes, bytes] = {}  # the server's block hash -> our content key
        self._held: dict[bytes, int] = {}  # content key -> server blocks holding it (one, unless hashes differ)
        self.unchained = 0  # stored blocks whose parent was never heard of (a missed event): not indexed

    def __len__(self) -> int:
        return len(self._held)

    def stored(
        self, hashes: Sequence[int | bytes], parent: int | bytes | None, token_ids: Sequence[int], block_size: int
    ) -> None:
        if parent is None:
            key = ROOT
        elif parent in self._key_of:
            key = self._key_of[parent]
        else:
            self.unchained += len(hashes)
            return
        if block_size < 1 or len(token_ids) < len(hashes) * block_size:
            self.unchained += len(hashes)
            return
        for index, server_hash in enumerate(hashes):
            key = _digest(key, token_ids[index * block_size : (index + 1) * block_size])
            if server_hash in self._key_of:
                continue
            self._key_of[server_hash] = key
            self._held[key] = self._held.get(key, 0) + 1

    def removed(self, hashes: Sequence[int | bytes]) -> None:
        for server_hash in hashes:
            key = self._key_of.pop(server_hash, None)
            if key is None:
                continue
            left = self._held.get(key, 0) - 1
            if left > 0:
                self._held[key] = left
            else:
                self._held.pop(key, None)

    def cleared(self) -> None:
        self._key_of.clear()
        self._held.clear()

    def overlap(self, keys: Sequence[bytes]) -> int:
        return leading(keys, self._held.__contains__)


class SentBlocks:
    """The blocks the router sent to each instance, each remembered for ``ttl_s`` after it was last sent."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self._until: dict[bytes, dict[int, float]] = {}  # key -> instance -> when the memory of it expires
        self._sent = 0  # keys recorded since the last sweep of expired ones

    def record(self, keys: Sequence[bytes], instance: int, now: float) -> None:
        until = now + self.ttl_s
        for key in keys:
            self._until.setdefault(key, {})[instance] = until
        self._sent += len(keys)
        if self._sent > 4 * len(self._until) + 10_000:  # memory follows the live keys, not the run's length
            self._expire(now)

    def overlap(self, keys: Sequence[bytes], instance: int, now: float) -> int:
        return leading(keys, lambda key: self._until.get(key, {}).get(instance, -1.0) >= now)

    def _expire(self, now: float) -> None:
        self._sent = 0
        for key in list(self._until):
            live = {i: t for i, t in self._until[key].items() if t >= now}
            if live:
                self._until[key] = live
            else:
                del self._until[key]


def feed_events(held: HeldBlocks, events: Iterable[CacheEvent | Event], block_size: int) -> None:
    """Apply cache events in order: a manager's own (:class:`CacheEvent`) or a server's from the wire."""
    for event in events:
        if isinstance(event, CacheEvent):
            if event.kind == "stored":
                held.stored(event.hashes, event.parent, event.token_ids, block_size)
            elif event.kind == "removed":
                held.removed(event.hashes)
            else:
                held.cleared()
        elif isinstance(event, BlockStored):
            held.stored(event.block_hashes, event.parent_block_hash, event.token_ids, event.block_size or block_size)
        elif isinstance(event, BlockRemoved):
            held.removed(event.block_hashes)
        elif isinstance(event, AllBlocksCleared):
            held.cleared()
