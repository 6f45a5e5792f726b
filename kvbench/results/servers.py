"""What a serving engine's metrics say about its KV cache, read into one shape whatever the engine.

kvbench's own exporter (``kvbench_*``), vLLM (``vllm:*``) and SGLang (``sglang:*``) name their metrics
differently and expose different things. Each family has a reader that maps its names onto a
:class:`ServerState`; a quantity an engine does not expose stays None, so the rules can say they could not
judge it instead of guessing.

- kvbench: blocks used / free / capacity, online fragmentation, block-allocation latency histogram, running and
  waiting requests, preemptions, finished requests, generated tokens.
- vLLM (V1 engine, names as in its Production Metrics docs): ``kv_cache_usage_perc`` (share of the usable
  blocks in use: vLLM keeps one null block aside), ``num_requests_running``, ``num_requests_waiting`` (and
  ``num_requests_waiting_by_reason``), ``num_preemptions_total``, ``request_success_total`` (finished, by
  reason), ``prefix_cache_queries_total`` / ``prefix_cache_hits_total`` (tokens), the ``request_prompt_tokens``
  and ``request_generation_tokens`` histograms, ``prompt_tokens_total`` / ``generation_tokens_total``, the
  ``time_to_first_token_seconds`` histogram's sum and count, and ``cache_config_info`` (block size, block
  counts, memory settings) in its labels. Older names (``gpu_cache_usage_perc``, ``gpu_prefix_cache_*``) are
  read too.
- SGLang: ``token_usage`` (share of the token pool in use), ``num_running_reqs``, ``num_queue_reqs``,
  ``cache_hit_rate``, ``num_used_tokens``, ``num_requests_total``, ``prompt_tokens_total`` /
  ``generation_tokens_total``; where present ``max_total_num_tokens``, ``page_size``, the cumulative
  ``num_retracted_requests_total`` (SGLang's preemptions) and the ``time_to_first_token_seconds`` histogram.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from kvbench.engine.step_totals import PHASES, StepTotals
from kvbench.errors import KvbenchError
from kvbench.measure import metric_names as names
from kvbench.results.exposition import Sample, parse_samples
from kvbench.results.validity import set_aside_invalid
from kvbench.values import printable

FAMILIES = ("kvbench", "vllm", "sglang")
FAMILY_NAMES = {"kvbench": "kvbench", "vllm": "vLLM", "sglang": "SGLang"}
PREFIXES = {"kvbench": names.PREFIX, "vllm": "vllm:", "sglang": "sglang:"}


@dataclass
class ServerState:
    """One engine instance (a kvbench engine, a vLLM engine core, an SGLang scheduler) at one scrape."""

    family: str
    labels: dict[str, str]
    total_blocks: float | None = None  # usable KV blocks (pages; SGLang: tokens when it has no page size)
    block_size: int | None = None  # tokens per block
    usage: float | None = None  # share of the usable blocks in use, 0..1
    used_blocks: float | None = None  # kvbench: blocks holding token states
    fragmentation: float | None = None  # kvbench only: 1 - used / allocated
    running: float | None = None
    waiting: float | None = None
    waiting_capacity: float | None = None  # vLLM: waiting for scheduling capacity (not deferred by LoRA, KV transfer)
    preemptions: float | None = None  # cumulative since the engine started
    finished: float | None = None  # cumulative finished requests
    prefix_queries: float | None = None  # cumulative prompt tokens looked up in the prefix cache
    prefix_hits: float | None = None  # cumulative prompt tokens found there
    prefix_hit_rate: float | None = None  # SGLang reports the rate itself
    cached_blocks: float | None = None  # kvbench: blocks the prefix cache can hand out now
    prompt_tokens_mean: float | None = None  # over finished requests
    generation_tokens_mean: float | None = None
    prompt_tokens: float | None = None  # cumulative prompt tokens processed (prefilled)
    generation_tokens: float | None = None  # cumulative tokens generated
    ttft_sum_s: float | None = None  # the server's time-to-first-token histogram: sum of seconds and count,
    ttft_count: float | None = None  # cumulative (a mean over a window is a difference of both)
    alloc_buckets: list[tuple[float, float]] = field(default_factory=list)  # kvbench allocation latency (le, count)
    steps: StepTotals | None = None  # kvbench serve: its engine loop's steps by phase, cumulative
    config: dict[str, str] = field(default_factory=dict)  # settings the engine reports (vLLM cache_config_info)
    invalid: dict[str, str] = field(default_factory=dict)  # field -> why its value was set aside (validity.py)

    @property
    def family_name(self) -> str:
        return FAMILY_NAMES.get(self.family, self.family)

    @property
    def label(self) -> str:
        """The labels as text safe to print (a label value's escape sequences written out, never sent)."""
        return printable(" ".join(f"{k}={v}" for k, v in sorted(self.labels.items())), limit=200)

    @property
    def source(self) -> str:
        """How findings name this instance: the family, then its labels."""
        return f"{self.family_name} {self.label}".strip()

    @property
    def free_share(self) -> float | None:
        return None if self.usage is None else min(1.0, max(0.0, 1.0 - self.usage))

    @property
    def free_blocks(self) -> float | None:
        share = self.free_share
        return None if share is None or self.total_blocks is None else share * self.total_blocks

    @property
    def hit_rate(self) -> float | None:
        """Prefix-cache hits per queried token (cumulative), or the rate the engine reports."""
        if self.prefix_queries:
            return (self.prefix_hits or 0.0) / self.prefix_queries
        return self.prefix_hit_rate

    def context(self) -> dict[str, Any]:
        """The settings remedies may quote ("now 128")."""
        context: dict[str, Any] = {"block_size": self.block_size}
        for key in ("gpu_memory_utilization", "kv_cache_memory_bytes", "enable_prefix_caching"):
            if self.config.get(key) not in (None, "", "None"):
                context[key] = printable(self.config[key], limit=40)
        return context

    def record(self) -> dict[str, Any]:
        """A JSON-ready record (the timeline of ``kvbench watch``)."""
        data = asdict(self)
        data["alloc_buckets"] = [[le if math.isfinite(le) else "+Inf", count] for le, count in self.alloc_buckets]
        return data

    @classmethod
    def from_record(cls, data: dict[str, Any]) -> ServerState:
        if not isinstance(data, dict):
            raise ValueError("not a server state: a state is a JSON object")
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        if values.get("family") not in FAMILIES or not isinstance(values.get("labels"), dict):
            raise ValueError("not a server state: it needs a known family and labels")
        if not isinstance(values.get("invalid", {}), dict):
            raise ValueError("invalid is not a mapping")
        steps = values.get("steps")
        if steps is not None:
            if not isinstance(steps, dict) or set(steps) != {f.name for f in fields(StepTotals)}:
                raise ValueError("steps is not a record of step totals")
            values["steps"] = StepTotals(**steps)
        for name in known - {"family", "labels", "config", "alloc_buckets", "block_size", "invalid", "steps"}:
            value = values.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
                raise ValueError(f"{name} is not a number")
        values["alloc_buckets"] = [
            (math.inf if le == "+Inf" else float(le), float(count)) for le, count in values.get("alloc_buckets") or []
        ]
        return set_aside_invalid(cls(**values))


def read_states(text: str, source: str = "the exposition") -> list[ServerState]:
    """Every engine instance the exposition describes, of any known family; an error when there is none."""
    samples = parse_samples(text, source)
    states = [
        set_aside_invalid(state)
        for family in FAMILIES
        for state in _READERS[family]([s for s in samples if s.name.startswith(PREFIXES[family])])
    ]
    if not states:
        names = ", ".join(f"{PREFIXES[f]}*" for f in FAMILIES)
        raise KvbenchError(
            f"{source} exposes none of the metric families kvbench reads ({names}): is it a "
            "kvbench, vLLM or SGLang metrics endpoint?"
        )
    return states


def _bound(text: str | None) -> float | None:
    """A histogram bucket's upper bound (``le``), or None when the label is not a number."""
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def _group(samples: Iterable[Sample], key_labels: tuple[str, ...]) -> dict[tuple, list[Sample]]:
    groups: dict[tuple, list[Sample]] = {}
    for sample in samples:
        key = tuple((k, sample.labels[k]) for k in key_labels if k in sample.labels)
        groups.setdefault(key, []).append(sample)
    return groups


def _value(samples: list[Sample], name: str, where: Callable[[dict], bool] | None = None) -> float | None:
    """The sum of the samples called ``name`` (over the labels that split it); None when there is none. A NaN
    or an infinity is kept, for :func:`set_aside_invalid` to name."""
    found = [s.value for s in samples if s.name == name and (where is None or where(s.labels))]
    return sum(found) if found else None


def _gauge(samples: list[Sample], name: str, field: str, doubled: dict[str, str]) -> float | None:
    """A gauge's one value; a page that gives it twice for one engine (its samples would add up to a share of
    70% from 30% and 40%) is recorded in ``doubled`` and gives no value."""
    found = [s.value for s in samples if s.name == name]
    if len(found) > 1:
        doubled[field] = f"{name} given {len(found)} times for one engine: no value can be read"
        return None
    return found[0] if found else None


def _mean(samples: list[Sample], histogram: str) -> float | None:
    total, count = _value(samples, f"{histogram}_sum"), _value(samples, f"{histogram}_count")
    return total / count if total is not None and count else None


def _number(text: str | None) -> float | None:
    try:
        value = float(text) if text is not None else None
    except ValueError:
        return None
    return value if value is not None and math.isfinite(value) else None


def _tokens_per_block(value: float | None) -> int | None:
    """A block size as a whole number of tokens; None for what cannot be one (NaN, infinite, fractional, < 1)."""
    if value is None or not math.isfinite(value) or value < 1 or value != int(value):
        return None
    return int(value)


# -- kvbench ------------------------------------------------------------------------------------------------
def _kvbench(samples: list[Sample]) -> list[ServerState]:
    states = []
    for key, group in _group(samples, ("engine", "device", "instance", "exported_instance")).items():
        total = _value(group, names.BLOCKS_CAPACITY)
        if total is None:
            continue
        free = _value(group, names.BLOCKS_FREE)
        buckets = sorted(
            (le, s.value)
            for s in group
            if s.name == f"{names.ALLOC_LATENCY}_bucket" and (le := _bound(s.labels.get("le"))) is not None
        )
        states.append(
            ServerState(
                "kvbench",
                dict(key),
                total_blocks=total,
                block_size=_tokens_per_block(_value(group, names.BLOCK_SIZE)),
                usage=1.0 - free / total if free is not None and total > 0 else None,
                used_blocks=_value(group, names.BLOCKS_USED),
                fragmentation=_value(group, names.FRAGMENTATION),
                running=_value(group, names.RUNNING),
                waiting=_value(group, names.WAITING),
                preemptions=_value(group, names.PREEMPTIONS),
                finished=_value(group, names.FINISHED),
                generation_tokens=_value(group, names.GENERATED_TOKENS),
                prompt_tokens=_value(group, names.PROMPT_TOKENS),
                prefix_queries=_value(group, names.PREFIX_QUERIES),
                prefix_hits=_value(group, names.PREFIX_HITS),
                cached_blocks=_value(group, names.CACHED_BLOCKS),
                alloc_buckets=buckets,
                steps=_step_totals(group),
            )
        )
    return states


def _step_totals(group: list[Sample]) -> StepTotals | None:
    """The engine loop's step counters (``kvbench serve`` exports them), or None unless all six are there."""
    read: dict[str, tuple[float, float, float]] = {}
    for phase in PHASES:
        samples = [s for s in group if s.labels.get("phase") == phase]
        steps, seconds, tokens = (
            _value(samples, name) for name in (names.STEPS, names.STEP_SECONDS, names.STEP_TOKENS)
        )
        if steps is None or seconds is None or tokens is None:
            return None
        read[phase] = (steps, seconds, tokens)
    return StepTotals.from_phases(read)


# -- vLLM ---------------------------------------------------------------------------------------------------
_VLLM_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")  # current name, then the pre-V1 one


def _vllm(samples: list[Sample]) -> list[ServerState]:
    states = []
    for key, group in _group(samples, ("engine",)).items():
        doubled: dict[str, str] = {}
        usage = next((v for name in _VLLM_USAGE if (v := _gauge(group, name, "usage", doubled)) is not None), None)
        running = _gauge(group, "vllm:num_requests_running", "running", doubled)
        if usage is None and running is None and not doubled:
            continue  # e.g. admission_rejections, which carries no engine label
        info = next((s.labels for s in group if s.name == "vllm:cache_config_info"), {})
        config = {k: v for k, v in info.items() if k != "engine"}
        blocks = _number(config.get("num_gpu_blocks"))
        if blocks is None:
            blocks = _number(config.get("num_cpu_blocks"))
        block_size = _number(config.get("block_size"))
        labels = dict(key)
        model = next((s.labels["model_name"] for s in group if "model_name" in s.labels), None)
        if model:
            labels["model_name"] = model
        queries = _value(group, "vllm:prefix_cache_queries_total")
        hits = _value(group, "vllm:prefix_cache_hits_total")
        if queries is None:
            queries, hits = (
                _value(group, "vllm:gpu_prefix_cache_queries_total"),
                _value(group, "vllm:gpu_prefix_cache_hits_total"),
            )
        states.append(
            ServerState(
                "vllm",
                labels,
                total_blocks=blocks - 1 if blocks is not None and blocks > 1 else blocks,  # one null block is set aside
                block_size=int(block_size) if block_size else None,
                usage=usage,
                running=running,
                waiting=_gauge(group, "vllm:num_requests_waiting", "waiting", doubled),
                waiting_capacity=_value(
                    group, "vllm:num_requests_waiting_by_reason", lambda labels: labels.get("reason") == "capacity"
                ),
                preemptions=_value(group, "vllm:num_preemptions_total"),
                finished=_value(group, "vllm:request_success_total"),
                prefix_queries=queries,
                prefix_hits=hits,
                prompt_tokens_mean=_mean(group, "vllm:request_prompt_tokens"),
                generation_tokens_mean=_mean(group, "vllm:request_generation_tokens"),
                prompt_tokens=_value(group, "vllm:prompt_tokens_total"),
                generation_tokens=_value(group, "vllm:generation_tokens_total"),
                ttft_sum_s=_value(group, "vllm:time_to_first_token_seconds_sum"),
                ttft_count=_value(group, "vllm:time_to_first_token_seconds_count"),
                config=config,
            )
        )
        states[-1].invalid.update(doubled)
    return states


# -- SGLang -------------------------------------------------------------------------------------------------
_SGLANG_KEYS = ("model_name", "tp_rank", "pp_rank", "dp_rank", "moe_ep_rank")


def _sglang(samples: list[Sample]) -> list[ServerState]:
    states = []
    for key, group in _group(samples, _SGLANG_KEYS).items():
        usage, running = _value(group, "sglang:token_usage"), _value(group, "sglang:num_running_reqs")
        if usage is None and running is None:
            continue
        page = _value(group, "sglang:page_size")
        tokens = _value(group, "sglang:max_total_num_tokens")
        states.append(
            ServerState(
                "sglang",
                dict(key),
                total_blocks=tokens / page if tokens and page else tokens,
                block_size=int(page) if page and math.isfinite(page) else None,
                usage=usage,
                running=running,
                waiting=_value(group, "sglang:num_queue_reqs"),
                preemptions=_value(
                    group, "sglang:num_retracted_requests_total"
                ),  # the gauge of the same stem is per batch
                finished=_value(group, "sglang:num_requests_total"),
                prefix_hit_rate=_value(group, "sglang:cache_hit_rate"),
                prompt_tokens=_value(group, "sglang:prompt_tokens_total"),
                generation_tokens=_value(group, "sglang:generation_tokens_total"),
                ttft_sum_s=_value(group, "sglang:time_to_first_token_seconds_sum"),
                ttft_count=_value(group, "sglang:time_to_first_token_seconds_count"),
            )
        )
    return states


_READERS: dict[str, Callable[[list[Sample]], list[ServerState]]] = {
    "kvbench": _kvbench,
    "vllm": _vllm,
    "sglang": _sglang,
}
