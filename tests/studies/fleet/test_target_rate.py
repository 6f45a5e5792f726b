"""The rate that loads a simulated fleet to 85% of its KV blocks, chosen when no --rate is given."""

from __future__ import annotations

import numpy as np
import pytest

from kvbench.errors import KvbenchError
from kvbench.studies.fleet.fleet_setup import FleetOptions, FleetSetup
from kvbench.studies.fleet.study import simulate_policy
from kvbench.studies.fleet.target_rate import TARGET_USAGE, WAVES, blocks_held_sum, rate_for_usage


def test_blocks_held_over_a_requests_decode_steps_by_hand():
    prompt, output = np.array([1, 16, 17, 30]), np.array([1, 1, 20, 5])
    expected = [sum(-(-(p + k) // 16) for k in range(1, o + 1)) for p, o in zip(prompt, output, strict=True)]
    assert blocks_held_sum(prompt, output, 16).tolist() == expected == [1, 2, 45, 13]


def _arrival_usage(run, last_arrival: float) -> float:
    """Fleet block usage over the second half of the arrivals (the bench's steady-state measure)."""
    ticks: dict[float, list] = {}
    for t, _, used, total, _, _ in run.samples:
        if last_arrival / 2 <= t <= last_arrival:
            ticks.setdefault(t, []).append((used, total))
    return float(np.mean([sum(u for u, _ in rows) / sum(t for _, t in rows) for rows in ticks.values()]))


def test_a_simulated_fleet_without_a_rate_is_loaded_near_the_target():
    """The article's budget on 2 instances: the chosen rate, simulated, keeps 75-95% of the blocks in use."""
    setup = FleetSetup.resolve(FleetOptions(scenario="article", simulate=True, instances=2, policies=("round-robin",)))
    chosen = setup.meta()["rate_chosen"]
    assert chosen["usage"] == TARGET_USAGE and setup.meta()["rate"] == pytest.approx(setup.options.rate)
    assert len(setup.pairs) >= WAVES * chosen["running_per_instance"] * 2  # the load holds a while
    assert "85% of the KV blocks of the 2 instances" in setup.arrival_source
    usage = _arrival_usage(simulate_policy(setup, "round-robin"), setup.times[-1])
    assert 0.75 <= usage <= 0.95, usage


def test_the_rate_scales_with_the_instances_and_keeps_given_requests():
    one = FleetSetup.resolve(FleetOptions(scenario="article", simulate=True, instances=1, requests=500))
    four = FleetSetup.resolve(FleetOptions(scenario="article", simulate=True, instances=4, requests=500))
    assert len(one.pairs) == len(four.pairs) == 500  # --requests is kept
    assert four.options.rate == pytest.approx(4 * one.options.rate)
    estimate = rate_for_usage(one.pairs, one.timing, one.config.block_size, one.config.num_blocks, 1, usage=0.5)
    assert estimate.rate < one.options.rate and estimate.usage == 0.5  # a lower load needs fewer arrivals


def test_a_real_fleet_still_needs_a_rate_or_recorded_arrivals():
    with pytest.raises(KvbenchError, match="no arrival times: give an arrival rate"):
        FleetSetup.resolve(FleetOptions(scenario="ci-smoke", requests=5))
