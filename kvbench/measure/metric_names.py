"""kvbench's Prometheus metric names, written once (docs/ARCHITECTURE.md lists them with their labels).

The exporter (``measure.metrics``), the reader of a scrape (``report.diagnose.servers``) and the alerting
rules (``report.diagnose.alerts``) all name a series through these constants.
"""

from __future__ import annotations

PREFIX = "kvbench_"  # every kvbench series starts with it

# gauges, labelled by engine and device (a fleet's also by instance)
BLOCKS_USED = "kvbench_kv_cache_blocks_used"
BLOCKS_FREE = "kvbench_kv_cache_blocks_free"
BLOCKS_CAPACITY = "kvbench_kv_cache_blocks_capacity"  # a gauge: `_total` is for counters only
BLOCK_SIZE = "kvbench_kv_cache_block_size"  # tokens per block
FRAGMENTATION = "kvbench_kv_cache_fragmentation"
RUNNING = "kvbench_requests_running"
WAITING = "kvbench_requests_waiting"
CACHED_BLOCKS = "kvbench_prefix_cache_blocks"  # blocks whose content the prefix cache can hand out
# counters
PREEMPTIONS = "kvbench_num_preemptions_total"
GENERATED_TOKENS = "kvbench_generated_tokens_total"
PROMPT_TOKENS = "kvbench_prompt_tokens_total"  # prompts prefilled (counted once, at a request's first token)
FINISHED = "kvbench_requests_finished_total"
PREFIX_QUERIES = "kvbench_prefix_cache_queries_total"  # prompt tokens looked up (vLLM's prefix_cache_queries)
PREFIX_HITS = "kvbench_prefix_cache_hits_total"  # of which the cache held the KV
# counters of a server's engine loop, labelled also by phase (decode | prefill)
STEPS = "kvbench_engine_steps_total"
STEP_SECONDS = "kvbench_engine_step_seconds_total"  # wall seconds of those steps, the loop's own work included
STEP_TOKENS = "kvbench_engine_step_tokens_total"  # tokens they computed (prefill: those the prefix cache lacked)
# histogram (its series: ``_bucket`` with ``le``, ``_sum``, ``_count``)
ALLOC_LATENCY = "kvbench_block_alloc_latency_seconds"
# a fleet's instances, labelled by engine and state (serving | starting)
FLEET_INSTANCES = "kvbench_fleet_instances"

assert all(
    name.startswith(PREFIX)
    for name in (
        BLOCKS_USED,
        BLOCKS_FREE,
        BLOCKS_CAPACITY,
        BLOCK_SIZE,
        FRAGMENTATION,
        RUNNING,
        WAITING,
        CACHED_BLOCKS,
        PREEMPTIONS,
        GENERATED_TOKENS,
        PROMPT_TOKENS,
        FINISHED,
        PREFIX_QUERIES,
        PREFIX_HITS,
        STEPS,
        STEP_SECONDS,
        STEP_TOKENS,
        ALLOC_LATENCY,
        FLEET_INSTANCES,
    )
)
