"""The public results schema (docs/ARCHITECTURE.md). CI pipelines parse it: bump SCHEMA_VERSION when it changes."""

from __future__ import annotations

from kvbench.engine.latency import LATENCY_KINDS, LATENCY_STATS

SCHEMA_VERSION = 1

LATENCY_FIELDS = tuple(f"{stat}_{kind}_ms" for kind in LATENCY_KINDS for stat in LATENCY_STATS)

WASTE_FIELDS = ("token_state_pct", "reservation_pct", "internal_pct", "external_pct")
MEMORY_FIELDS = (
    "rss_peak_bytes",
    "torch_allocated_peak_bytes",
    "torch_reserved_peak_bytes",
    "torch_inactive_split_peak_bytes",
    "nvml_used_peak_bytes",
)

POINT_FIELDS = (
    "engine",
    "concurrency",
    "scenario",
    "status",  # ok | oom | error
    "completed",
    "rejected",
    "preemptions",
    "output_throughput",
    "total_token_throughput",
    "request_throughput",
    "duration",  # seconds (vLLM's name)
    "total_input_tokens",
    "total_output_tokens",
    *LATENCY_FIELDS,
    "peak_running",
    "kv_pool_bytes",
    "kv_peak_allocated_bytes",
    "kv_mean_used_bytes",
    "waste",  # {WASTE_FIELDS}
    "fragmentation_mean",
    "memory",  # {MEMORY_FIELDS}, null where not measurable
)
# Optional fields of version 1 (a reader finds them absent in some files): the full-load window of the closed
# loop, the output lengths that occurred (decided by EOS or drawn), and for contiguous points the hindsight bound.
STEADY_FIELDS = ("steady_output_throughput", "steady_window_s", "steady_window_pct")
OUTPUT_LENGTH_FIELDS = ("output_len_mean", "output_len_p50", "output_len_p90", "output_len_max", "stopped_at_eos")
HINDSIGHT_FIELDS = ("kv_hindsight_oracle_peak_bytes", "kv_hindsight_oracle_mean_bytes")
# Also optional: vllm bench serve's duration, total_input_tokens, total_output_tokens and the median_ and std_
# latency statistics (percentiles interpolate linearly, as numpy and vLLM do); the engines a point ran interleaved
# with and the CPU seconds of its steps (cpu_time_s, CPU devices); a sweep summary's "findings".
INTERLEAVED_FIELD = "interleaved_with"

POINT_STATUSES = ("ok", "oom", "error")

# Direction of each comparable metric: +1 higher is better, -1 lower is better.
METRIC_DIRECTIONS: dict[str, int] = {
    "output_throughput": +1,
    "steady_output_throughput": +1,
    "total_token_throughput": +1,
    "request_throughput": +1,
    "completed": +1,
    "peak_running": +1,
    "rejected": -1,
    "preemptions": -1,
    "kv_peak_allocated_bytes": -1,
    "kv_mean_used_bytes": -1,
    "fragmentation_mean": -1,
    "waste.token_state_pct": +1,
    "waste.reservation_pct": -1,
    "waste.internal_pct": -1,
    "waste.external_pct": -1,
    **{name: -1 for name in LATENCY_FIELDS},
    # a reuse run's KV sizes (kvbench reuse): prompt tokens the prefix cache serves, and what it saves
    "hit_rate_pct": +1,
    "total_hit_rate_pct": +1,
    "prefill_time_saved_pct": +1,
}
