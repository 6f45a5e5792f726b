"""What every run asks for, whatever it measures: the requests, the model and where it runs, the KV pool.

:class:`RunOptions` holds the settings a sweep and a fleet share (``SweepOptions`` and ``FleetOptions``
extend it); None means "the scenario's".
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from kvbench.endpoint.client import RequestLimits, Target
from kvbench.endpoint.scraper import DEFAULT_INTERVAL_S
from kvbench.measure.kv_residency import DEFAULT_THRASH_WINDOW_S
from kvbench.workload.lengths import TokenRange
from kvbench.workload.prefix_trace import PrefixTrace


@dataclass(frozen=True)
class RunOptions:
    """The settings shared by the studies that run engines on a scenario; None means "the scenario's"."""

    # the requests
    scenario: str = "article"
    requests: int | None = None
    requests_file: Path | None = None
    dataset: str | None = None  # a dataset file or shipped name (default: the scenario's, if any)
    seed: int | None = None
    # the model and where it runs
    model: str = "tiny"
    device: str = "auto"
    dtype: str | None = None
    simulate: bool = False
    gpu: str = "a100-80g"  # the GPU preset a simulation runs on
    # the KV pool
    kv_memory_bytes: int | None = None
    kv_memory_text: str | None = None  # as typed, for the budget's description
    utilization: float | None = None
    block_size: int | None = None
    reserve: str | None = None
    admission: str | None = None

    @property
    def kv_memory(self) -> tuple[int, str] | None:
        """The KV memory size asked for: (bytes, as typed), or None for the run's default budget."""
        if self.kv_memory_bytes is None:
            return None
        return self.kv_memory_bytes, self.kv_memory_text or f"{self.kv_memory_bytes} B"


@dataclass(frozen=True)
class SweepOptions(RunOptions):
    """A sweep as asked for; None means "the scenario's"."""

    concurrency: tuple[int, ...] | None = None
    engines: tuple[str, ...] = ("paged", "contiguous")
    stop: str | None = None  # eos | length (default: eos for a real model with a tokenizer)
    repeat: int = 1
    threads: int | None = None  # CPU intra-op threads; None: measured (kvbench.cpu.threads)
    endpoint: EndpointOptions | None = None  # servers over HTTP instead of engines in this process


@dataclass(frozen=True)
class EndpointOptions:
    """A sweep of OpenAI-compatible servers (``--target``): the targets are the run's engines, by name."""

    targets: tuple[Target, ...]
    rates: tuple[float, ...] | None = None  # open-loop levels (requests/s); None: closed loop at the concurrencies
    burstiness: float = 1.0  # the gamma shape of the open loop's gaps (1: Poisson)
    max_concurrency: int | None = None  # the open loop's cap on requests in flight
    slo: dict[str, float] | None = None  # milliseconds by ttft, tpot, e2el
    slo_attainment: float = 0.9  # the share of requests that must meet the SLO for a point to meet it
    request_timeout_s: float = RequestLimits.timeout_s
    point_timeout_s: float | None = None  # stop a point after this long; what was left is recorded as not sent
    scrape_interval_s: float = DEFAULT_INTERVAL_S
    scrape: bool = True
    reset_prefix_cache: bool = False
    thrash_window_s: float = DEFAULT_THRASH_WINDOW_S  # a block stored again this soon after its removal: thrash
    prefix_hit_rate: float | None = None  # reshape the prompts to this prefix-cache hit rate (0..1), prewarmed
    trace: PrefixTrace | None = None  # a hash-id trace replayed instead of the sweep's requests
    trace_timed: bool = False  # at the trace's own times (else in a closed loop at each concurrency)
    find_max: bool = False
    find_max_points: int = 6  # the most points --find-max measures per target
    input_len: TokenRange | None = None  # each prompt's length, fixed or drawn (None: the scenario's lengths)
    output_len: TokenRange | None = None  # each answer's length asked for (max_tokens)
    max_len: int | None = None  # prompt + answer at most (None: the scenario's max-len)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(target.name or target.url for target in self.targets)


@dataclass(frozen=True)
class ServerOptions:
    """A fleet of OpenAI-compatible servers (``fleet --target``): kvbench's load generator routes to them."""

    targets: tuple[Target, ...]
    scrape_interval_s: float = DEFAULT_INTERVAL_S
    limits: RequestLimits = field(default_factory=RequestLimits)


def run_fields(options: RunOptions) -> dict[str, Any]:
    """The shared settings of ``options`` by name, to build a study's own options from (``SweepOptions(**...)``)."""
    return {f.name: getattr(options, f.name) for f in fields(RunOptions)}
