"""The two ways to run a sweep point: the tensor engine on this machine, or the simulator with a GPU preset."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from kvbench.engine.build import LoadedModel, build_engine
from kvbench.engine.config import EngineConfig
from kvbench.engine.llm_engine import LLMEngine
from kvbench.engine.request import Request, make_request
from kvbench.engine.result import RunResult
from kvbench.engine.sampling import SamplingParams
from kvbench.engine.simulator import simulate
from kvbench.engine.timing import RooflineTiming
from kvbench.kv.manager import assert_drained
from kvbench.measure.probes import MemorySampler
from kvbench.models.gpus import GpuSpec
from kvbench.models.shapes import ModelShape


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

    def engine(self, name: str) -> LLMEngine:
        if name not in self._engines:
            from dataclasses import replace

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


class SimulatedBackend:
    """The tensor-free simulator with roofline step times of a GPU preset."""

    def __init__(self, shape: ModelShape, gpu: GpuSpec, base: EngineConfig) -> None:
        self.shape = shape
        self.gpu = gpu
        self.base = base
        self.timing = RooflineTiming.for_model(shape, gpu)
        self.bytes_per_token = shape.bytes_per_token

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
