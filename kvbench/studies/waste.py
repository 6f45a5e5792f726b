"""Run one workload through each KV strategy on the simulator, with the same pool bytes for all."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request
from kvbench.engine.result import RunResult
from kvbench.engine.simulator import simulate
from kvbench.errors import KvbenchError
from kvbench.kv.manager import KVManager, assert_drained

CONTIGUOUS_STRATEGIES = ("contiguous-max", "contiguous-pow2", "contiguous-oracle")
MAX_SIMULATED_BLOCKS = 1 << 22  # the pool keeps per-block Python state: past ~4M blocks it costs GBs and minutes


@dataclass(frozen=True)
class Strategy:
    """``contiguous-<policy>`` (slab granularity: one token slot) or ``paged-<block size>``."""

    name: str
    kind: str  # "paged" | "contiguous"
    block_size: int
    policy: str | None = None

    def granularity(self, pool_slots: int) -> int:
        """Block size used to simulate: a contiguous slab is token-granular unless the pool is huge."""
        if self.kind == "paged":
            return self.block_size
        return max(1, -(-pool_slots // MAX_SIMULATED_BLOCKS))

    def config(self, pool_slots: int, max_len: int, concurrency: int) -> EngineConfig:
        """The engine configuration that simulates this strategy on a pool of ``pool_slots`` token slots."""
        block_size, num_blocks = self.validate(pool_slots)
        return EngineConfig(engine=self.kind, block_size=block_size, num_blocks=num_blocks,
                            reserve=self.policy or "max", max_num_seqs=concurrency, max_len=max_len)

    def build_manager(self, pool_slots: int, max_len: int) -> KVManager:
        return self.config(pool_slots, max_len, 1).build_manager()

    def validate(self, pool_slots: int) -> tuple[int, int]:
        """(block size, block count) to simulate this pool with; a clear error if it cannot be simulated."""
        block_size = self.granularity(pool_slots)
        num_blocks = pool_slots // block_size
        if num_blocks < 1:
            raise KvbenchError(f"{self.name}: the KV budget holds no block of {block_size} tokens")
        if num_blocks > MAX_SIMULATED_BLOCKS:
            raise KvbenchError(
                f"{self.name}: the KV budget holds {pool_slots:,} token slots = {num_blocks:,} blocks, more than the "
                f"simulator's {MAX_SIMULATED_BLOCKS:,}; use a larger --block-size, a smaller --gpu or a lower "
                "--gpu-memory-utilization (a small model on a big GPU)"
            )
        return block_size, num_blocks


def parse_strategies(names: Sequence[str], block_sizes: Sequence[int]) -> list[Strategy]:
    """Expand ``paged`` into one strategy per block size; validate the rest."""
    strategies: list[Strategy] = []
    for name in names:
        if name == "paged":
            strategies += [Strategy(f"paged-{bs}", "paged", bs) for bs in block_sizes]
        elif name in CONTIGUOUS_STRATEGIES:
            strategies.append(Strategy(name, "contiguous", 1, name.split("-", 1)[1]))
        else:
            known = ", ".join((*CONTIGUOUS_STRATEGIES, "paged"))
            raise KvbenchError(f"unknown strategy {name!r}; choose from {known}")
    return strategies


def run_strategy(
    strategy: Strategy,
    pairs: Sequence[tuple[int, int]],
    pool_slots: int,
    max_len: int,
    concurrency: int,
    timing,
    keep_timeline: bool = False,
) -> RunResult:
    config = strategy.config(pool_slots, max_len, concurrency)
    manager = config.build_manager()
    requests = [Request(i, prompt, output) for i, (prompt, output) in enumerate(pairs)]
    result = simulate(requests, manager, timing, concurrency, config, keep_timeline=keep_timeline)
    assert_drained(manager, strategy.name)
    return result
