"""kvbench's own engines on this machine: the tensor engine over a loaded model, one KV pool per engine."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import torch

from kvbench.engine.config import EngineConfig
from kvbench.engine.interleave import run_interleaved
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.load_pattern import Load
from kvbench.engine.request import Request
from kvbench.engine.result import RunResult
from kvbench.errors import KvbenchError
from kvbench.kv.factory import manager_class
from kvbench.kv.policies import MANAGERS
from kvbench.measure.probes import MemorySampler
from kvbench.preflight import available_host_bytes, check_kv_pool_for_device
from kvbench.studies.backends.base import BackendSetup, BackendSpec, BuildContext, Need, Offer, OnStep
from kvbench.studies.kv_budget import Budget, cpu_server_budget, scenario_budget, size_pool
from kvbench.studies.local_model import (
    LoadedModel,
    build_engine,
    cuda_kv_budget,
    load_model,
    packed_weight_bytes,
)
from kvbench.values import ThreadChoice


class TensorBackend:
    """Runs the real engines; one model, one KV pool per engine, kept across points."""

    def __init__(self, loaded: LoadedModel, base: EngineConfig) -> None:
        self._loaded = loaded
        self.base = base
        self.bytes_per_token = loaded.shape.bytes_per_token
        self._engines: dict[str, LLMEngine] = {}

    @property
    def loaded(self) -> LoadedModel:
        return self._loaded

    @property
    def dtype_name(self) -> str:
        return self._loaded.shape.dtype

    @property
    def threads(self) -> ThreadChoice | None:
        return self._loaded.threads

    @property
    def device_label(self) -> str:
        return str(self._loaded.device)

    @property
    def stops_at_eos(self) -> bool:
        return bool(self._loaded.stop_token_ids)

    def can_fork(self, engine: str) -> bool:
        return manager_class(engine).can_fork

    def engine(self, name: str) -> LLMEngine:
        if name not in self._engines:
            self._engines[name] = build_engine(self._loaded, replace(self.base, engine=name))
        return self._engines[name]

    def warm_up(self, engine: str, requests: list[Request]) -> None:
        if requests:
            self.engine(engine).run(requests, len(requests))

    def run(self, engine: str, requests: list[Request], load: Load, on_step: OnStep | None) -> tuple[RunResult, dict]:
        runner = self.engine(engine)
        with MemorySampler(self._loaded.device) as sampler:
            result = runner.run(requests, load, on_step=on_step)
        return result, sampler.peaks.as_dict()

    interleaved_engines = frozenset(MANAGERS)  # kvbench's own engines: run_together steps them in turn

    def run_together(
        self, runs: Sequence[tuple[str, list[Request]]], concurrency: int, on_step: OnStep | None
    ) -> list[tuple[RunResult, dict]]:
        """The engines' points at one concurrency, stepped in turn so that the machine's load falls on each
        alike (see :mod:`kvbench.engine.interleave`); the memory peaks are the process's over the group."""
        with MemorySampler(self._loaded.device) as sampler:
            results = run_interleaved([(self.engine(name), requests) for name, requests in runs], concurrency, on_step)
        return [(result, sampler.peaks.as_dict()) for result in results]

    def observe_allocations(self, engine: str, observer: Callable[[float], None]) -> None:
        self.engine(engine).alloc_observer = observer

    def close(self) -> None:
        """The engines and the model go with this object: nothing outside the process to stop."""


def build_tensor_backend(context: BuildContext) -> BackendSetup:
    """The real engines on this machine; the pool is the scenario's budget unless a size or a GPU share is given.

    With a GPU share, the engines' pools live side by side, so each gets its part of the budget.
    """
    options, base = context.options, context.base
    if context.status is not None:
        context.status(f"loading model {options.model}...")
    known = {"tokenizer": context.tokenizer} if context.tokenizer is not None else {}  # else load_model reads it
    loaded = load_model(
        options.model,
        options.device,
        options.dtype,
        context.seed,
        max_len=base.max_len,
        threads=options.threads,
        block_size=base.block_size,
        **known,
    )
    engines = len(options.engines)

    def default() -> Budget:
        if options.utilization is None and context.server and loaded.device.type == "cpu":
            return cpu_server_budget(available_host_bytes())
        if options.utilization is None:
            return scenario_budget(context.scenario, loaded.shape.bytes_per_token)
        if loaded.device.type != "cuda":
            raise KvbenchError(
                "a KV budget from GPU memory utilization needs a CUDA device; on a CPU give the KV memory size instead"
            )
        return (
            cuda_kv_budget(loaded, options.utilization) // max(engines, 1),
            f"{options.utilization} x GPU memory - used - activations, split over {engines} engine(s)",
        )

    budget = size_pool(base, loaded.shape.bytes_per_token, options.kv_memory, default)
    config = budget.config
    # each engine of this process keeps its pool across points: all of them must fit now, before any note or
    # point (build_engine checks each again as it is built)
    check_kv_pool_for_device(
        loaded.shape,
        loaded.device,
        config.num_blocks,
        config.block_size,
        pools=max(1, len([e for e in options.engines if e in MANAGERS])),
        extra_weights=packed_weight_bytes(loaded),
    )
    return BackendSetup(
        TensorBackend(loaded, config), loaded.shape.name, _device_name(loaded), loaded.shape.vocab_size, budget.source
    )


def _device_name(loaded: LoadedModel) -> str:
    return torch.cuda.get_device_name(loaded.device) if loaded.device.type == "cuda" else str(loaded.device)


SPEC = BackendSpec(
    name="kvbench",
    engines=MANAGERS,
    title="kvbench's engines",
    provides_run=True,
    build=build_tensor_backend,
    needs=frozenset({Need.LOCAL_MODEL, Need.PROMPT_TOKENS}),
    offers=frozenset({Offer.KV_MANAGER, Offer.LIVE_KV, Offer.MEMORY_PEAKS}),
)
