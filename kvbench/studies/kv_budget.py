"""The KV pool of a run, sized in one place: the KV memory size asked for, else the run's default budget
(a GPU preset's, a CUDA device's free memory, a server's share of this CPU's memory, or the scenario's), in whole
blocks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from kvbench.engine.config import EngineConfig
from kvbench.errors import KvbenchError
from kvbench.models.gpus import GpuSpec, kv_budget
from kvbench.models.shapes import ModelShape
from kvbench.preflight import check_run_counts
from kvbench.units import human_bytes
from kvbench.workload.scenario import Scenario

Budget = tuple[int, str]  # KV bytes, and where they come from in words


@dataclass(frozen=True)
class PoolBudget:
    """The run's engine configuration with its pool sized, and where the size comes from."""

    config: EngineConfig
    source: str


def size_pool(
    base: EngineConfig, bytes_per_token: int, kv_memory: Budget | None, default: Callable[[], Budget], per: str = ""
) -> PoolBudget:
    """``kv_memory`` (bytes, as typed) when given, else ``default()``, as blocks of ``base.block_size``.

    ``per`` qualifies a given size ("per instance"). Refused: more blocks than a run may hold, and a budget
    below one block.
    """
    if kv_memory is not None:
        kv_bytes, source = kv_memory[0], f"KV memory {kv_memory[1]}{per}"
    else:
        kv_bytes, source = default()
    num_blocks = kv_bytes // (bytes_per_token * base.block_size)
    check_run_counts(num_blocks=max(num_blocks, 1))
    return PoolBudget(replace(base, num_blocks=num_blocks), source)  # refuses a budget below one block


def gpu_preset_budget(shape: ModelShape, gpu: GpuSpec, utilization: float) -> Budget:
    """vLLM's rule on a GPU preset: utilization x its memory, less the weights and the activations."""
    kv_bytes = kv_budget(shape, gpu, utilization).kv_bytes
    if kv_bytes <= 0:
        raise KvbenchError(f"{shape.name} does not fit on {gpu.name} at {utilization} utilization")
    return kv_bytes, f"{shape.name} {shape.dtype} on {gpu.name} at {utilization} utilization"


CPU_KV_SHARE = 0.25  # of the memory available once the weights are loaded
CPU_KV_CAP = 4 << 30  # vLLM's CPU KV space when VLLM_CPU_KVCACHE_SPACE is not set


def cpu_server_budget(available_bytes: int) -> Budget:
    """What a server on a CPU takes for its KV cache when not told: a quarter of the memory available now, at
    most 4 GiB, as vLLM's CPU backend sizes its cache from the machine's memory; the rest stays for the weights'
    copies, activations and the system."""
    kv_bytes = min(CPU_KV_CAP, int(available_bytes * CPU_KV_SHARE))
    available, cap = human_bytes(available_bytes, "GiB"), human_bytes(CPU_KV_CAP, "GiB")
    return kv_bytes, (
        f"{human_bytes(kv_bytes, 'GiB')} of this CPU's memory ({CPU_KV_SHARE:.0%} of the {available} available, "
        f"at most {cap}; a KV memory size given sets it)"
    )


def scenario_budget(spec: Scenario, bytes_per_token: int) -> Budget:
    """The scenario's token slots, in this model's bytes."""
    slots, source = spec.budget_slots()
    return slots * bytes_per_token, source
