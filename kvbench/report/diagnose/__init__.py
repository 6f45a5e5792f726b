"""``kvbench diagnose``: rules over recorded results, a live metrics endpoint (kvbench, vLLM or SGLang) or a
timeline recorded by ``kvbench watch``; each finding with evidence and a suggestion in the words of the engine
diagnosed, and the rules for kvbench's metrics as Prometheus alerting rules.

Defaults come from the seed article (fragmentation > 0.3, free blocks < 10% of the pool, block allocation
latency p99 > 50 ms) plus what the data makes obvious: preemption storms, a baseline that spends most of
its pool on reservation, a KV budget so small that it caps concurrency, and requests that queue while the KV
cache has room (the scheduler's batch cap).
"""

from kvbench.report.diagnose.alerts import alerting_rules, rules_yaml
from kvbench.report.diagnose.findings import SEVERITIES, Diagnosis, Finding, Measurement, NotEvaluated
from kvbench.report.diagnose.live_rules import Window, diagnose_states, diagnose_url, diagnose_windows
from kvbench.report.diagnose.run_rules import diagnose_points, diagnose_run
from kvbench.report.diagnose.thresholds import Thresholds, load_thresholds
from kvbench.report.diagnose.watch_timeline import diagnose_timeline, read_timeline, timeline_path
from kvbench.results.exposition import Sample, histogram_quantile, parse_samples, scrape
from kvbench.results.servers import FAMILIES, ServerState, read_states

__all__ = [
    "FAMILIES",
    "SEVERITIES",
    "Diagnosis",
    "Finding",
    "Measurement",
    "NotEvaluated",
    "Sample",
    "ServerState",
    "Thresholds",
    "Window",
    "alerting_rules",
    "diagnose_points",
    "diagnose_run",
    "diagnose_states",
    "diagnose_timeline",
    "diagnose_url",
    "diagnose_windows",
    "histogram_quantile",
    "load_thresholds",
    "parse_samples",
    "read_states",
    "read_timeline",
    "rules_yaml",
    "scrape",
    "timeline_path",
]
