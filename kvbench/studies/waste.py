"""The waste study: one workload through each KV strategy on the simulator, with the same pool bytes for all,
next to the seed article's analytic estimate."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kvbench.engine.config import EngineConfig
from kvbench.engine.request import Request
from kvbench.engine.result import RunResult
from kvbench.engine.simulator import simulate
from kvbench.engine.timing import RooflineTiming
from kvbench.errors import KvbenchError
from kvbench.kv.factory import manager_class
from kvbench.kv.manager import KVManager, assert_drained
from kvbench.models.deployment import Parallelism, deployment_budget
from kvbench.models.gpus import resolve_gpu
from kvbench.models.resolve import resolve_model
from kvbench.preflight import check_context_length, check_run_counts
from kvbench.results.point import point_from_result
from kvbench.results.run_meta import run_meta
from kvbench.results.strategy_point import StrategyPoint
from kvbench.results.waste_study import WasteAnalytic, WasteMeta, WasteStudy
from kvbench.units import human_bytes
from kvbench.workload.admissible import Skipped, within_max_len
from kvbench.workload.dataset import DatasetSample, TokenCounter, sample_dataset
from kvbench.workload.lengths import LengthSpec
from kvbench.workload.request_trace import trace_lengths

CONTIGUOUS_STRATEGIES = ("contiguous-max", "contiguous-pow2", "contiguous-oracle")
STRATEGY_NAMES = (*CONTIGUOUS_STRATEGIES, "paged")
MAX_SIMULATED_BLOCKS = 1 << 22  # the pool keeps per-block Python state: past ~4M blocks it costs GBs and minutes


@dataclass(frozen=True)
class Strategy:
    """``contiguous-<policy>`` (slab granularity: one token slot) or ``paged-<block size>``."""

    name: str
    kind: str  # "paged" | "contiguous"
    block_size: int
    policy: str | None = None

    def granularity(self, pool_slots: int) -> int:
        """Block size used to simulate: a slab reserved up front is token-granular unless the pool is huge."""
        if not manager_class(self.kind).reserves_up_front:
            return self.block_size
        return max(1, -(-pool_slots // MAX_SIMULATED_BLOCKS))

    def config(self, pool_slots: int, max_len: int, concurrency: int) -> EngineConfig:
        """The engine configuration that simulates this strategy on a pool of ``pool_slots`` token slots."""
        block_size, num_blocks = self.validate(pool_slots)
        return EngineConfig(
            engine=self.kind,
            block_size=block_size,
            num_blocks=num_blocks,
            reserve=self.policy or "max",
            max_num_seqs=concurrency,
            max_len=max_len,
        )

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
                f"simulator's {MAX_SIMULATED_BLOCKS:,}; use a larger block size, a smaller GPU or a lower "
                "memory utilization (a small model on a big GPU)"
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
    stop: str = "length",
) -> RunResult:
    """Simulate one strategy. With ``stop`` eos a request stops at its output length while its reservation
    plans for max_tokens = max-len - prompt; the oracle alone is told the real lengths: a hindsight bound."""
    config = strategy.config(pool_slots, max_len, concurrency)
    manager = config.build_manager()
    if stop == "eos" and not is_hindsight(strategy, stop):
        requests = [Request(i, p, max_len - p, eos_after=o) for i, (p, o) in enumerate(pairs)]
    else:
        requests = [Request(i, prompt, output) for i, (prompt, output) in enumerate(pairs)]
    result = simulate(requests, manager, timing, concurrency, config, keep_timeline=keep_timeline)
    assert_drained(manager, strategy.name)
    return result


def is_hindsight(strategy: Strategy, stop: str) -> bool:
    """The oracle reserves each real length: with answers ending at EOS only hindsight knows them."""
    return stop == "eos" and strategy.policy == "oracle"


def analytic_waste(mean_len: float, max_len: int) -> float:
    """The seed article's estimate for a max-length reservation: (max_len - actual) / max_len."""
    return (max_len - mean_len) / max_len


@dataclass(frozen=True)
class WasteSettings:
    max_len: int = 2048
    model: str = "llama-2-13b"
    gpu: str = "a100-80g"
    utilization: float = 0.9
    dtype: str = "fp16"
    mean_len: int = 500
    distribution: str = "lognormal"
    prompt_ratio: float = 0.5
    trace: Path | None = None
    requests: int = 2000
    concurrency: int = 256
    strategies: tuple[Strategy, ...] = ()
    seed: int = 0
    dataset: str | None = None  # real prompts (their answers' lengths) instead of a distribution
    stop: str = "length"  # eos: answers end at their real length, reservations plan for max_tokens
    requests_given: bool = True  # False: a dataset gives all its usable records
    tensor_parallel: int = 1  # the pool is one GPU's (every GPU holds its share of every token's KV)
    pipeline_parallel: int = 1
    kv_cache_dtype: str = "auto"
    gpu_memory: int | None = None  # bytes; replaces the GPU preset's memory


@dataclass
class WasteWorkload:
    pairs: list[tuple[int, int]]
    source: str
    skipped: Skipped | None
    dataset: DatasetSample | None = None


def waste_workload(settings: WasteSettings) -> WasteWorkload:
    """The requests: a dataset's prompts and answers, a trace (less those that can never run), else seeded
    lengths from a distribution."""
    check_run_counts(requests=settings.requests)  # the limit sweep and fleet apply: before drawing a single length
    if settings.dataset is not None:
        from kvbench.models.tokenizers import load_tokenizer  # transformers and torch: only for a dataset

        count = settings.requests if settings.requests_given else None
        sample = sample_dataset(
            settings.dataset,
            TokenCounter(load_tokenizer(settings.model), settings.model),
            settings.max_len,
            count,
            settings.seed,
            need_output=True,
        )
        return WasteWorkload(sample.pairs, f"dataset {sample.path.name}", None, sample)
    if settings.trace is not None:
        pairs, _ = trace_lengths(settings.trace)
        kept, skipped = within_max_len(pairs, settings.max_len, f"requests of trace {settings.trace}")
        return WasteWorkload([pairs[index] for index in kept], f"trace {settings.trace}", skipped)
    lengths = LengthSpec(settings.mean_len, settings.max_len, settings.distribution, settings.prompt_ratio)
    return WasteWorkload(
        lengths.sample(settings.requests, settings.seed),
        f"{settings.distribution} lengths, mean {settings.mean_len}, prompt ratio {settings.prompt_ratio}",
        None,
    )


@dataclass(frozen=True)
class WasteBudget:
    """The model, the GPU and the KV pool every strategy simulates, checked."""

    shape: Any
    device: Any
    budget: Any  # models.deployment.DeploymentBudget
    pool_slots: int
    timing: RooflineTiming

    @property
    def kv_bytes(self) -> int:
        return self.budget.binding.kv_bytes


def waste_budget(settings: WasteSettings) -> WasteBudget:
    """The KV budget of the model on the GPU(s), refused (one line) when it cannot be simulated by every strategy:
    cheap arithmetic, so a command checks it before it prints a note. With tensor or pipeline parallelism the
    pool is one GPU's (the stage with the fewest token slots) and step times use one GPU's share of the bytes."""
    shape = resolve_model(settings.model, settings.dtype).with_kv_dtype(settings.kv_cache_dtype)
    check_context_length(shape, settings.max_len)
    device = resolve_gpu(settings.gpu, settings.gpu_memory)
    parallel = Parallelism(settings.tensor_parallel, settings.pipeline_parallel)
    budget = deployment_budget(shape, device, parallel, settings.utilization)
    if not budget.weights_fit:
        stage = budget.binding
        raise KvbenchError(
            f"{shape.name} ({shape.dtype}) does not fit on {device.name} at utilization {settings.utilization}"
            f"{f' with {parallel.gpus} GPUs' if parallel.gpus > 1 else ''}: weights "
            f"{human_bytes(stage.share.weight_bytes)} + activations {human_bytes(stage.share.activation_bytes)} > "
            f"{human_bytes(stage.usable_bytes)}"
        )
    pool_slots = budget.token_slots
    for strategy in settings.strategies:  # fail before simulating anything
        strategy.validate(pool_slots)
    timing = RooflineTiming.for_model(shape, device)
    if parallel.gpus > 1:
        share = budget.binding.share
        timing = replace(
            timing,
            weight_bytes=share.weight_bytes,
            bytes_per_token=share.bytes_per_token,
            active_parameters=timing.active_parameters // parallel.gpus,
            attention_flops_per_pair=timing.attention_flops_per_pair / parallel.gpus,
            expert_bytes=timing.expert_bytes // parallel.gpus,
        )
    return WasteBudget(shape, device, budget, pool_slots, timing)


def run_waste_study(
    settings: WasteSettings, workload: WasteWorkload, progress: Callable[[str], Any] | None = None
) -> WasteStudy:
    """Simulate every strategy on the model's KV budget: the study, whose ``to_json`` is its ``summary.json``."""
    checked = waste_budget(settings)
    shape, device, pool_slots, timing = checked.shape, checked.device, checked.pool_slots, checked.timing
    pairs = workload.pairs
    points = []
    for strategy in settings.strategies:
        if progress is not None:
            progress(f"simulating {strategy.name} ({len(pairs)} requests)")
        result = run_strategy(
            strategy, pairs, pool_slots, settings.max_len, settings.concurrency, timing, stop=settings.stop
        )
        point = point_from_result(result, strategy.name, settings.concurrency, "waste", shape.bytes_per_token)
        points.append(
            StrategyPoint.of(
                point,
                max_concurrency=result.peak_running,
                bytes_per_token=shape.bytes_per_token,
                simulated_seconds=result.accountant.elapsed_s,
                hindsight_bound=is_hindsight(strategy, settings.stop),
            )
        )
    actual_mean = sum(p + o for p, o in pairs) / len(pairs)
    measured = settings.trace is not None or settings.dataset is not None
    mean_len = round(actual_mean) if measured else settings.mean_len  # a trace's or a dataset's own mean
    analytic = WasteAnalytic(
        at_mean_len_pct=100 * analytic_waste(mean_len, settings.max_len),
        at_sampled_mean_pct=100 * analytic_waste(actual_mean, settings.max_len),
        mean_len=mean_len,
        sampled_mean_len=actual_mean,
    )
    meta = run_meta(
        model=shape.to_dict(),
        gpu=_gpus(settings, device.name),
        gpu_memory_utilization=settings.utilization,
        max_len=settings.max_len,
        workload=workload.source,
        requests=len(pairs),
        seed=settings.seed,
        concurrency=settings.concurrency,
        simulated=True,
        kv_budget_bytes=checked.kv_bytes,
        pool_slots=pool_slots,
        scenario="waste",
        skipped_requests=workload.skipped.as_dict() if workload.skipped else None,
        stop=settings.stop,
        dataset=workload.dataset.as_dict() if workload.dataset else None,
        **_deployment_meta(settings, shape),
    )
    return WasteStudy(WasteMeta.from_json(meta), analytic, points)


def _gpus(settings: WasteSettings, name: str) -> str:
    count = settings.tensor_parallel * settings.pipeline_parallel
    return f"{count} x {name}" if count > 1 else name


def _deployment_meta(settings: WasteSettings, shape: Any) -> dict[str, Any]:
    """What a deployment adds to the meta, only when set (a single-GPU run keeps its keys)."""
    meta: dict[str, Any] = {}
    if settings.tensor_parallel > 1 or settings.pipeline_parallel > 1:
        meta.update(tensor_parallel_size=settings.tensor_parallel, pipeline_parallel_size=settings.pipeline_parallel)
    if settings.kv_cache_dtype != "auto":
        meta["kv_cache_dtype"] = settings.kv_cache_dtype
    if shape.sliding_layers:
        meta["sliding_window_note"] = (
            f"{len(shape.sliding_layers)} of {shape.num_layers} layers keep a window of "
            f"{shape.sliding_window} tokens; the simulator's pool counts every layer "
            "growing, so its slots are a lower bound"
        )
    return meta
