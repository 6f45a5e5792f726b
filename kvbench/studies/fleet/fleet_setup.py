"""A fleet run's settings resolved once: the scenario, requests and their arrival times, the engine config
(the same model, budget and scheduler as ``sweep``) and how instances are made.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request, make_request
from kvbench.engine.sampling import SamplingParams
from kvbench.engine.simulator import SimulatedInstance
from kvbench.errors import KvbenchError
from kvbench.kv.factory import manager_class
from kvbench.models.resolve import resolve_model
from kvbench.preflight import check_requests_for_host, check_run_counts
from kvbench.results.fleet_meta import FleetAutoscale, FleetServer, RateChosen
from kvbench.results.run_meta import run_meta
from kvbench.results.simulator_check import SimulatorCheck
from kvbench.studies.backends.simulated import simulated_machine
from kvbench.studies.fleet.actor import InstanceSpec
from kvbench.studies.fleet.core import AutoscaleSettings
from kvbench.studies.fleet.limits import check_arrival_span, check_rate, check_settings
from kvbench.studies.fleet.routing import DEFAULT_POLICIES, KvWeights
from kvbench.studies.fleet.target_rate import WAVES, LoadEstimate, rate_for_usage
from kvbench.studies.kv_budget import scenario_budget, size_pool
from kvbench.studies.run_options import RunOptions, ServerOptions
from kvbench.studies.run_requests import RequestChoice, Workload, resolve_requests
from kvbench.workload.admissible import Skipped
from kvbench.workload.arrivals import poisson_arrivals
from kvbench.workload.dataset import DatasetSample
from kvbench.workload.scenario import Scenario, load_scenario


@dataclass(frozen=True)
class FleetOptions(RunOptions):
    """A fleet as asked for; None means "the scenario's" (or, for the rate, "the file's arrival times")."""

    device: str = "cpu"  # each actor's device
    engine: str = "paged"
    trace: Path | None = None
    rate: float | None = None
    instances: int = 2
    policies: tuple[str, ...] = DEFAULT_POLICIES
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
    servers: ServerOptions | None = None  # real servers over HTTP instead of kvbench's own instances
    weights: KvWeights = KvWeights()  # the KV-aware policies'
    slo: dict[str, float] | None = None  # milliseconds by ttft, tpot, e2el: goodput counts the requests meeting all


SERVER_OWN = ("kv_pool_slots", "kv_blocks_per_instance", "reserve", "admission", "max_prefill_tokens", "max_num_seqs")


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
    rate_chosen: RateChosen | None = None  # the rate kvbench chose from the fleet's capacity (no --rate)
    simulator_check: SimulatorCheck | None = None  # servers: the simulator against the real run, once it ran

    @classmethod
    def resolve(cls, options: FleetOptions) -> FleetSetup:
        spec = load_scenario(options.scenario)
        seed = spec.seed if options.seed is None else options.seed
        block_size = options.block_size or spec.block_size
        check_run_counts(requests=options.requests or spec.requests, block_size=block_size)
        if options.autoscale is not None and options.instances > options.autoscale.max_instances:
            raise KvbenchError(
                f"{options.instances} instances to start with exceed the autoscaler's maximum of "
                f"{options.autoscale.max_instances}"
            )
        if options.autoscale is not None and options.instances < options.autoscale.min_instances:
            raise KvbenchError(
                f"{options.instances} instances to start with are fewer than the autoscaler's "
                f"minimum of {options.autoscale.min_instances}"
            )
        base = EngineConfig(
            engine=options.engine,
            block_size=block_size,
            reserve=options.reserve or spec.reserve,
            admission=options.admission or spec.admission,
            max_num_seqs=256,
            max_len=spec.lengths.max_len,
            enable_prefix_caching=options.prefix_caching and manager_class(options.engine).supports_prefix_caching,
        )
        check_settings(options.tick_s, options.startup_s, options.prefix_groups, options.prefix_len, base.max_len)
        budget = _budget(options, spec, base)
        vocab = budget.vocab_size
        workload = _workload(options, spec, seed, vocab)
        rate_chosen = None
        load = None
        if options.rate is None and workload.arrival_times is None and options.simulate:  # rate from capacity
            options, workload, load = _loaded(options, spec, seed, vocab, budget, workload)
            rate_chosen = RateChosen(load.usage, load.running_per_instance)
        pairs, file_times = workload.pairs, workload.arrival_times
        if options.rate is not None:
            check_rate(options.rate, len(pairs), options.simulate)  # before drawing arrivals that never end
            times = poisson_arrivals(len(pairs), options.rate, _derived_seed(seed, "arrivals"))
            arrival_source = f"Poisson at {options.rate:.3g} req/s (seed {seed})"
            if load is not None:
                arrival_source += f", {load.sentence(options.instances)}"
        elif file_times is not None:
            times = file_times
            arrival_source = f"arrival times recorded in {options.requests_file or options.trace}"
        else:
            raise KvbenchError(
                "no arrival times: give an arrival rate (a real fleet's step times are not known "
                "before it runs; a simulated one gets a rate from its capacity), or a trace / "
                "requests file whose rows carry arrival_time"
            )
        check_arrival_span(times, options.simulate, arrival_source)
        if not options.simulate and options.servers is None:
            check_requests_for_host(len(pairs), sum(p for p, _ in pairs), sum(o for _, o in pairs))
        return cls(
            options,
            spec,
            seed,
            budget.config,
            budget.model_name,
            budget.device_name,
            budget.budget_source,
            budget.bytes_per_token,
            vocab,
            pairs,
            workload.prompt_ids,
            times,
            arrival_source,
            workload.skipped,
            budget.timing,
            workload.dataset,
            rate_chosen,
        )

    # -- requests ---------------------------------------------------------------------------------------
    def arrivals(self) -> list[tuple[float, Request]]:
        """A fresh request list with its arrival times (each run mutates its requests)."""
        requests = []
        for index, (prompt_len, output_len) in enumerate(self.pairs):
            ids = self.prompts[index] if self.prompts is not None else None
            if self.options.simulate:
                requests.append(Request(index, prompt_len, output_len, prompt_token_ids=ids))
            else:
                assert ids is not None, "a real engine's requests carry token ids (drawn if none were given)"
                requests.append(make_request(index, ids, SamplingParams(max_tokens=output_len, ignore_eos=True)))
        return list(zip(self.times, requests, strict=True))

    def make_simulated_instance(self, start_time: float) -> SimulatedInstance:
        return SimulatedInstance(
            self.config.build_manager(), self.timing, self.config, keep_timeline=False, start_time=start_time
        )

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
        meta = self._meta()
        if self.options.servers is not None:  # the servers' own settings are theirs: none of kvbench's instances
            for key in SERVER_OWN:
                meta.pop(key, None)
        return meta

    def _meta(self) -> dict[str, Any]:
        options, config = self.options, self.config
        autoscale = options.autoscale
        return run_meta(
            scenario=self.spec.name,
            scenario_description=self.spec.description,
            scenario_source=self.spec.source,
            model_name=self.model_name,
            device=self.device_name,
            simulated=options.simulate,
            seed=self.seed,
            bytes_per_token=self.bytes_per_token,
            requests=len(self.pairs),
            engines=[options.engine],
            policies=list(options.policies),
            instances=options.instances,
            arrivals=self.arrival_source,
            rate=options.rate,
            block_size=config.block_size,
            kv_pool_slots=config.pool_slots,
            kv_blocks_per_instance=config.num_blocks,
            budget_source=self.budget_source,
            reserve=config.reserve,
            admission=config.admission,
            max_len=config.max_len,
            max_prefill_tokens=config.max_prefill_tokens,
            max_num_seqs=config.max_num_seqs,
            prefix_caching=config.enable_prefix_caching,
            prefix_groups=options.prefix_groups,
            prefix_len=options.prefix_len,
            tick_s=self.tick_s(),
            autoscale=None
            if autoscale is None
            else FleetAutoscale(
                autoscale.scale_up,
                autoscale.scale_down,
                autoscale.window_s,
                autoscale.min_instances,
                autoscale.max_instances,
                options.startup_s if options.simulate else "measured",
            ).to_json(),
            skipped_requests=self.skipped.as_dict() if self.skipped else None,
            dataset=self.dataset.as_dict() if self.dataset else None,
            stop="length",
            ray_address=options.ray_address,
            rate_chosen=None if self.rate_chosen is None else self.rate_chosen.to_json(),
            servers=None
            if options.servers is None
            else [FleetServer(t.name, t.url, t.kv_events).to_json() for t in options.servers.targets],
            kv_weights={"prefix": options.weights.prefix, "load": options.weights.load, "ttl_s": options.weights.ttl_s},
            slo_ms=options.slo,
            simulator_check=None if self.simulator_check is None else self.simulator_check.to_json(),
        )


def _loaded(
    options: FleetOptions, spec: Scenario, seed: int, vocab: int, budget: FleetBudget, workload: Workload
) -> tuple[FleetOptions, Workload, LoadEstimate]:
    """Options with the rate that loads the simulated fleet to :data:`load.TARGET_USAGE` of its blocks, and (unless
    ``--requests`` was given, or a file fixes the rows) enough requests for :data:`load.WAVES` fleets-full of them,
    so that the load holds a while rather than being mostly ramp-up and tail."""
    config = budget.config
    load = rate_for_usage(workload.pairs, budget.timing, config.block_size, config.num_blocks, options.instances)
    wanted = WAVES * math.ceil(load.running_per_instance * options.instances)
    fixed = options.requests is not None or options.requests_file is not None or options.trace is not None
    if not fixed and wanted > len(workload.pairs):
        check_run_counts(requests=wanted, block_size=config.block_size)
        workload = _workload(replace(options, requests=wanted), spec, seed, vocab)
        load = rate_for_usage(workload.pairs, budget.timing, config.block_size, config.num_blocks, options.instances)
    return replace(options, rate=load.rate), workload, load


def _derived_seed(seed: int, what: str) -> int:
    """A seed of its own for each random stream, so arrival gaps do not mirror the request lengths."""
    return int.from_bytes(hashlib.blake2b(f"{seed}:{what}".encode(), digest_size=4).digest(), "little")


@dataclass(frozen=True)
class FleetBudget:
    """What every instance is: its engine configuration (the pool sized), the model, the device, the budget."""

    config: EngineConfig
    model_name: str
    device_name: str
    budget_source: str
    bytes_per_token: int
    vocab_size: int
    timing: Any  # simulated: the roofline of the GPU preset; None for real instances


def _budget(options: FleetOptions, spec: Scenario, base: EngineConfig) -> FleetBudget:
    """Each instance's KV pool: the GPU preset's budget when simulated, else the size asked for or the scenario's."""
    if options.simulate:
        machine = simulated_machine(options, base)
        return FleetBudget(
            machine.budget.config,
            machine.shape.name,
            f"{machine.gpu.name} (simulated)",
            machine.budget.source,
            machine.shape.bytes_per_token,
            machine.shape.vocab_size,
            machine.timing,
        )
    if options.servers is not None:  # each server has its own pool; the model only says the vocabulary
        shape = resolve_model(options.model)
        source = "each server's own (read from its metrics)"
        return FleetBudget(base, shape.name, "servers over HTTP", source, shape.bytes_per_token, shape.vocab_size, None)
    if options.utilization is not None:
        raise KvbenchError(
            "a KV budget from GPU memory utilization is for simulated fleets; give each instance's "
            "KV memory size instead"
        )
    shape = resolve_model(options.model)
    budget = size_pool(
        base,
        shape.bytes_per_token,
        options.kv_memory,
        lambda: scenario_budget(spec, shape.bytes_per_token),
        per=" per instance",
    )
    source = f"{budget.config.pool_slots:,} token slots per instance = {budget.source}"
    return FleetBudget(budget.config, shape.name, options.device, source, shape.bytes_per_token, shape.vocab_size, None)


def _workload(options: FleetOptions, spec: Scenario, seed: int, vocab: int) -> Workload:
    """The requests (``run_requests.resolve_requests``: a requests file, a trace, a dataset or lengths drawn from
    the scenario), each run to its reference output length, with the arrival times a file records; ``--requests``
    takes a file's first N records. Prompts without token ids of their own get seeded ones (shared prefixes)."""
    choice = RequestChoice(options.requests_file, options.trace, options.dataset)
    if options.prefix_groups > 0 and choice.file is None and choice.dataset_of(spec) is not None:
        raise KvbenchError("shared prefixes are drawn for random prompts; a dataset brings its own prompts")
    workload, _ = resolve_requests(
        choice, spec, options.model, options.requests or spec.requests, seed, "length", arrivals=True
    )
    if options.requests is not None and choice.file is not None:
        workload = workload.first(options.requests)  # the first N records of the file
    workload.check_vocabulary(vocab)
    if workload.prompt_ids is None and (options.prefix_groups > 0 or not options.simulate):
        workload = replace(
            workload, prompt_ids=prefix_prompts(workload.pairs, vocab, seed, options.prefix_groups, options.prefix_len)
        )
    return workload


def prefix_prompts(
    pairs: list[tuple[int, int]], vocab: int, seed: int, groups: int, prefix_len: int
) -> list[list[int]]:
    """Seeded prompt token ids; with ``groups`` > 0 each prompt starts with one of ``groups`` shared prefixes
    of ``prefix_len`` tokens (a system prompt, a few-shot header), never its whole prompt.

    A prefix is drawn (from a seed of its own) only when a prompt uses it, and only as long as the longest
    prompt can hold: memory follows the requests, not ``groups`` x ``prefix_len``."""
    rng = np.random.default_rng(_derived_seed(seed, "prompts"))
    choice = rng.integers(0, groups, len(pairs)) if groups else None
    longest = min(prefix_len, max((p - 1 for p, _ in pairs), default=0))
    prefixes: dict[int, list[int]] = {}
    prompts = []
    for index, (prompt_len, _) in enumerate(pairs):
        shared: list[int] = []
        if choice is not None:  # groups > 0
            group = int(choice[index])
            if group not in prefixes:
                draw = np.random.default_rng(_derived_seed(seed, f"prefix {group}"))
                prefixes[group] = draw.integers(0, vocab, longest).tolist()
            shared = prefixes[group][: min(prefix_len, prompt_len - 1)]
        prompts.append(shared + rng.integers(0, vocab, prompt_len - len(shared)).tolist())
    return prompts
