"""kvbench's own engines simulated: the tensor-free simulator with roofline step times of a GPU preset."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from kvbench.engine.config import EngineConfig
from kvbench.engine.load_pattern import Load
from kvbench.engine.request import Request
from kvbench.engine.result import RunResult
from kvbench.engine.simulator import simulate
from kvbench.engine.timing import RooflineTiming
from kvbench.kv.factory import manager_class
from kvbench.kv.manager import assert_drained
from kvbench.kv.policies import MANAGERS
from kvbench.models.gpus import GpuSpec, resolve_gpu
from kvbench.models.resolve import resolve_model
from kvbench.models.shapes import ModelShape
from kvbench.preflight import check_context_length
from kvbench.studies.backends.base import (
    BackendSetup,
    BackendSpec,
    BuildContext,
    Need,
    Offer,
    OnStep,
    run_one_after_another,
)
from kvbench.studies.kv_budget import PoolBudget, gpu_preset_budget, size_pool
from kvbench.studies.run_options import RunOptions

SIMULATED_STAND_IN = "llama-2-13b"  # the tiny CPU model is simulated as the article's model


class SimulatedBackend:
    """The tensor-free simulator with roofline step times of a GPU preset."""

    loaded = None  # no model runs
    threads = None
    interleaved_engines: frozenset[str] = frozenset()  # a virtual clock: no machine load to share

    def __init__(self, shape: ModelShape, gpu: GpuSpec, base: EngineConfig) -> None:
        self.shape = shape
        self.gpu = gpu
        self.base = base
        self.timing = RooflineTiming.for_model(shape, gpu)
        self.bytes_per_token = shape.bytes_per_token
        self.dtype_name = shape.dtype
        self.device_label = f"{gpu.name} (simulated)"

    @property
    def stops_at_eos(self) -> bool:
        """Each request is told where its answer ends (``eos_after``)."""
        return True

    def can_fork(self, engine: str) -> bool:
        return manager_class(engine).can_fork

    def warm_up(self, engine: str, requests: list[Request]) -> None:
        """The simulator has no caches to warm."""

    def run(self, engine: str, requests: list[Request], load: Load, on_step: OnStep | None) -> tuple[RunResult, dict]:
        config = replace(self.base, engine=engine)
        manager = config.build_manager()
        result = simulate(requests, manager, self.timing, load, config)
        assert_drained(manager, f"the simulated {engine} run")
        if on_step is not None:
            on_step(engine, None, len(result.completed))
        return result, {}

    def run_together(
        self, runs: Sequence[tuple[str, list[Request]]], concurrency: int, on_step: OnStep | None
    ) -> list[tuple[RunResult, dict]]:
        return run_one_after_another(self, runs, concurrency, on_step)

    def observe_allocations(self, engine: str, observer: Callable[[float], None]) -> None:
        """No live allocations to time: the simulator jumps over steps."""

    def close(self) -> None:
        """Nothing held outside this object."""


@dataclass(frozen=True)
class SimulatedMachine:
    """The model and GPU preset a simulation runs, and its KV pool (a sweep's, or each fleet instance's)."""

    shape: ModelShape
    gpu: GpuSpec
    budget: PoolBudget

    @property
    def timing(self) -> RooflineTiming:
        return RooflineTiming.for_model(self.shape, self.gpu)


def simulated_machine(options: RunOptions, base: EngineConfig) -> SimulatedMachine:
    """The simulator's pool is the GPU preset's KV budget (vLLM's rule) unless a KV memory size is given."""
    name = SIMULATED_STAND_IN if options.model == "tiny" else options.model
    shape = resolve_model(name, options.dtype or "fp16")
    check_context_length(shape, base.max_len)
    gpu = resolve_gpu(options.gpu)
    share = 0.9 if options.utilization is None else options.utilization
    budget = size_pool(base, shape.bytes_per_token, options.kv_memory, lambda: gpu_preset_budget(shape, gpu, share))
    source = f"{budget.config.pool_slots:,} token slots = {budget.source}"
    if options.model == "tiny":
        source += f" (the tiny CPU model is simulated as {SIMULATED_STAND_IN})"
    return SimulatedMachine(shape, gpu, PoolBudget(budget.config, source))


def build_simulated_backend(context: BuildContext) -> BackendSetup:
    machine = simulated_machine(context.options, context.base)
    backend = SimulatedBackend(machine.shape, machine.gpu, machine.budget.config)
    return BackendSetup(
        backend, machine.shape.name, f"{machine.gpu.name} (simulated)", machine.shape.vocab_size, machine.budget.source
    )


SPEC = BackendSpec(
    name="simulator",
    engines=MANAGERS,
    title="the simulator",
    simulated=True,
    provides_run=True,
    build=build_simulated_backend,
    needs=frozenset({Need.GPU_PRESET}),
    offers=frozenset({Offer.KV_MANAGER, Offer.DETERMINISTIC}),
)
