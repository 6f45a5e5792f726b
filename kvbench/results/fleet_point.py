"""One routing policy's fleet run as ``summary.json`` holds it (:class:`FleetPoint`), with a record per instance
(:class:`FleetInstance`); ``to_json`` writes the file key for key, in its order."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from kvbench.results.schema import LATENCY_FIELDS
from kvbench.values import number


@dataclass(frozen=True)
class FleetInstance:
    """One instance under one policy: what it was sent, how full its KV pool ran, when it lived."""

    index: int = 0
    name: str | None = None  # a server's label (a fleet of servers over HTTP)
    state: str = ""  # serving, draining, stopped, dead, ...
    routed: int = 0  # requests the router sent it
    finished: int = 0
    preemptions: int = 0
    total_blocks: int | None = None  # its KV pool (None: it never reported)
    usage_mean: float | None = None  # share of its blocks in use, over the run (None: no sample)
    usage_peak: float | None = None
    free_share_mean: float | None = None
    free_blocks_min: int | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens served from its prefix cache
    prefix_hit_rate: float | None = None  # None: no prompt token counted
    started_at_s: float | None = None
    ready_at_s: float | None = None
    stopped_at_s: float | None = None
    startup_s: float | None = None  # measured (Ray) or the simulation's setting
    failure: str | None = None  # why it died, if it did
    routed_after_drain: int = 0

    @property
    def label(self) -> str:
        """Its number, and a server's name where it has one."""
        return f"{self.index} {self.name}" if self.name else str(self.index)

    def to_json(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "name": self.name,
            "state": self.state,
            "routed": self.routed,
            "finished": self.finished,
            "preemptions": self.preemptions,
            "total_blocks": self.total_blocks,
            "usage_mean": self.usage_mean,
            "usage_peak": self.usage_peak,
            "free_share_mean": self.free_share_mean,
            "free_blocks_min": self.free_blocks_min,
            "prompt_tokens": self.prompt_tokens,
            "cached_tokens": self.cached_tokens,
            "prefix_hit_rate": self.prefix_hit_rate,
            "started_at_s": self.started_at_s,
            "ready_at_s": self.ready_at_s,
            "stopped_at_s": self.stopped_at_s,
            "startup_s": self.startup_s,
            "failure": self.failure,
            "routed_after_drain": self.routed_after_drain,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FleetInstance:
        """An instance record; a field an older or hand-made record lacks keeps its empty value (``routed`` and
        the counts 0, the figures None); a pool size or share the diagnosis judges that is not a number (text, a
        bool, NaN) reads None, as if missing."""
        return cls(
            index=data.get("index", 0),
            name=data.get("name"),
            state=data.get("state", ""),
            routed=data.get("routed") or 0,
            finished=data.get("finished") or 0,
            preemptions=data.get("preemptions") or 0,
            total_blocks=_figure(data.get("total_blocks")),
            usage_mean=_figure(data.get("usage_mean")),
            usage_peak=data.get("usage_peak"),
            free_share_mean=_figure(data.get("free_share_mean")),
            free_blocks_min=data.get("free_blocks_min"),
            prompt_tokens=data.get("prompt_tokens") or 0,
            cached_tokens=data.get("cached_tokens") or 0,
            prefix_hit_rate=data.get("prefix_hit_rate"),
            started_at_s=data.get("started_at_s"),
            ready_at_s=data.get("ready_at_s"),
            stopped_at_s=data.get("stopped_at_s"),
            startup_s=data.get("startup_s"),
            failure=data.get("failure"),
            routed_after_drain=data.get("routed_after_drain") or 0,
        )


def _figure(value: Any) -> Any:
    """A recorded figure as written (an int stays an int); None where it is not a number."""
    return value if number(value) is not None else None


@dataclass(frozen=True)
class FleetPoint:
    """One policy on the fleet's arrivals, in the results schema: the sweep's names where they mean the same
    (``p99_ttft_ms``, ``output_throughput``, ``preemptions``), and what a fleet adds."""

    policy: str
    engine: str = ""  # "<kv engine>/<policy>"
    concurrency: int = 0  # open loop: arrivals do not wait for completions
    scenario: str = ""
    kv_engine: str = ""
    status: str = "ok"  # ok | error (no request completed)
    completed: int = 0
    rejected: int = 0
    rejected_by_reason: dict[str, int] = field(default_factory=dict)  # rejected requests by the kind of reason
    rerouted: int = 0  # requests sent again after their instance failed
    preemptions: int = 0
    output_throughput: float = 0.0
    total_token_throughput: float = 0.0
    request_throughput: float = 0.0
    duration: float = 0.0  # seconds, as vLLM's benchmark names it (the same as elapsed_s)
    total_input_tokens: int = 0
    total_output_tokens: int = 0
    latencies: dict[str, float | None] = field(default_factory=dict)  # {stat}_{kind}_ms, in the file's order
    elapsed_s: float = 0.0
    kv_usage_mean: float | None = None  # the fleet's share of blocks in use (None: no sample)
    kv_usage_p99: float | None = None
    free_blocks_imbalance_mean: float | None = None  # max - min free blocks across the serving instances
    free_blocks_imbalance_p99: float | None = None
    free_blocks_imbalance_max: float | None = None
    queued_mean: float | None = None  # requests waiting across the fleet
    queued_peak: float | None = None
    instance_seconds: float | None = None  # the cost: seconds each instance was up, summed
    instances_peak: int = 0
    instances_mean: float | None = None
    scale_ups: int = 0
    scale_downs: int = 0
    prefix_hit_rate: float | None = None  # None: no prompt token counted
    routed_after_drain: int = 0
    instances: list[FleetInstance] = field(default_factory=list)
    simulated: bool = False
    # with an SLO only (written together): the objectives, finished requests a second meeting all, their share
    slo_ms: dict[str, float] | None = None
    request_goodput: float | None = None
    slo_met_share: float | None = None
    error: str | None = None  # written only when set
    notes: list[str] = field(default_factory=list)  # written only when there are some

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def latency(self, stat: str, kind: str) -> float | None:
        """A latency statistic in ms (``stat`` mean, median, std, p50, p90, p99; ``kind`` ttft, tpot, e2el, itl)."""
        return self.latencies.get(f"{stat}_{kind}_ms")

    @property
    def p50_ttft_ms(self) -> float | None:
        return self.latency("p50", "ttft")

    @property
    def p99_ttft_ms(self) -> float | None:
        return self.latency("p99", "ttft")

    @property
    def p50_tpot_ms(self) -> float | None:
        return self.latency("p50", "tpot")

    @property
    def p99_tpot_ms(self) -> float | None:
        return self.latency("p99", "tpot")

    def to_json(self, instances: bool = True) -> dict[str, Any]:
        """The point as ``summary.json`` and ``results.jsonl`` hold it; without ``instances``, the flat figures
        a CSV row takes."""
        out: dict[str, Any] = {
            "engine": self.engine,
            "concurrency": self.concurrency,
            "scenario": self.scenario,
            "policy": self.policy,
            "kv_engine": self.kv_engine,
            "status": self.status,
            "completed": self.completed,
            "rejected": self.rejected,
            "rejected_by_reason": dict(self.rejected_by_reason),
            "rerouted": self.rerouted,
            "preemptions": self.preemptions,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "request_throughput": self.request_throughput,
            "duration": self.duration,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            **self.latencies,
            "elapsed_s": self.elapsed_s,
            "kv_usage_mean": self.kv_usage_mean,
            "kv_usage_p99": self.kv_usage_p99,
            "free_blocks_imbalance_mean": self.free_blocks_imbalance_mean,
            "free_blocks_imbalance_p99": self.free_blocks_imbalance_p99,
            "free_blocks_imbalance_max": self.free_blocks_imbalance_max,
            "queued_mean": self.queued_mean,
            "queued_peak": self.queued_peak,
            "instance_seconds": self.instance_seconds,
            "instances_peak": self.instances_peak,
            "instances_mean": self.instances_mean,
            "scale_ups": self.scale_ups,
            "scale_downs": self.scale_downs,
            "prefix_hit_rate": self.prefix_hit_rate,
            "routed_after_drain": self.routed_after_drain,
        }
        if instances:
            out["instances"] = [instance.to_json() for instance in self.instances]
        out["simulated"] = self.simulated
        if self.slo_ms is not None:
            out["slo_ms"] = dict(self.slo_ms)
            out["request_goodput"] = self.request_goodput
            out["slo_met_share"] = self.slo_met_share
        if self.error is not None:
            out["error"] = self.error
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FleetPoint:
        """A point as ``summary.json`` or ``results.jsonl`` holds it; a field an older or hand-made point lacks
        keeps its empty value (counts 0, figures None, status ok)."""
        return cls(
            policy=data["policy"],
            engine=data.get("engine", ""),
            concurrency=data.get("concurrency", 0),
            scenario=data.get("scenario", ""),
            kv_engine=data.get("kv_engine", ""),
            status=data.get("status", "ok"),
            completed=data.get("completed") or 0,
            rejected=data.get("rejected") or 0,
            rejected_by_reason=dict(data.get("rejected_by_reason") or {}),
            rerouted=data.get("rerouted") or 0,
            preemptions=data.get("preemptions") or 0,
            output_throughput=data.get("output_throughput", 0.0),
            total_token_throughput=data.get("total_token_throughput", 0.0),
            request_throughput=data.get("request_throughput", 0.0),
            duration=data.get("duration", 0.0),
            total_input_tokens=data.get("total_input_tokens", 0),
            total_output_tokens=data.get("total_output_tokens", 0),
            latencies={key: value for key, value in data.items() if key in LATENCY_FIELDS},
            elapsed_s=data.get("elapsed_s", 0.0),
            kv_usage_mean=data.get("kv_usage_mean"),
            kv_usage_p99=data.get("kv_usage_p99"),
            free_blocks_imbalance_mean=data.get("free_blocks_imbalance_mean"),
            free_blocks_imbalance_p99=data.get("free_blocks_imbalance_p99"),
            free_blocks_imbalance_max=data.get("free_blocks_imbalance_max"),
            queued_mean=data.get("queued_mean"),
            queued_peak=data.get("queued_peak"),
            instance_seconds=data.get("instance_seconds"),
            instances_peak=data.get("instances_peak") or 0,
            instances_mean=data.get("instances_mean"),
            scale_ups=data.get("scale_ups") or 0,
            scale_downs=data.get("scale_downs") or 0,
            prefix_hit_rate=data.get("prefix_hit_rate"),
            routed_after_drain=data.get("routed_after_drain") or 0,
            instances=[FleetInstance.from_json(instance) for instance in data.get("instances") or []],
            simulated=bool(data.get("simulated", False)),
            slo_ms=data.get("slo_ms"),
            request_goodput=data.get("request_goodput"),
            slo_met_share=data.get("slo_met_share"),
            error=data.get("error"),
            notes=list(data.get("notes") or []),
        )
