"""A server point's client-side metrics, typed, with ``vllm bench serve``'s names: the requests' counts, the
throughputs and the latency statistics (``mean_ttft_ms``, ``p99_tpot_ms``, ...) over the completed requests."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class ClientMetrics:
    """None where a figure has no meaning (no completed request, input counts unknown), never 0."""

    requests: int
    completed: int
    failed: int
    stopped: int  # cut by the point's time limit: neither done nor failed
    failed_by_kind: dict[str, int]
    failure_examples: list[str]
    duration: float  # seconds from the first request's release to the last one's end
    total_input_tokens: int | None
    total_output_tokens: int
    request_throughput: float
    request_goodput: float | None  # completed requests/s meeting every objective; None: no SLO
    output_throughput: float
    total_token_throughput: float | None
    input_tokens_from: dict[str, int]  # where the counts came from (usage, tokenizer, ...) -> requests
    output_tokens_from: dict[str, int]
    slo_ms: dict[str, float] | None = None  # written only with an SLO
    # {mean,median,std,p<q>}_{ttft,tpot,itl,e2el}_ms: the percentiles are the run's own
    latencies: dict[str, float | None] = field(default_factory=dict)

    def latency(self, name: str) -> float | None:
        """A statistic by its name (``p99_ttft_ms``); the schema's ``p50_`` is vLLM's ``median_``."""
        if name.startswith("p50_"):
            name = name.replace("p50_", "median_", 1)
        return self.latencies.get(name)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "requests": self.requests,
            "completed": self.completed,
            "failed": self.failed,
            "stopped": self.stopped,
            "failed_by_kind": self.failed_by_kind,
            "failure_examples": self.failure_examples,
            "duration": self.duration,
            "total_input_tokens": self.total_input_tokens,
            "total_output_tokens": self.total_output_tokens,
            "request_throughput": self.request_throughput,
            "request_goodput": self.request_goodput,
            "output_throughput": self.output_throughput,
            "total_token_throughput": self.total_token_throughput,
            "input_tokens_from": self.input_tokens_from,
            "output_tokens_from": self.output_tokens_from,
        }
        if self.slo_ms is not None:
            out["slo_ms"] = self.slo_ms
        return out | self.latencies

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClientMetrics:
        latencies = {key: value for key, value in data.items() if key.endswith("_ms") and key != "slo_ms"}
        return cls(
            data.get("requests") or 0,
            data["completed"],
            data["failed"],
            data.get("stopped") or 0,
            dict(data.get("failed_by_kind") or {}),
            list(data.get("failure_examples") or []),
            data["duration"],
            data["total_input_tokens"],
            data["total_output_tokens"],
            data["request_throughput"],
            data.get("request_goodput"),
            data["output_throughput"],
            data["total_token_throughput"],
            dict(data.get("input_tokens_from") or {}),
            dict(data.get("output_tokens_from") or {}),
            data.get("slo_ms"),
            latencies,
        )
