"""One engine instance over a watch, summed up from its scrapes: peaks, means and new preemptions, and None where
the engine exposes nothing."""

from __future__ import annotations

import pytest

from kvbench.results.servers import ServerState
from kvbench.results.watch_summary import InstanceSummary


def _state(**values) -> ServerState:
    return ServerState("vllm", {"engine": "0"}, **values)


def test_an_instance_is_summed_up_over_its_scrapes():
    samples = [
        (0.0, _state(usage=0.2, running=1, waiting=0, preemptions=3)),
        (1.5, _state(usage=0.6, running=4, waiting=2, preemptions=3)),
        (3.0, _state(usage=0.4, running=2, waiting=5, preemptions=7)),
    ]
    summary = InstanceSummary.of(samples)
    assert summary.scrapes == 3 and summary.span_s == 3.0 and summary.family == "vLLM"
    assert summary.usage_mean == pytest.approx(0.4) and summary.usage_peak == 0.6
    assert summary.running_peak == 4 and summary.waiting_peak == 5 and summary.preemptions == 4


def test_what_an_engine_does_not_expose_stays_none():
    summary = InstanceSummary.of([(0.0, _state(preemptions=2))])
    assert summary.usage_mean is None and summary.usage_peak is None and summary.running_peak is None
    assert summary.preemptions is None  # one scrape: no new preemptions to count
    assert InstanceSummary.of([]) == InstanceSummary(0, 0.0, None, None, None, None, None, "")
