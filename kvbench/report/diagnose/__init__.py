"""``kvbench diagnose``: rules over recorded results or live Prometheus metrics, each finding with evidence
and a concrete suggestion, and the same rules as Prometheus alerting rules.

Defaults come from the seed article (fragmentation > 0.3, free blocks < 10% of the pool, block allocation
latency p99 > 50 ms) plus what the data makes obvious: preemption storms, a baseline that spends most of
its pool on reservation, and a KV budget so small that it caps concurrency.
"""

from kvbench.report.diagnose.alerts import alerting_rules, rules_yaml
from kvbench.report.diagnose.exposition import Series, histogram_quantile, parse_exposition, scrape
from kvbench.report.diagnose.findings import SEVERITIES, Diagnosis, Finding
from kvbench.report.diagnose.live_rules import diagnose_series, diagnose_url
from kvbench.report.diagnose.run_rules import diagnose_points, diagnose_run
from kvbench.report.diagnose.thresholds import Thresholds, load_thresholds

__all__ = [
    "SEVERITIES", "Diagnosis", "Finding", "Series", "Thresholds", "alerting_rules", "diagnose_points", "diagnose_run",
    "diagnose_series", "diagnose_url", "histogram_quantile", "load_thresholds", "parse_exposition", "rules_yaml",
    "scrape",
]
