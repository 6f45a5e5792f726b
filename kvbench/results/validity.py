"""What each quantity of a :class:`~kvbench.results.servers.ServerState` can mean, and the values that
cannot be it: a share outside 0-1 (vLLM's ``kv_cache_usage_perc`` is a fraction despite its name, so 37.5 is
not 37.5%), a negative count, NaN, a histogram whose buckets are not cumulative. Such a value is set aside
(the field becomes None, so no rule judges it and nothing reports it as measured) and named in
``state.invalid``, whence the diagnosis and the watch view flag it.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Protocol, TypeVar

from kvbench.values import is_number


class _Quantities(Protocol):
    """What this module reads of a servers.ServerState (not imported by name: servers imports this module)."""

    family: str
    invalid: dict[str, str]
    block_size: int | None
    total_blocks: float | None
    used_blocks: float | None
    prefix_queries: float | None
    prefix_hits: float | None
    cached_blocks: float | None
    alloc_buckets: list[tuple[float, float]]
    steps: Any  # StepTotals | None


ServerState = TypeVar("ServerState", bound=_Quantities)

_SHARE, _COUNT = "share", "count"
KINDS: dict[str, str] = {
    "total_blocks": _COUNT,
    "usage": _SHARE,
    "used_blocks": _COUNT,
    "fragmentation": _SHARE,
    "running": _COUNT,
    "waiting": _COUNT,
    "waiting_capacity": _COUNT,
    "preemptions": _COUNT,
    "finished": _COUNT,
    "prefix_queries": _COUNT,
    "prefix_hits": _COUNT,
    "prefix_hit_rate": _SHARE,
    "cached_blocks": _COUNT,
    "prompt_tokens_mean": _COUNT,
    "generation_tokens_mean": _COUNT,
    "prompt_tokens": _COUNT,
    "generation_tokens": _COUNT,
    "ttft_sum_s": _COUNT,  # seconds summed: never negative, never past what a count could hold
    "ttft_count": _COUNT,
}
_SLACK = 1e-9  # a share computed as 1 - free / total may land a rounding error past 1
MAX_BLOCK_SIZE = 1 << 20  # tokens per block: servers use 1 to a few thousand
MAX_COUNT = 2.0**53  # past this a float no longer holds every whole number: no server counts that far

# the metric each field is read from, to name it in a message (a field missing here is named as it is)
METRICS: dict[str, dict[str, str]] = {
    "kvbench": {
        "total_blocks": "kvbench_kv_cache_blocks_capacity",
        "block_size": "kvbench_kv_cache_block_size",
        "usage": "1 - kvbench_kv_cache_blocks_free / kvbench_kv_cache_blocks_capacity",
        "used_blocks": "kvbench_kv_cache_blocks_used",
        "fragmentation": "kvbench_kv_cache_fragmentation",
        "running": "kvbench_requests_running",
        "waiting": "kvbench_requests_waiting",
        "preemptions": "kvbench_num_preemptions_total",
        "finished": "kvbench_requests_finished_total",
        "prefix_queries": "kvbench_prefix_cache_queries_total",
        "prefix_hits": "kvbench_prefix_cache_hits_total",
        "cached_blocks": "kvbench_prefix_cache_blocks",
        "alloc_buckets": "kvbench_block_alloc_latency_seconds_bucket",
        "steps": "kvbench_engine_step*_total",
    },
    "vllm": {
        "total_blocks": "cache_config_info num_gpu_blocks",
        "block_size": "cache_config_info block_size",
        "usage": "vllm:kv_cache_usage_perc",
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "waiting_capacity": "vllm:num_requests_waiting_by_reason",
        "preemptions": "vllm:num_preemptions_total",
        "finished": "vllm:request_success_total",
        "prefix_queries": "vllm:prefix_cache_queries_total",
        "prefix_hits": "vllm:prefix_cache_hits_total",
        "prompt_tokens_mean": "vllm:request_prompt_tokens",
        "generation_tokens_mean": "vllm:request_generation_tokens",
    },
    "sglang": {
        "total_blocks": "sglang:max_total_num_tokens",
        "block_size": "sglang:page_size",
        "usage": "sglang:token_usage",
        "running": "sglang:num_running_reqs",
        "waiting": "sglang:num_queue_reqs",
        "preemptions": "sglang:num_retracted_requests_total",
        "finished": "sglang:num_requests_total",
        "prefix_hit_rate": "sglang:cache_hit_rate",
    },
}


def metric_name(family: str, field: str) -> str:
    return METRICS.get(family, {}).get(field, field)


def set_aside_invalid(state: ServerState) -> ServerState:
    """``state`` with every value outside its meaning set to None and named in ``state.invalid``."""
    for field, kind in KINDS.items():
        value = getattr(state, field)
        if value is None:
            continue
        why = _out_of_range(value, kind)
        if why:
            _set_aside(state, field, value, why)
    if state.block_size is not None and (
        not is_number(state.block_size, finite=True)
        or not 1 <= state.block_size <= MAX_BLOCK_SIZE
        or state.block_size != int(state.block_size)
    ):
        _set_aside(state, "block_size", state.block_size, "not a whole number of tokens")
    if state.used_blocks is not None and state.total_blocks is not None and state.used_blocks > state.total_blocks:
        _set_aside(state, "used_blocks", state.used_blocks, f"more than the {state.total_blocks:g} blocks of the pool")
    if state.cached_blocks is not None and state.total_blocks is not None and state.cached_blocks > state.total_blocks:
        _set_aside(
            state, "cached_blocks", state.cached_blocks, f"more than the {state.total_blocks:g} blocks of the pool"
        )
    if state.prefix_hits is not None and state.prefix_queries is not None and state.prefix_hits > state.prefix_queries:
        _set_aside(state, "prefix_hits", state.prefix_hits, f"more than the {state.prefix_queries:g} tokens looked up")
    if state.steps is not None:
        why = next(
            (
                f"{name} is {value:g}: {bad}"
                for name, value in asdict(state.steps).items()
                if (bad := _out_of_range(value, _COUNT))
            ),
            None,
        )
        if why:
            state.invalid["steps"] = f"{metric_name(state.family, 'steps')}: {why}"
            state.steps = None
    why = _bad_buckets(state.alloc_buckets)
    if why:
        state.invalid["alloc_buckets"] = f"{metric_name(state.family, 'alloc_buckets')}: {why}"
        state.alloc_buckets = []
    return state


def _out_of_range(value: Any, kind: str) -> str | None:
    if not is_number(value, finite=False):
        return "not a number"
    if math.isnan(value):
        return "not a number (NaN)"
    if math.isinf(value):
        return "infinite"
    if kind == _SHARE and not -_SLACK <= value <= 1 + _SLACK:
        return "outside 0-1 (a share, not a percentage)"
    if kind == _COUNT and value < 0:
        return "negative (a count)"
    if kind == _COUNT and value > MAX_COUNT:
        return "beyond any count a server keeps (2**53)"
    return None


def _set_aside(state: Any, field: str, value: object, why: str) -> None:
    shown = f"{value:g}" if is_number(value, finite=False) else repr(value)
    state.invalid[field] = f"{metric_name(state.family, field)} is {shown}: {why}"
    setattr(state, field, None)


def _bad_buckets(buckets: list[tuple[float, float]]) -> str | None:
    """Why cumulative (le, count) histogram buckets cannot be read, or None when they can."""
    previous = 0.0
    for le, count in buckets:
        if math.isnan(le):
            return "a bucket bound is NaN"
        if not (is_number(count, finite=True) and count >= 0):
            return f"the bucket le={le:g} counts {count:g}"
        if count < previous:
            return f"the bucket le={le:g} counts {count:g}, fewer than the bucket below it ({previous:g})"
        previous = count
    return None
