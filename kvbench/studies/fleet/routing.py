"""Routing policies: which instance gets an arriving request. Small classes behind one interface.

A policy sees one :class:`InstanceView` per instance that may take work now (serving, not draining, not
dead) and returns the position of its choice. The KV-aware ones (``approx-prefix``, ``precise-prefix``) also
weigh how much of the prompt each instance already holds (``prefix_index``). Add your own by subclassing
:class:`RoutingPolicy` and registering it in :data:`POLICIES`; the fleet runs every policy on the same arrivals.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.engine.request import Request
from kvbench.errors import KvbenchError
from kvbench.kv.block_pool import blocks_for
from kvbench.studies.fleet.prefix_index import HeldBlocks, SentBlocks, reusable_keys


@dataclass(frozen=True)
class InstanceView:
    """What the router knows of one instance at the arrival instant."""

    index: int  # the instance's number in the fleet (stable across scale-ups and downs)
    total_blocks: int
    free_blocks: int  # free in the pool as last reported
    queued_blocks: int  # prefill blocks of requests routed here and not yet admitted (reported + in transit)
    running: int
    waiting: int
    in_flight: int  # requests the router sent here that have not ended

    @property
    def effective_free_blocks(self) -> int:
        """Free blocks net of the demand already queued here: what a new request can count on."""
        return self.free_blocks - self.queued_blocks


class RoutingPolicy:
    """Chooses one of ``views`` (never empty) for ``request``; returns its position in ``views``."""

    name = "policy"

    def __init__(self, seed: int = 0, block_size: int = 16) -> None:
        self.seed = seed
        self.block_size = block_size

    def choose(self, request: Request, views: Sequence[InstanceView], now: float = 0.0) -> int:
        """``now``: the arrival's time on the fleet's clock (what a time to live counts on)."""
        raise NotImplementedError


class RoundRobin(RoutingPolicy):
    """The next instance after the one chosen last, by instance number (skipping those not serving)."""

    name = "round-robin"

    def __init__(self, seed: int = 0, block_size: int = 16) -> None:
        super().__init__(seed, block_size)
        self._last = -1

    def choose(self, request: Request, views: Sequence[InstanceView], now: float = 0.0) -> int:
        after = [pos for pos, view in enumerate(views) if view.index > self._last]
        pos = after[0] if after else 0
        self._last = views[pos].index
        return pos


class Random(RoutingPolicy):
    """Uniformly at random, from a seeded generator (the same choices for the same arrivals)."""

    name = "random"

    def __init__(self, seed: int = 0, block_size: int = 16) -> None:
        super().__init__(seed, block_size)
        self._rng = np.random.default_rng(seed)

    def choose(self, request: Request, views: Sequence[InstanceView], now: float = 0.0) -> int:
        return int(self._rng.integers(len(views)))


class LeastRequests(RoutingPolicy):
    """The fewest requests in flight (the router's own count); ties to the lowest instance number."""

    name = "least-requests"

    def choose(self, request: Request, views: Sequence[InstanceView], now: float = 0.0) -> int:
        return min(range(len(views)), key=lambda pos: (views[pos].in_flight, views[pos].index))


class MostFreeBlocks(RoutingPolicy):
    """The most free KV blocks (net of queued prefills), the seed article's rule; ties to fewer in flight."""

    name = "most-free-blocks"

    def choose(self, request: Request, views: Sequence[InstanceView], now: float = 0.0) -> int:
        return max(
            range(len(views)),
            key=lambda pos: (views[pos].effective_free_blocks, -views[pos].in_flight, -views[pos].index),
        )


class PrefixAffinity(RoutingPolicy):
    """The same prompt prefix goes to the same instance, where its KV blocks are cached, within a load cap.

    The prefix (the prompt's first ``prefix_blocks`` full blocks, never its last token) is hashed and the
    instances are ranked by rendezvous hashing, so a prefix keeps its instance when others join or leave.
    The first instance in that order whose requests in flight stay within ``load_cap`` times the fleet's
    mean (plus one) takes it: a hot prefix spills over instead of swamping one instance.
    """

    name = "prefix-affinity"
    prefix_blocks = 4
    load_cap = 1.5

    def choose(self, request: Request, views: Sequence[InstanceView], now: float = 0.0) -> int:
        key = self.prefix_key(request)
        order = sorted(range(len(views)), key=lambda pos: _rendezvous(key, views[pos].index), reverse=True)
        cap = self.load_cap * (sum(v.in_flight for v in views) + 1) / len(views) + 1
        for pos in order:
            if views[pos].in_flight < cap:
                return pos
        return min(order, key=lambda pos: views[pos].in_flight)

    def prefix_key(self, request: Request) -> bytes:
        ids = request.prompt_token_ids
        if not ids:  # no token ids (a length-only simulation): every request is its own prefix
            return request.request_id.to_bytes(8, "little", signed=True)
        cacheable = (len(ids) - 1) // self.block_size * self.block_size
        length = min(cacheable, self.prefix_blocks * self.block_size) or len(ids)
        return np.asarray(ids[:length], dtype=np.int64).tobytes()


class KvAware(RoutingPolicy):
    """The least cost in blocks: ``prefix_weight`` x the prompt blocks the instance would prefill (its prompt
    blocks less those it holds) + ``load_weight`` x its blocks in use and queued, as Dynamo's KV router weighs
    overlap against load; ties to fewer requests in flight. Subclasses say how holdings are known."""

    prefix_weight = 1.0
    load_weight = 1.0

    def choose(self, request: Request, views: Sequence[InstanceView], now: float = 0.0) -> int:
        keys = reusable_keys(request.prompt_token_ids or (), self.block_size)
        blocks = blocks_for(request.prompt_len, self.block_size)
        costs = []
        for view in views:
            prefill = blocks - self.overlap(keys, view.index, now)
            load = view.total_blocks - view.effective_free_blocks  # in use, and queued here
            costs.append((self.prefix_weight * prefill + self.load_weight * load, view.in_flight, view.index))
        pos = min(range(len(views)), key=costs.__getitem__)
        self.sent(keys, views[pos].index, now)
        return pos

    def overlap(self, keys: list[bytes], instance: int, now: float) -> int:
        raise NotImplementedError

    def sent(self, keys: list[bytes], instance: int, now: float) -> None:
        """The router's own memory of where it sent a prompt's blocks (the approximate view keeps it)."""


class ApproxPrefix(KvAware):
    """KV-aware, the holdings guessed from the router's own choices: a prompt's blocks count as held where it
    sent them within the last ``ttl_s`` seconds (evictions unseen), as Dynamo's approximate indexer guesses."""

    name = "approx-prefix"
    ttl_s = 120.0

    def __init__(self, seed: int = 0, block_size: int = 16) -> None:
        super().__init__(seed, block_size)
        self.index = SentBlocks(self.ttl_s)

    def overlap(self, keys: list[bytes], instance: int, now: float) -> int:
        return self.index.overlap(keys, instance, now)

    def sent(self, keys: list[bytes], instance: int, now: float) -> None:
        self.index.record(keys, instance, now)


class PrecisePrefix(KvAware):
    """KV-aware, the holdings read from each instance's KV events (stored, removed, cleared), as llm-d's precise
    prefix scorer reads vLLM's: the driver fills :attr:`held`, one :class:`HeldBlocks` per instance number."""

    name = "precise-prefix"
    needs_kv_events = True

    def __init__(self, seed: int = 0, block_size: int = 16) -> None:
        super().__init__(seed, block_size)
        self.held: dict[int, HeldBlocks] = {}

    def overlap(self, keys: list[bytes], instance: int, now: float) -> int:
        held = self.held.get(instance)
        return held.overlap(keys) if held is not None else 0


def _rendezvous(key: bytes, index: int) -> int:
    digest = hashlib.blake2b(key + index.to_bytes(4, "little"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


POLICIES: dict[str, Callable[..., RoutingPolicy]] = {
    cls.name: cls
    for cls in (RoundRobin, Random, LeastRequests, MostFreeBlocks, PrefixAffinity, ApproxPrefix, PrecisePrefix)
}
DEFAULT_POLICIES = ("round-robin", "random", "least-requests", "most-free-blocks", "prefix-affinity", "approx-prefix")


@dataclass(frozen=True)
class KvWeights:
    """The KV-aware policies' weights and the approximate view's memory."""

    prefix: float = KvAware.prefix_weight
    load: float = KvAware.load_weight
    ttl_s: float = ApproxPrefix.ttl_s


def make_policy(name: str, seed: int = 0, block_size: int = 16, weights: KvWeights | None = None) -> RoutingPolicy:
    if name not in POLICIES:
        raise KvbenchError(f"unknown routing policy {name!r}; choose from {', '.join(POLICIES)}")
    policy = POLICIES[name](seed=seed, block_size=block_size)
    if isinstance(policy, KvAware) and weights is not None:
        policy.prefix_weight, policy.load_weight = weights.prefix, weights.load
        if isinstance(policy, ApproxPrefix):
            policy.index = SentBlocks(weights.ttl_s)
    return policy


def needs_kv_events(name: str) -> bool:
    return bool(getattr(POLICIES.get(name), "needs_kv_events", False))
