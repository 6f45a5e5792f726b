"""One configuration for every engine: the tensor engine, the simulator, and the studies built on them.

It says how KV memory is managed (which manager, blocks, the contiguous reservation and admission) and how
requests are scheduled (batch and prefill limits, the paged watermark). The scheduler reads its settings
from it and :meth:`EngineConfig.build_manager` builds the KV manager, so ``waste``, ``sweep --simulate`` and
the tensor engine cannot drift apart: the same config schedules a seeded workload identically in all three.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvbench.errors import KvbenchError
from kvbench.kv.factory import build_manager
from kvbench.kv.manager import KVManager
from kvbench.kv.policies import ADMISSION_MODES, MANAGERS, RESERVATION_POLICIES, check_choice


@dataclass(frozen=True)
class EngineConfig:
    engine: str = "paged"  # the KV manager: "paged" | "contiguous"
    block_size: int = 16  # tokens per KV block
    num_blocks: int = 256  # blocks in the KV pool
    reserve: str = "max"  # contiguous: what a slab reserves (max | pow2 | oracle)
    admission: str = "queue"  # contiguous, when a reservation does not fit: wait, or reject as OOM
    max_num_seqs: int = 256  # requests running at once
    max_len: int = 2048  # prompt + output limit of one request (the contiguous max reservation)
    max_prefill_tokens: int = 8192  # prompt tokens one prefill step may take (at least one request)
    watermark: float = 0.01  # paged: share of blocks kept free at admission so running requests can grow
    enable_prefix_caching: bool = False  # paged: reuse full blocks of an identical prefix
    kernel_backend: str | None = None  # "torch" | "triton"; None: by device

    def __post_init__(self) -> None:
        check_choice(self.engine, MANAGERS, "engine")
        check_choice(self.reserve, RESERVATION_POLICIES, "reservation policy")
        check_choice(self.admission, ADMISSION_MODES, "admission mode")
        for name in ("block_size", "max_num_seqs", "max_len", "max_prefill_tokens"):
            if getattr(self, name) < 1:
                raise KvbenchError(f"{name.replace('_', ' ')} must be at least 1, got {getattr(self, name)}")
        if self.num_blocks < 1:
            raise KvbenchError("the KV budget holds no block: give the pool more memory or use smaller blocks")
        if not (math.isfinite(self.watermark) and 0 <= self.watermark < 1):
            raise KvbenchError(f"watermark must be in [0, 1), got {self.watermark}")

    @property
    def pool_slots(self) -> int:
        return self.num_blocks * self.block_size

    def build_manager(self) -> KVManager:
        """A fresh KV manager (and pool) of this configuration."""
        return build_manager(
            self.engine, self.num_blocks, self.block_size, self.reserve, self.max_len, self.enable_prefix_caching
        )
