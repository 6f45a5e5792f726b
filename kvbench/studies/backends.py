"""The two ways to run a sweep point: the tensor engine on this machine, or the simulator with a GPU preset."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from kvbench.engine.config import EngineConfig
from kvbench.engine.interleave import run_interleaved
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import Request, make_request
from kvbench.engine.result import RunResult
from kvbench.engine.sampling import SamplingParams
from kvbench.engine.simulator import simulate
from kvbench.engine.timing import RooflineTiming
from kvbench.errors import KvbenchError
from kvbench.kv.manager import assert_drained
from kvbench.kv.policies import MANAGERS
from kvbench.measure.probes import MemorySampler
from kvbench.models.gpus import GpuSpec, kv_budget, resolve_gpu
from kvbench.models.shapes import ModelShape, resolve_model
from kvbench.preflight import check_context_length, check_kv_pool_for_device, check_run_counts
from kvbench.studies.setup import (
    LoadedModel,
    blocks_for_budget,
    build_engine,
    cuda_kv_budget,
    load_model,
    packed_weight_bytes,
)
from kvbench.studies.vllm_backend import own_engines

if TYPE_CHECKING:
    from kvbench.studies.sweep_setup import SweepOptions
    from kvbench.workload.scenario import Scenario


class PointBackend(Protocol):
    """Runs one engine on a fresh copy of the request list; the tensor engine or the simulator."""

    base: EngineConfig
    bytes_per_token: int

    def run(self, engine: str, requests: list[Request], concurrency: int, on_step) -> tuple[RunResult, dict]:
        """Returns the run and its memory peaks (results-schema ``memory`` names)."""
        ...

    def warm_up(self, engine: str, requests: list[Request]) -> None: ...


def token_requests(pairs: Sequence[tuple[int, int]], vocab_size: int, seed: int) -> list[Request]:
    """Greedy, EOS-ignoring requests with seeded random prompt tokens: the same list for every engine."""
    rng = np.random.default_rng(seed)
    requests = []
    for index, (prompt_len, output_len) in enumerate(pairs):
        prompt = rng.integers(0, vocab_size, prompt_len).tolist()
        requests.append(make_request(index, prompt, SamplingParams(max_tokens=output_len, ignore_eos=True)))
    return requests


class TensorBackend:
    """Runs the real engines; one model, one KV pool per engine, kept across points."""

    def __init__(self, loaded: LoadedModel, base: EngineConfig) -> None:
        self.loaded = loaded
        self.base = base
        self.bytes_per_token = loaded.shape.bytes_per_token
        self._engines: dict[str, LLMEngine] = {}

    @property
    def dtype_name(self) -> str:
        return self.loaded.shape.dtype

    @property
    def threads(self) -> dict | None:
        return self.loaded.threads.as_dict() if self.loaded.threads else None

    def engine(self, name: str) -> LLMEngine:
        if name not in self._engines:
            self._engines[name] = build_engine(self.loaded, replace(self.base, engine=name))
        return self._engines[name]

    def warm_up(self, engine: str, requests: list[Request]) -> None:
        if requests:
            self.engine(engine).run(requests, concurrency=len(requests))

    def run(self, engine: str, requests: list[Request], concurrency: int, on_step) -> tuple[RunResult, dict]:
        runner = self.engine(engine)
        with MemorySampler(self.loaded.device) as sampler:
            result = runner.run(requests, concurrency, on_step=on_step)
        return result, sampler.peaks.as_dict()

    interleaved_engines = MANAGERS  # kvbench's own engines: run_together steps them in turn

    def run_together(self, runs: Sequence[tuple[str, list[Request]]], concurrency: int,
                     on_step) -> list[tuple[RunResult, dict]]:
        """The engines' points at one concurrency, stepped in turn so that the machine's load falls on each
        alike (see :mod:`kvbench.engine.interleave`); the memory peaks are the process's over the pair."""
        with MemorySampler(self.loaded.device) as sampler:
            results = run_interleaved([(self.engine(name), requests) for name, requests in runs], concurrency,
                                      on_step)
        return [(result, sampler.peaks.as_dict()) for result in results]


class SimulatedBackend:
    """The tensor-free simulator with roofline step times of a GPU preset."""

    def __init__(self, shape: ModelShape, gpu: GpuSpec, base: EngineConfig) -> None:
        self.shape = shape
        self.gpu = gpu
        self.base = base
        self.timing = RooflineTiming.for_model(shape, gpu)
        self.bytes_per_token = shape.bytes_per_token
        self.dtype_name = shape.dtype

    def warm_up(self, engine: str, requests: list[Request]) -> None:
        """The simulator has no caches to warm."""

    def run(self, engine: str, requests: list[Request], concurrency: int, on_step) -> tuple[RunResult, dict]:
        config = replace(self.base, engine=engine)
        manager = config.build_manager()
        result = simulate(requests, manager, self.timing, concurrency, config)
        assert_drained(manager, f"the simulated {engine} run")
        if on_step is not None:
            on_step(engine, None, len(result.completed))
        return result, {}


BackendInfo = tuple[PointBackend, str, str, int, str]  # backend, model name, device name, vocabulary, budget source


def simulated_backend(options: SweepOptions, base: EngineConfig) -> BackendInfo:
    """The simulator's pool is the GPU preset's KV budget (vLLM's rule) unless a KV memory size is given."""
    from kvbench.studies.sweep_setup import SIMULATED_STAND_IN

    name = SIMULATED_STAND_IN if options.model == "tiny" else options.model
    shape = resolve_model(name, options.dtype or "fp16")
    check_context_length(shape, base.max_len)
    device = resolve_gpu(options.gpu)
    share = 0.9 if options.utilization is None else options.utilization
    if options.kv_memory_bytes is not None:
        kv_bytes, source = options.kv_memory_bytes, f"KV memory {options.kv_memory_text}"
    else:
        kv_bytes = kv_budget(shape, device, share).kv_bytes
        source = f"{shape.name} {shape.dtype} on {device.name} at {share} utilization"
    if kv_bytes <= 0:
        raise KvbenchError(f"{shape.name} does not fit on {device.name} at {share} utilization")
    num_blocks = blocks_for_budget(kv_bytes, shape, base.block_size)
    check_run_counts(num_blocks=max(num_blocks, 1))
    config = replace(base, num_blocks=num_blocks)  # refuses a budget below one block
    source = f"{config.pool_slots:,} token slots = {source}"
    if options.model == "tiny":
        source += f" (the tiny CPU model is simulated as {SIMULATED_STAND_IN})"
    return SimulatedBackend(shape, device, config), shape.name, f"{device.name} (simulated)", shape.vocab_size, source


def tensor_backend(options: SweepOptions, base: EngineConfig, spec: Scenario, seed: int, engines: int,
                   status: Callable[[str], Any] | None = None, **load: Any) -> BackendInfo:
    """The real engines on this machine; the pool is the scenario's budget unless a size or a GPU share is given.

    With a GPU share, the engines' pools live side by side, so each gets its part of the budget. ``load``
    goes to ``load_model`` (a tokenizer already loaded).
    """
    if status is not None:
        status(f"loading model {options.model}...")
    loaded = load_model(options.model, options.device, options.dtype, seed, max_len=base.max_len,
                        threads=options.threads, **load)
    if options.kv_memory_bytes is not None:
        num_blocks = blocks_for_budget(options.kv_memory_bytes, loaded.shape, base.block_size)
        source = f"KV memory {options.kv_memory_text}"
    elif options.utilization is not None:
        if loaded.device.type != "cuda":
            raise KvbenchError("a KV budget from GPU memory utilization needs a CUDA device; on a CPU give the "
                               "KV memory size instead")
        budget = cuda_kv_budget(loaded, options.utilization) // max(engines, 1)
        num_blocks = blocks_for_budget(budget, loaded.shape, base.block_size)
        source = f"{options.utilization} x GPU memory - used - activations, split over {engines} engine(s)"
    else:
        slots, source = spec.budget_slots()
        num_blocks = slots // base.block_size
    check_run_counts(num_blocks=max(num_blocks, 1))
    config = replace(base, num_blocks=num_blocks)  # refuses a budget below one block
    # each engine of this process keeps its pool across points: all of them must fit now, before any note or
    # point (build_engine checks each again as it is built)
    check_kv_pool_for_device(loaded.shape, loaded.device, config.num_blocks, config.block_size,
                             pools=max(1, len(own_engines(options.engines))), extra_weights=packed_weight_bytes(loaded))
    device_name = str(loaded.device)
    if loaded.device.type == "cuda":
        import torch

        device_name = torch.cuda.get_device_name(loaded.device)
    return TensorBackend(loaded, config), loaded.shape.name, device_name, loaded.shape.vocab_size, source
