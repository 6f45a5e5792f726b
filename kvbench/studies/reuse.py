"""The reuse study: the prefix hit rate a trace gets for each size of KV memory, on a planned deployment.

The deployment's KV budget comes from the same arithmetic as ``kvbench capacity``; the trace runs at its
arrival times through the paged prefix cache of :mod:`kvbench.engine.reuse_sim` at sizes from an eighth of the
deployment's KV memory to 64 times it (and any sizes asked for), with roofline service times for the GPU. The
curve is read against the hit rate of a cache that never evicts: the memory for 50%, 90% and 99% of it, where
the deployment sits, what larger deployments (more GPUs under tensor parallelism) and a CPU tier add, and why,
from how long blocks wait before they are needed again.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvbench.engine.reuse_sim import ChainedTrace, ReuseOutcome, reuse_distances, simulate
from kvbench.engine.timing import RooflineTiming
from kvbench.errors import KvbenchError
from kvbench.models.deployment import Parallelism, check_parallelism, deployment_budget
from kvbench.models.gpus import GpuSpec, resolve_gpu
from kvbench.models.resolve import resolve_model
from kvbench.models.shapes import ModelShape
from kvbench.results.reuse_curve import (
    CurvePoint,
    DeploymentMark,
    LogHistogram,
    NeverEvicting,
    ReuseCurve,
    ReuseDistance,
    ReuseSetup,
    ReuseTrace,
    ShareTarget,
    TierFigures,
)
from kvbench.units import human_bytes
from kvbench.workload.prefix_trace import PrefixTrace

TARGET_SHARES = (50, 90, 99)  # percent of the unbounded hit rate
OVERLOADED_PINNED_PCT = 99.0  # running requests held this much of the pool at its peak: no room for a cache
DEFAULT_POINTS = 20
SMALLEST_SHARE, LARGEST_MULTIPLE = 1 / 8, 64  # the default range, relative to the deployment's KV memory
MAX_POINTS = 200
MAX_DEPLOYMENT_MULTIPLE = 8  # larger deployments marked: up to 8x the GPUs


@dataclass(frozen=True)
class ReuseSettings:
    model: str = "llama-3.1-8b"
    gpu: str = "h100-80g"
    gpu_memory: int | None = None
    utilization: float = 0.9
    kv_cache_memory: int | None = None  # KV bytes per GPU set directly
    dtype: str = "auto"
    kv_cache_dtype: str = "auto"
    tensor_parallel: int = 1
    pipeline_parallel: int = 1
    block_size: int = 16
    max_num_seqs: int = 256
    kv_sizes: tuple[int, ...] = ()  # bytes of KV memory to simulate besides the default range
    points: int = DEFAULT_POINTS  # sizes of the default range (0: only the asked sizes and the deployments)
    offload_bytes: int = 0  # a CPU tier of this many bytes (0: none)
    max_model_len: int | None = None  # the context a request must fit (None: the model's)


@dataclass(frozen=True)
class Deployment:
    tensor: int
    pipeline: int
    kv_blocks: int

    @property
    def gpus(self) -> int:
        return self.tensor * self.pipeline


@dataclass(frozen=True)
class Planned:
    shape: ModelShape
    gpu: GpuSpec
    block_bytes: int  # one KV block of the whole model (every layer, every KV head, once)
    deployments: list[Deployment]  # the one asked for first, then larger ones

    @property
    def asked(self) -> Deployment:
        return self.deployments[0]


def plan(settings: ReuseSettings) -> Planned:
    """The model, the GPU and the KV blocks of the asked deployment and of larger ones (tensor parallelism
    doubled while the model's heads allow); one line when the model does not fit."""
    shape = resolve_model(settings.model, settings.dtype).with_kv_dtype(settings.kv_cache_dtype)
    gpu = resolve_gpu(settings.gpu, settings.gpu_memory)
    asked = _deployment(shape, gpu, settings, settings.tensor_parallel)
    if asked is None:
        raise KvbenchError(
            f"{shape.name} does not fit {settings.tensor_parallel * settings.pipeline_parallel} x {gpu.name} with "
            "room for its KV cache: see kvbench capacity for the numbers"
        )
    deployments = [asked]
    tensor = settings.tensor_parallel * 2
    while tensor <= settings.tensor_parallel * MAX_DEPLOYMENT_MULTIPLE:
        try:
            check_parallelism(shape, Parallelism(tensor, settings.pipeline_parallel))
        except KvbenchError:
            break
        larger = _deployment(shape, gpu, settings, tensor)
        if larger is not None and larger.kv_blocks > deployments[-1].kv_blocks:  # replicated KV heads add none
            deployments.append(larger)
        tensor *= 2
    return Planned(shape, gpu, settings.block_size * shape.bytes_per_token, deployments)


def _deployment(shape: ModelShape, gpu: GpuSpec, settings: ReuseSettings, tensor: int) -> Deployment | None:
    parallel = Parallelism(tensor, settings.pipeline_parallel)
    check_parallelism(shape, parallel)
    budget = deployment_budget(shape, gpu, parallel, settings.utilization, settings.kv_cache_memory)
    if not budget.weights_fit:
        return None
    size = settings.block_size
    blocks = min(max(s.kv_bytes, 0) // (size * s.share.bytes_per_token) for s in budget.stages)
    return Deployment(tensor, settings.pipeline_parallel, blocks) if blocks > 0 else None


def curve_sizes(planned: Planned, settings: ReuseSettings) -> list[int]:
    """KV sizes in blocks: ``points`` sizes spread geometrically over the default range, each deployment taking
    the place of the nearest one, and the sizes asked for."""
    base = planned.asked.kv_blocks
    grid: list[float] = []
    if settings.points:
        low, high = max(1.0, base * SMALLEST_SHARE), base * LARGEST_MULTIPLE
        grid = [float(v) for v in np.geomspace(low, high, settings.points)]
    sizes: set[int] = set()
    for deployment in planned.deployments:
        if grid:
            nearest = min(grid, key=lambda v: abs(math.log(v / deployment.kv_blocks)))
            grid.remove(nearest)
        sizes.add(deployment.kv_blocks)
    sizes.update(int(round(v)) for v in grid)
    sizes.update(max(1, nbytes // planned.block_bytes) for nbytes in settings.kv_sizes)
    return sorted(sizes)


def trace_timing(planned: Planned) -> RooflineTiming:
    """Step times of the asked deployment: its GPUs' bandwidth and FLOP/s together."""
    gpus = planned.asked.gpus
    gpu = planned.gpu
    joint = GpuSpec(gpu.name, gpu.memory_bytes * gpus, gpu.bandwidth_bytes_per_s * gpus, gpu.peak_flops * gpus)
    return RooflineTiming.for_model(planned.shape, joint)


def run_sizes(
    chained: ChainedTrace,
    block_size: int,
    sizes: Sequence[int],
    timing: RooflineTiming,
    max_running: int,
    offload_blocks: int,
    progress: Callable[[str], None],
) -> dict[int, ReuseOutcome]:
    """An outcome per size, smallest first. Once a size evicts nothing and refuses nothing, every larger one
    runs the same requests the same way, so its outcome is that one's (with its own size)."""
    outcomes: dict[int, ReuseOutcome] = {}
    settled: ReuseOutcome | None = None
    for done, blocks in enumerate(sorted(sizes), 1):
        progress(f"simulating KV size {done} of {len(sizes)} ({blocks:,} blocks)")
        if settled is not None:
            outcomes[blocks] = replace(settled, kv_blocks=blocks)
            continue
        outcome = simulate(chained, block_size, blocks, timing, max_running, offload_blocks)
        outcomes[blocks] = outcome
        if (
            outcome.evicted_blocks == 0
            and outcome.refused == 0
            and outcome.kv_waits == 0
            and outcome.pinned_blocks_peak < blocks
        ):
            settled = outcome
    return outcomes


def unbounded_blocks(chained: ChainedTrace, block_size: int) -> int:
    """Blocks that hold every request's prompt and output at once: a cache of this size never evicts."""
    return sum(-(-(n + o) // block_size) for n, o in zip(chained.input_lens, chained.output_lens, strict=True))


def size_for_share(points: Sequence[CurvePoint], target_pct: float) -> int | None:
    """KV bytes where the curve first reaches ``target_pct`` (interpolated in log size between simulated sizes);
    None beyond the largest size simulated."""
    previous: CurvePoint | None = None
    for point in points:
        if point.refused:  # a size that cannot hold every request is no answer
            continue
        if point.hit_rate_pct >= target_pct:
            if previous is None or point.hit_rate_pct == previous.hit_rate_pct:
                return int(point.kv_bytes)
            low, high = math.log(previous.kv_bytes), math.log(point.kv_bytes)
            share = (target_pct - previous.hit_rate_pct) / (point.hit_rate_pct - previous.hit_rate_pct)
            return int(math.exp(low + share * (high - low)))
        previous = point
    return None


def curve_point(outcome: ReuseOutcome, planned: Planned, unbounded_pct: float, label: str) -> CurvePoint:
    saved_s = outcome.prefill_s_without_cache - outcome.prefill_s
    hit_pct = 100.0 * outcome.hit_rate
    tier = None
    if outcome.offload_blocks:
        tier = TierFigures(
            outcome.offload_blocks * planned.block_bytes,
            100.0 * outcome.offload_hit_tokens / max(outcome.prompt_tokens, 1),
            100.0 * outcome.total_hit_rate,
        )
    return CurvePoint(
        engine=f"kv-{outcome.kv_blocks}-blocks",
        label=label,
        kv_blocks=outcome.kv_blocks,
        kv_bytes=outcome.kv_blocks * planned.block_bytes,
        hit_rate_pct=hit_pct,
        share_of_unbounded_pct=100.0 * hit_pct / unbounded_pct if unbounded_pct else None,
        hit_tokens=outcome.hit_tokens,
        prompt_tokens=outcome.prompt_tokens,
        prefill_tokens_saved=outcome.hit_tokens + outcome.offload_hit_tokens,
        prefill_s_saved=saved_s,
        prefill_time_saved_pct=100.0 * saved_s / outcome.prefill_s_without_cache
        if outcome.prefill_s_without_cache
        else 0.0,
        pinned_blocks_peak=outcome.pinned_blocks_peak,
        pinned_blocks_mean=outcome.pinned_blocks_mean,
        pinned_peak_pct=100.0 * outcome.pinned_blocks_peak / outcome.kv_blocks,
        evicted_blocks=outcome.evicted_blocks,
        requests=outcome.requests,
        refused=outcome.refused,
        queue_wait_mean_s=outcome.queue_wait_mean_s,
        concurrency=0,  # the trace's own arrivals: an open-loop point
        tier=tier,
    )


def distance_summary(chained: ChainedTrace, block_size: int, block_bytes: int) -> ReuseDistance:
    """Quantiles of the reuse distance, weighted by the blocks each reuse covers."""
    found = reuse_distances(chained, block_size)
    if not found.seconds:
        return ReuseDistance(reuses=0)
    weights = np.asarray(found.weights, dtype=float)
    quantiles = (0.5, 0.9, 0.99)

    def weighted(values: list[float] | list[int]) -> list[float]:
        data = np.asarray(values, dtype=float)
        order = np.argsort(data)
        cumulative = np.cumsum(weights[order]) / weights.sum()
        ranked = data[order]
        return [float(ranked[min(int(np.searchsorted(cumulative, q)), len(data) - 1)]) for q in quantiles]

    seconds = weighted(found.seconds)
    written = [b * block_bytes for b in weighted(found.new_blocks)]
    return ReuseDistance(
        reuses=len(found.seconds),
        reused_blocks=int(weights.sum()),
        seconds_p50=seconds[0],
        seconds_p90=seconds[1],
        seconds_p99=seconds[2],
        new_kv_bytes_p50=written[0],
        new_kv_bytes_p90=written[1],
        new_kv_bytes_p99=written[2],
        seconds_histogram=_log_histogram(np.asarray(found.seconds, dtype=float), weights, 0.1),
        new_kv_bytes_histogram=_log_histogram(
            np.asarray(found.new_blocks, dtype=float) * block_bytes, weights, float(block_bytes)
        ),
    )


def _log_histogram(values: np.ndarray, weights: np.ndarray, floor: float, bins: int = 40) -> LogHistogram:
    """Weighted counts over log-spaced bins from ``floor`` (or the least value above 0, if smaller); values at
    or below the first edge, zero included, fall in the first bin."""
    positive = values[values > 0]
    low = min(float(positive.min()), floor) if positive.size else floor
    high = max(float(values.max()), low * 1.0001)
    edges = np.geomspace(low, high, bins + 1)
    counts, _ = np.histogram(np.clip(values, low, high), bins=edges, weights=weights)
    return LogHistogram([float(e) for e in edges], [float(c) for c in counts])


def run_reuse_study(
    trace: PrefixTrace, settings: ReuseSettings, progress: Callable[[str], None] = lambda _: None
) -> ReuseCurve:
    """The curve, the deployments on it and the findings (no metadata: the command adds the run's)."""
    if trace.block_size % settings.block_size:
        raise KvbenchError(
            f"the trace's blocks of {trace.block_size} tokens are not a whole number of KV blocks of "
            f"{settings.block_size}: choose a KV block size that divides {trace.block_size}"
        )
    if settings.points > MAX_POINTS or settings.points < 0:
        raise KvbenchError(f"the curve takes 0 to {MAX_POINTS} sizes, not {settings.points}")
    planned = plan(settings)
    context = settings.max_model_len or planned.shape.max_position_embeddings
    given = trace
    trace = replace(trace, requests=tuple(r for r in trace.requests if r.input_len + r.output_len <= context))
    if not trace.requests:
        raise KvbenchError(
            f"every request of {given.source} is longer (prompt and output) than the context of {context:,} tokens "
            f"of {planned.shape.name}: choose a model with a longer context"
        )
    chained = ChainedTrace.of(trace)
    timing = trace_timing(planned)
    block = settings.block_size
    offload_blocks = settings.offload_bytes // planned.block_bytes
    if settings.offload_bytes and offload_blocks < 1:
        raise KvbenchError(f"a CPU tier of {human_bytes(settings.offload_bytes)} holds no KV block")
    everything = unbounded_blocks(chained, block)
    progress("simulating a cache that never evicts")
    unbounded = simulate(chained, block, everything, timing, settings.max_num_seqs)
    unbounded_pct = 100.0 * unbounded.hit_rate
    sizes = curve_sizes(planned, settings)
    outcomes = run_sizes(chained, block, sizes, timing, settings.max_num_seqs, 0, progress)
    deployment_blocks = {d.kv_blocks: d for d in planned.deployments}
    points = []
    for blocks in sizes:
        deployment = deployment_blocks.get(blocks)
        label = f"{deployment.gpus} x {planned.gpu.name}" if deployment is not None else ""
        points.append(curve_point(outcomes[blocks], planned, unbounded_pct, label))
    if offload_blocks:
        with_tier = run_sizes(chained, block, sizes, timing, settings.max_num_seqs, offload_blocks, progress)
        points = [
            replace(point, tier=curve_point(with_tier[blocks], planned, unbounded_pct, point.label).tier)
            for point, blocks in zip(points, sizes, strict=True)
        ]
    progress("measuring reuse distances")
    distances = distance_summary(chained, block, planned.block_bytes)
    targets = [
        ShareTarget(
            share_pct=share,
            hit_rate_pct=unbounded_pct * share / 100.0,
            kv_bytes=size_for_share(points, unbounded_pct * share / 100.0),
        )
        for share in TARGET_SHARES
    ]
    by_blocks = {p.kv_blocks: p for p in points}
    deployments = [
        DeploymentMark(
            gpus=d.gpus,
            tensor_parallel_size=d.tensor,
            pipeline_parallel_size=d.pipeline,
            kv_blocks=d.kv_blocks,
            kv_bytes=d.kv_blocks * planned.block_bytes,
            hit_rate_pct=by_blocks[d.kv_blocks].hit_rate_pct,
            total_hit_rate_pct=by_blocks[d.kv_blocks].total_hit_rate_pct,
        )
        for d in planned.deployments
    ]
    curve = ReuseCurve(
        trace=ReuseTrace(
            source=trace.source,
            requests=len(trace.requests),
            duration_s=trace.duration_s,
            trace_block_size=trace.block_size,
            prompt_tokens=sum(r.input_len for r in trace.requests),
            output_tokens=sum(r.output_len for r in trace.requests),
            context_tokens=context,
            over_context=len(given.requests) - len(trace.requests),
            over_context_prompt_tokens=sum(r.input_len for r in given.requests)
            - sum(r.input_len for r in trace.requests),
        ),
        deployment=ReuseSetup(
            model_name=planned.shape.name,
            gpu=planned.gpu.name,
            block_size=block,
            kv_block_bytes=planned.block_bytes,
            kv_bytes_per_token=planned.shape.bytes_per_token,
            max_num_seqs=settings.max_num_seqs,
            offload_bytes=offload_blocks * planned.block_bytes,
        ),
        unbounded=NeverEvicting(
            hit_rate_pct=unbounded_pct,
            kv_blocks_peak=unbounded.pinned_blocks_peak,
            prefill_s_saved=unbounded.prefill_s_without_cache - unbounded.prefill_s,
        ),
        deployments=deployments,
        targets=targets,
        reuse_distance=distances,
        points=points,
    )
    return replace(curve, findings=findings(curve))


def findings(curve: ReuseCurve) -> list[str]:
    """The curve in words: where the deployment sits, what more memory buys, and why."""
    unbounded = curve.unbounded.hit_rate_pct
    asked = curve.asked
    lines = []
    if unbounded <= 0:
        return ["No prompt block of this trace repeats an earlier one: no KV size gives a prefix hit."]
    share = 100.0 * asked.hit_rate_pct / unbounded
    trace = curve.trace
    if trace.over_context:
        lines.append(
            f"{trace.over_context:,} requests are longer (prompt and output) than the model's context of "
            f"{trace.context_tokens:,} tokens and were left out, as a server refuses them; every rate here counts "
            f"the {trace.requests:,} others."
        )
    lines.append(
        f"This deployment ({_gpus(asked.gpus)}, {human_bytes(asked.kv_bytes)} of KV memory) serves "
        f"{asked.hit_rate_pct:.1f}% of prompt tokens from its prefix cache: {share:.0f}% of the "
        f"{unbounded:.1f}% a cache that never evicts would serve."
    )
    point = curve.point_at(asked.kv_blocks)
    if point.pinned_peak_pct >= OVERLOADED_PINNED_PCT and point.queue_wait_mean_s > 0:
        lines.append(
            f"At the trace's arrival rate it is overloaded: requests waited {point.queue_wait_mean_s:,.1f} s "
            f"on average for KV memory, and running requests pinned {point.pinned_peak_pct:.0f}% of it at "
            "the peak, leaving no room to keep prefixes; its hit rate is bounded by load before memory (slow "
            "the arrivals down, or add replicas, to see the cache alone)."
        )
    for larger in curve.deployments[1:]:
        gain = larger.hit_rate_pct - asked.hit_rate_pct
        lines.append(
            f"With {_gpus(larger.gpus)} (tensor parallel {larger.tensor_parallel_size}) the KV memory is "
            f"{human_bytes(larger.kv_bytes)} and the hit rate {larger.hit_rate_pct:.1f}% "
            f"({gain:+.1f} points)."
        )
    if asked.total_hit_rate_pct is not None:
        gain = asked.total_hit_rate_pct - asked.hit_rate_pct
        tier = curve.deployment.offload_bytes
        lines.append(
            f"A CPU tier of {human_bytes(tier)} adds {gain:.1f} points here ({asked.total_hit_rate_pct:.1f}% "
            "served without recompute): prefixes the GPU evicted come back from host memory."
        )
    for target in curve.targets:
        where = human_bytes(target.kv_bytes) if target.kv_bytes is not None else "more than the largest size simulated"
        lines.append(f"{target.share_pct}% of the reachable reuse ({target.hit_rate_pct:.1f}%) needs {where}.")
    distance = curve.reuse_distance
    if distance.reuses:
        lines.append(
            f"Why: half of the reused blocks come back within {distance.seconds_p50:.0f} s of their last use, "
            f"after {human_bytes(distance.new_kv_bytes_p50)} of new KV was written; 90% within "
            f"{distance.seconds_p90:.0f} s and {human_bytes(distance.new_kv_bytes_p90)}. A cache smaller "
            "than the KV written in between has evicted the block by then (least recently used goes first)."
        )
    return lines


def _gpus(count: int) -> str:
    return f"{count} GPU" if count == 1 else f"{count} GPUs"
