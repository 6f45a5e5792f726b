"""A fleet run's settings resolved once: the scenario, requests and their arrival times, the engine config
(the same model, budget and scheduler as ``sweep``) and how instances are made.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request, make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.engine.simulator import SimulatedInstance
from kvbench.errors import KvbenchError
from kvbench.models.shapes import resolve_model
from kvbench.preflight import check_requests_for_host, check_run_counts
from kvbench.report.rundir import run_meta
from kvbench.studies.fleet.actor import InstanceSpec
from kvbench.studies.fleet.core import AutoscaleSettings
from kvbench.studies.fleet.policies import POLICIES
from kvbench.studies.setup import blocks_for_budget
from kvbench.workload.admissible import Skipped, within_max_len
from kvbench.workload.arrivals import poisson_arrivals, recorded_arrivals
from kvbench.workload.dataset import DatasetSample
from kvbench.workload.scenario import Scenario, load_scenario


@dataclass(frozen=True)
class FleetOptions:
    """A fleet as asked for; None means "the scenario's" (or, for the rate, "the file's arrival times")."""

    scenario: str = "article"
    model: str = "tiny"
    device: str = "cpu"
    dtype: str | None = None
    engine: str = "paged"
    kv_memory_bytes: int | None = None
    kv_memory_text: str | None = None
    utilization: float | None = None
    block_size: int | None = None
    reserve: str | None = None
    admission: str | None = None
    requests: int | None = None
    requests_file: Path | None = None
    trace: Path | None = None
    dataset: str | None = None  # a dataset file or shipped name (default: the scenario's, if any)
    rate: float | None = None
    seed: int | None = None
    instances: int = 2
    policies: tuple[str, ...] = tuple(POLICIES)
    simulate: bool = False
    gpu: str = "a100-80g"
    autoscale: AutoscaleSettings | None = None
    startup_s: float = 0.0  # simulated instances: the start-up time of an added one
    tick_s: float | None = None  # samples and autoscaling decisions; None: by the run's length
    prefix_groups: int = 0  # requests share one of this many prompt prefixes (0: none)
    prefix_len: int = 0  # tokens of each shared prefix
    prefix_caching: bool = True  # the paged manager's prefix cache
    ray_address: str | None = None
    ray_cpus: int | None = None
    cpus_per_instance: float = 1.0  # CPUs a CPU actor reserves in Ray (it runs one torch thread whatever this is)
    simulate_on_ray: bool = False  # --simulate: each policy a Ray task


@dataclass
class FleetSetup:
    options: FleetOptions
    spec: Scenario
    seed: int
    config: EngineConfig
    model_name: str
    device_name: str
    budget_source: str
    bytes_per_token: int
    vocab_size: int
    pairs: list[tuple[int, int]]
    prompts: list[list[int]] | None  # exact prompt token ids (a requests file, a prefix workload, the tensor engine)
    times: list[float]  # arrival seconds, non-decreasing from 0
    arrival_source: str
    skipped: Skipped | None = None
    timing: Any = None  # simulated: the roofline of the GPU preset
    dataset: DatasetSample | None = None  # the prompts' dataset, and what it dropped
    extra: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def resolve(cls, options: FleetOptions) -> FleetSetup:
        spec = load_scenario(options.scenario)
        seed = spec.seed if options.seed is None else options.seed
        block_size = options.block_size or spec.block_size
        check_run_counts(requests=options.requests or spec.requests, block_size=block_size)
        if options.autoscale is not None and options.instances > options.autoscale.max_instances:
            raise KvbenchError(f"{options.instances} instances to start with exceed the autoscaler's maximum of "
                               f"{options.autoscale.max_instances}")
        if options.autoscale is not None and options.instances < options.autoscale.min_instances:
            raise KvbenchError(f"{options.instances} instances to start with are fewer than the autoscaler's "
                               f"minimum of {options.autoscale.min_instances}")
        base = EngineConfig(engine=options.engine, block_size=block_size, reserve=options.reserve or spec.reserve,
                            admission=options.admission or spec.admission, max_num_seqs=256,
                            max_len=spec.lengths.max_len,
                            enable_prefix_caching=options.prefix_caching and options.engine == "paged")
        config, model_name, device_name, source, bytes_per_token, vocab, timing = _budget(options, spec, base)
        pairs, prompts, skipped, file_times, dataset = _workload(options, spec, seed, vocab)
        extra: dict[str, Any] = {}
        load = None
        if options.rate is None and file_times is None and options.simulate:  # the rate from the fleet's capacity
            options, pairs, prompts, skipped, dataset, load = _loaded(options, spec, seed, vocab, config, timing,
                                                                      (pairs, prompts, skipped, dataset))
            extra["rate_chosen"] = {"usage": load.usage, "running_per_instance": load.running_per_instance}
        if options.rate is not None:
            times = poisson_arrivals(len(pairs), options.rate, _derived_seed(seed, "arrivals"))
            arrival_source = f"Poisson at {options.rate:.3g} req/s (seed {seed})"
            if load is not None:
                arrival_source += f", {load.sentence(options.instances)}"
        elif file_times is not None:
            times = file_times
            arrival_source = f"arrival times recorded in {options.requests_file or options.trace}"
        else:
            raise KvbenchError("no arrival times: give an arrival rate (a real fleet's step times are not known "
                               "before it runs; a simulated one gets a rate from its capacity), or a trace / "
                               "requests file whose rows carry arrival_time")
        if not options.simulate:
            check_requests_for_host(len(pairs), sum(p for p, _ in pairs), sum(o for _, o in pairs))
        return cls(options, spec, seed, config, model_name, device_name, source, bytes_per_token, vocab, pairs,
                   prompts, times, arrival_source, skipped, timing, dataset, extra)

    # -- requests ---------------------------------------------------------------------------------------
    def arrivals(self) -> list[tuple[float, Request]]:
        """A fresh request list with its arrival times (each run mutates its requests)."""
        requests = []
        for index, (prompt_len, output_len) in enumerate(self.pairs):
            ids = self.prompts[index] if self.prompts is not None else None
            if self.options.simulate:
                requests.append(Request(index, prompt_len, output_len, prompt_token_ids=ids))
            else:
                requests.append(make_request(index, ids, SamplingParams(max_tokens=output_len, ignore_eos=True)))
        return list(zip(self.times, requests, strict=True))

    def make_simulated_instance(self, start_time: float) -> SimulatedInstance:
        return SimulatedInstance(self.config.build_manager(), self.timing, self.config, keep_timeline=False,
                                 start_time=start_time)

    def instance_spec(self) -> InstanceSpec:
        options = self.options
        return InstanceSpec(options.model, options.device, options.dtype, self.seed, self.config)

    def tick_s(self) -> float:
        """Sampling and autoscaling period: given, or about 400 samples over the arrivals (0.05 s .. 5 s)."""
        if self.options.tick_s is not None:
            return self.options.tick_s
        span = self.times[-1] if self.times else 1.0
        return float(min(5.0, max(0.05, span / 400)))

    def meta(self) -> dict[str, Any]:
        options, config = self.options, self.config
        autoscale = options.autoscale
        return run_meta(
            scenario=self.spec.name, scenario_description=self.spec.description, scenario_source=self.spec.source,
            model_name=self.model_name, device=self.device_name, simulated=options.simulate, seed=self.seed,
            requests=len(self.pairs), engines=[options.engine], policies=list(options.policies),
            instances=options.instances, arrivals=self.arrival_source, rate=options.rate,
            block_size=config.block_size, kv_pool_slots=config.pool_slots, kv_blocks_per_instance=config.num_blocks,
            budget_source=self.budget_source, reserve=config.reserve, admission=config.admission,
            max_len=config.max_len, max_prefill_tokens=config.max_prefill_tokens, max_num_seqs=config.max_num_seqs,
            prefix_caching=config.enable_prefix_caching, prefix_groups=options.prefix_groups,
            prefix_len=options.prefix_len, tick_s=self.tick_s(),
            autoscale=None if autoscale is None else {
                "scale_up": autoscale.scale_up, "scale_down": autoscale.scale_down, "window_s": autoscale.window_s,
                "min_instances": autoscale.min_instances, "max_instances": autoscale.max_instances,
                "startup_s": options.startup_s if options.simulate else "measured"},
            skipped_requests=self.skipped.as_dict() if self.skipped else None,
            dataset=self.dataset.as_dict() if self.dataset else None, stop="length",
            ray_address=options.ray_address, rate_chosen=self.extra.get("rate_chosen"),
        )


def _loaded(options: FleetOptions, spec: Scenario, seed: int, vocab: int, config: EngineConfig, timing, workload):
    """Options with the rate that loads the simulated fleet to :data:`load.TARGET_USAGE` of its blocks, and (unless
    ``--requests`` was given, or a file fixes the rows) enough requests for :data:`load.WAVES` fleets-full of them,
    so that the load holds a while rather than being mostly ramp-up and tail."""
    from kvbench.studies.fleet.load import WAVES, rate_for_usage

    pairs, prompts, skipped, dataset = workload
    load = rate_for_usage(pairs, timing, config.block_size, config.num_blocks, options.instances)
    wanted = WAVES * math.ceil(load.running_per_instance * options.instances)
    fixed = options.requests is not None or options.requests_file is not None or options.trace is not None
    if not fixed and wanted > len(pairs):
        check_run_counts(requests=wanted, block_size=config.block_size)
        pairs, prompts, skipped, _, dataset = _workload(replace(options, requests=wanted), spec, seed, vocab)
        load = rate_for_usage(pairs, timing, config.block_size, config.num_blocks, options.instances)
    return replace(options, rate=load.rate), pairs, prompts, skipped, dataset, load


def _derived_seed(seed: int, what: str) -> int:
    """A seed of its own for each random stream, so arrival gaps do not mirror the request lengths."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{what}".encode(), digest_size=4).digest(), "little")


def _budget(options: FleetOptions, spec: Scenario, base: EngineConfig):
    """(config, model name, device name, budget source, bytes per token, vocabulary, timing)."""
    if options.simulate:
        from kvbench.studies.backends import simulated_backend
        from kvbench.studies.sweep_setup import SweepOptions

        sweep_options = SweepOptions(model=options.model, dtype=options.dtype, gpu=options.gpu,
                                     utilization=options.utilization, kv_memory_bytes=options.kv_memory_bytes,
                                     kv_memory_text=options.kv_memory_text, simulate=True)
        backend, model_name, device_name, vocab, source = simulated_backend(sweep_options, base)
        return (backend.base, model_name, device_name, source, backend.bytes_per_token, vocab, backend.timing)
    if options.utilization is not None:
        raise KvbenchError("a KV budget from GPU memory utilization is for simulated fleets; give each instance's "
                           "KV memory size instead")
    shape = resolve_model(options.model)
    if options.kv_memory_bytes is not None:
        num_blocks = blocks_for_budget(options.kv_memory_bytes, shape, base.block_size)
        source = f"KV memory {options.kv_memory_text} per instance"
    else:
        slots, source = spec.budget_slots()
        num_blocks = slots // base.block_size
    check_run_counts(num_blocks=max(num_blocks, 1))
    config = replace(base, num_blocks=num_blocks)
    source = f"{config.pool_slots:,} token slots per instance = {source}"
    return config, shape.name, options.device, source, shape.bytes_per_token, shape.vocab_size, None


def _workload(options: FleetOptions, spec: Scenario, seed: int, vocab: int):
    """(pairs, prompt token ids or None, skipped, arrival times recorded in the file or None, dataset sample).

    The requests come from a requests file, a trace, a dataset (asked for, else the scenario's when no file is
    given) or lengths drawn from the scenario. Every request runs to its reference output length.
    """
    max_len = spec.lengths.max_len
    file_times = None
    prompts = None
    skipped = None
    sample = None
    from_file = options.requests_file is not None or options.trace is not None
    dataset = options.dataset or (spec.dataset_path() if spec.dataset and not from_file else None)
    if dataset is not None and from_file:
        raise KvbenchError("a dataset and a requests file or trace both give the requests: choose one")
    if dataset is not None and options.prefix_groups > 0:
        raise KvbenchError("shared prefixes are drawn for random prompts; a dataset brings its own prompts")
    if options.requests_file is not None:
        from kvbench.workload.requests_file import load_requests_jsonl

        replay = load_requests_jsonl(options.requests_file)
        file_times = recorded_arrivals(options.requests_file)
        kept, skipped = within_max_len([(len(ids), out) for ids, out in replay], max_len,
                                       f"records of {options.requests_file}")
        if any(token >= vocab for ids, _ in replay for token in ids):
            raise KvbenchError(f"{options.requests_file}: a prompt token id is outside the model's vocabulary of {vocab}")
        prompts = [replay[i][0] for i in kept]
        pairs = [(len(replay[i][0]), replay[i][1]) for i in kept]
        file_times = [file_times[i] for i in kept] if file_times is not None else None
    elif options.trace is not None:
        from kvbench.workload.lengths import load_trace

        lengths = load_trace(options.trace)
        file_times = recorded_arrivals(options.trace)
        kept, skipped = within_max_len(lengths, max_len, f"records of {options.trace}")
        pairs = [lengths[i] for i in kept]
        file_times = [file_times[i] for i in kept] if file_times is not None else None
    elif dataset is not None:  # the sweep's dataset loading: tokenized, filtered, a seeded draw
        from kvbench.models.tokenizers import load_tokenizer
        from kvbench.studies.workload import dataset_workload

        workload = dataset_workload(Path(dataset), load_tokenizer(options.model), max_len,
                                    options.requests or spec.requests, seed, "length", options.model)
        pairs, prompts, sample = workload.pairs, workload.prompt_ids, workload.dataset
        if prompts is not None and any(token >= vocab for ids in prompts for token in ids):
            raise KvbenchError(f"{sample.path}: a prompt token id is outside the model's vocabulary of {vocab}")
    else:
        pairs = spec.lengths.sample(options.requests or spec.requests, seed)
    if options.requests is not None and from_file:
        pairs = pairs[: options.requests]  # the first N records of the file
        prompts = prompts[: options.requests] if prompts is not None else None
        file_times = file_times[: options.requests] if file_times is not None else None
    if prompts is None and (options.prefix_groups > 0 or not options.simulate):
        prompts = prefix_prompts(pairs, vocab, seed, options.prefix_groups, options.prefix_len)
    return pairs, prompts, skipped, file_times, sample


def prefix_prompts(pairs: list[tuple[int, int]], vocab: int, seed: int, groups: int, prefix_len: int) -> list[list[int]]:
    """Seeded prompt token ids; with ``groups`` > 0 each prompt starts with one of ``groups`` shared prefixes
    of ``prefix_len`` tokens (a system prompt, a few-shot header), never its whole prompt."""
    rng = np.random.default_rng(_derived_seed(seed, "prompts"))
    prefixes = [rng.integers(0, vocab, prefix_len).tolist() for _ in range(groups)] if groups else []
    choice = rng.integers(0, groups, len(pairs)) if groups else None
    prompts = []
    for index, (prompt_len, _) in enumerate(pairs):
        shared = prefixes[int(choice[index])][: min(prefix_len, prompt_len - 1)] if groups else []
        prompts.append(shared + rng.integers(0, vocab, prompt_len - len(shared)).tolist())
    return prompts
