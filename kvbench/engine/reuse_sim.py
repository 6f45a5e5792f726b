"""A trace at its arrival times through one deployment's prefix cache: what the cache serves at a KV size.

Requests are admitted first come, first served while their blocks fit (the cached prefix pinned, the rest of
prompt and output taken at once) and the running count is under the cap; their prompt blocks join the cache as
they are taken, as vLLM registers blocks when it allocates them, so a request scheduled next can reuse them. A
request larger than the whole pool is refused, as a server refuses it. Prefills run one after another on the
GPU, each for the roofline time of its uncached tokens; decode runs at the roofline step time of the batch it
joins. The cache is :class:`~kvbench.kv.prefix_cache.PrefixCache`, optionally backed by a CPU tier that keeps a
copy of every node a request brings (write-through, least recently used out) and serves a prefix the GPU lost
without recompute.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Protocol

from kvbench.kv.prefix_cache import Holding, PrefixCache
from kvbench.workload.prefix_trace import PrefixTrace


class StepTiming(Protocol):
    def decode_coefficients(self, num_running: int) -> tuple[float, float, float]: ...

    def prefill_seconds(self, prefill_lens: list[int], cached: list[int] | None = None) -> float: ...


@dataclass(frozen=True)
class ChainedTrace:
    """A trace's requests as chains of trie nodes (equal hash-id prefixes give equal nodes), computed once for
    every KV size simulated."""

    arrivals: list[float]
    input_lens: list[int]
    output_lens: list[int]
    chains: list[list[int]]
    node_count: int
    trace_block: int  # prompt tokens per node
    _memo: dict = field(default_factory=dict, compare=False, repr=False)  # what every KV size shares, per setting

    def prepared(self, block_size: int, timing: StepTiming) -> tuple[list[list[int]], list[float]]:
        """Per request: the KV blocks of each node it can cache, and its prefill seconds with no hit (the same
        at every KV size, so computed once)."""
        key = (block_size, timing)
        if key not in self._memo:
            sub = self.trace_block // block_size
            sizes = []
            for chain, length in zip(self.chains, self.input_lens, strict=True):
                last = (length - (len(chain) - 1) * self.trace_block) // block_size
                sizes.append([sub] * (len(chain) - 1) + [last])
            without = [timing.prefill_seconds([length], [0]) for length in self.input_lens]
            self._memo[key] = (sizes, without)
        return self._memo[key]

    @classmethod
    def of(cls, trace: PrefixTrace) -> ChainedTrace:
        trie: dict[tuple[int, int], int] = {}
        chains = []
        for request in trace.requests:
            parent, chain = -1, []
            for hash_id in request.hash_ids:
                parent = trie.setdefault((parent, hash_id), len(trie))
                chain.append(parent)
            chains.append(chain)
        return cls(
            [r.arrival_s for r in trace.requests],
            [r.input_len for r in trace.requests],
            [r.output_len for r in trace.requests],
            chains,
            len(trie),
            trace.block_size,
        )


@dataclass(frozen=True)
class ReuseOutcome:
    kv_blocks: int
    offload_blocks: int
    requests: int  # served
    refused: int  # larger than the whole pool: its prompt tokens count as misses
    kv_waits: int  # times the head of the queue waited for KV memory
    prompt_tokens: int  # of the requests served
    hit_tokens: int  # served from the GPU cache
    offload_hit_tokens: int  # served from the CPU tier (loaded, not recomputed)
    prefill_s: float  # roofline prefill time of the served requests with their hits
    prefill_s_without_cache: float  # the same with no hit at all
    pinned_blocks_peak: int  # blocks held by running requests
    pinned_blocks_mean: float  # over the run, weighted by time
    evicted_blocks: int
    queue_wait_mean_s: float
    duration_s: float

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def total_hit_rate(self) -> float:
        return (self.hit_tokens + self.offload_hit_tokens) / self.prompt_tokens if self.prompt_tokens else 0.0


class _CpuTier:
    """Copies of computed nodes in host memory, least recently used out (counted in KV blocks)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self.nodes: OrderedDict[int, int] = OrderedDict()  # node -> blocks kept

    def touch(self, node: int, blocks: int) -> None:
        have = self.nodes.pop(node, 0)
        keep = max(have, min(blocks, self.capacity))
        self.used += keep - have
        self.nodes[node] = keep
        while self.used > self.capacity:
            _, dropped = self.nodes.popitem(last=False)
            self.used -= dropped

    def lookup(self, chain: list[int], sizes: list[int], start: int, limit: int) -> int:
        """Blocks from block ``start`` of the chain on that the tier holds, at most ``limit`` in all."""
        served, position = 0, 0
        for node, size in zip(chain, sizes, strict=True):
            if position + size <= start:
                position += size
                continue
            kept = min(self.nodes.get(node, 0), size)
            offset = max(start - position, 0)
            take = min(kept - offset, limit - start - served)
            if take <= 0:
                break
            served += take
            position += size
            if offset + take < size:
                break
        return served


def simulate(
    chained: ChainedTrace,
    block_size: int,
    kv_blocks: int,
    timing: StepTiming,
    max_running: int,
    offload_blocks: int = 0,
) -> ReuseOutcome:
    """Run every request of ``chained`` through a cache of ``kv_blocks`` blocks of ``block_size`` tokens."""
    all_sizes, without_cache = chained.prepared(block_size, timing)
    cache = PrefixCache(kv_blocks, chained.node_count)
    cpu = _CpuTier(offload_blocks) if offload_blocks else None
    waiting: deque[int] = deque()
    events: list[tuple[float, int, int, int]] = []  # (time, order, kind, request): 0 prefill done, 1 finished
    holdings: dict[int, Holding] = {}
    running_tokens: dict[int, int] = {}
    in_flight_tokens = 0
    state = _Totals()
    gpu_free_at = 0.0
    order = 0
    now = 0.0

    def try_admit() -> None:
        nonlocal gpu_free_at, order, in_flight_tokens
        while waiting and len(holdings) < max_running:
            index = waiting[0]
            length, output = chained.input_lens[index], chained.output_lens[index]
            total = -(-(length + output) // block_size)
            if total > kv_blocks:
                waiting.popleft()
                state.refused += 1
                state.prompt_tokens += length  # a miss: the cache served none of it
                continue
            sizes = all_sizes[index]
            limit = (length - 1) // block_size
            holding = cache.admit(chained.chains[index], sizes, limit, total)
            if holding is None:
                state.kv_waits += 1
                return
            waiting.popleft()
            offloaded = 0
            if cpu is not None:
                offloaded = cpu.lookup(chained.chains[index], sizes, holding.hit_blocks, limit)
                for node, size in zip(reversed(holding.nodes), reversed(holding.sizes), strict=True):
                    cpu.touch(node, size)  # the chain's root last: least recently used goes tails first
            cache.register(holding)  # as vLLM does when it allocates them: a later request may reuse them at once
            cached_tokens = holding.hit_blocks * block_size
            reused = cached_tokens + offloaded * block_size
            state.account(length, cached_tokens, offloaded * block_size, now - chained.arrivals[index])
            prefill = timing.prefill_seconds([length], [reused])
            state.prefill_s += prefill
            state.prefill_s_without += without_cache[index]
            start = max(now, gpu_free_at)
            gpu_free_at = start + prefill
            holdings[index] = holding
            running_tokens[index] = length + output
            in_flight_tokens += length + output
            state.pinned_level(now, cache.used)
            heapq.heappush(events, (gpu_free_at, order, 0, index))
            order += 1

    arrivals = chained.arrivals
    next_arrival = 0
    total_requests = len(arrivals)
    while next_arrival < total_requests or events:
        arrival_time = arrivals[next_arrival] if next_arrival < total_requests else float("inf")
        if events and events[0][0] <= arrival_time:
            now, _, kind, index = heapq.heappop(events)
            holding = holdings[index]
            if kind == 0:
                base, per_token, floor = timing.decode_coefficients(len(holdings))
                step = max(floor, base + per_token * in_flight_tokens)
                heapq.heappush(events, (now + chained.output_lens[index] * step, order, 1, index))
                order += 1
            else:
                cache.release(holding)
                state.pinned_level(now, cache.used)
                in_flight_tokens -= running_tokens.pop(index)
                del holdings[index]
        else:
            now = arrival_time
            waiting.append(next_arrival)
            next_arrival += 1
        try_admit()
    state.pinned_level(now, cache.used)
    return ReuseOutcome(
        kv_blocks=kv_blocks,
        offload_blocks=offload_blocks,
        requests=state.served,
        refused=state.refused,
        kv_waits=state.kv_waits,
        prompt_tokens=state.prompt_tokens,
        hit_tokens=state.hit_tokens,
        offload_hit_tokens=state.offload_tokens,
        prefill_s=state.prefill_s,
        prefill_s_without_cache=state.prefill_s_without,
        pinned_blocks_peak=state.pinned_peak,
        pinned_blocks_mean=state.pinned_area / now if now > 0 else float(state.pinned_peak),
        evicted_blocks=cache.evicted_blocks,
        queue_wait_mean_s=state.wait_s / state.served if state.served else 0.0,
        duration_s=now,
    )


class _Totals:
    def __init__(self) -> None:
        self.served = self.refused = self.prompt_tokens = self.hit_tokens = self.offload_tokens = self.kv_waits = 0
        self.prefill_s = self.prefill_s_without = self.wait_s = 0.0
        self.pinned = self.pinned_peak = 0
        self.pinned_area = 0.0
        self._since = 0.0

    def account(self, length: int, hit: int, offloaded: int, wait_s: float) -> None:
        self.served += 1
        self.prompt_tokens += length
        self.hit_tokens += hit
        self.offload_tokens += offloaded
        self.wait_s += wait_s

    def pinned_level(self, now: float, blocks: int) -> None:
        """Blocks held by running requests from ``now`` on (evictable cached blocks count as free)."""
        self.pinned_area += self.pinned * (now - self._since)
        self._since = now
        self.pinned = blocks
        self.pinned_peak = max(self.pinned_peak, blocks)


@dataclass(frozen=True)
class ReuseDistances:
    """For each block a request needs again: seconds since its last use, and the KV blocks of new content the
    traffic wrote in between (more than a cache holds, and least-recently-used order has evicted it)."""

    seconds: list[float]
    new_blocks: list[int]  # blocks of ``block_size`` tokens
    weights: list[int]  # KV blocks each reuse covers (a partial last node covers fewer)


def reuse_distances(chained: ChainedTrace, block_size: int) -> ReuseDistances:
    """Every re-use of a node, in arrival order, with its distance from the node's previous use."""
    sub = chained.trace_block // block_size
    last_seen: dict[int, tuple[float, int]] = {}  # node -> (time, new blocks written up to then)
    written = 0
    seconds: list[float] = []
    new_blocks: list[int] = []
    weights: list[int] = []
    for arrival, chain, length in zip(chained.arrivals, chained.chains, chained.input_lens, strict=True):
        last = len(chain) - 1
        for position, node in enumerate(chain):
            size = sub if position < last else (length - last * chained.trace_block) // block_size
            if size == 0:  # a partial last block is never cached: nothing of it can be reused
                continue
            seen = last_seen.get(node)
            if seen is None:
                written += size
            else:
                seconds.append(arrival - seen[0])
                new_blocks.append(written - seen[1])
                weights.append(size)
            last_seen[node] = (arrival, written)
    return ReuseDistances(seconds, new_blocks, weights)
