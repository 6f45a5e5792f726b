"""What a fleet run can be asked for: each limit that cannot be met is refused with its reason, and what is
within them passes (tested without running a fleet)."""

from __future__ import annotations

import math
import re

import pytest

from kvbench.errors import KvbenchError
from kvbench.studies.fleet.limits import (
    MAX_REAL_S,
    MAX_SIMULATED_S,
    check_arrival_span,
    check_rate,
    check_settings,
)


@pytest.mark.parametrize("simulate, limit", [(True, MAX_SIMULATED_S), (False, MAX_REAL_S)])
def test_a_rate_whose_arrivals_pass_the_horizon_is_refused_with_the_rate_that_fits(simulate, limit):
    fits = 99 / limit
    check_rate(fits * 1.01, 100, simulate)
    with pytest.raises(KvbenchError, match=f"raise the rate to at least {fits:.3g} req/s"):
        check_rate(fits * 0.99, 100, simulate)
    check_rate(1e-300, 1, simulate)  # one request arrives at 0 whatever the rate


@pytest.mark.parametrize("rate", [0.0, -1.0, math.nan, math.inf, 5e-324])
def test_a_rate_that_is_no_rate_or_too_small_to_divide_by_is_refused(rate):
    with pytest.raises(KvbenchError):
        check_rate(rate, 10, True)


@pytest.mark.parametrize(
    "last, ok",
    [
        (MAX_SIMULATED_S, True),
        (MAX_SIMULATED_S * 1.01, False),
        (math.inf, False),
        (math.nan, False),
        (365 * 86400.0, True),
    ],
)
def test_recorded_arrivals_must_end_within_what_a_simulated_clock_resolves(last, ok):
    times = [0.0, 1.0, last]
    if ok:
        check_arrival_span(times, True, "a trace")
    else:
        with pytest.raises(KvbenchError, match=r"the arrivals \(a trace\) span"):
            check_arrival_span(times, True, "a trace")


def test_a_real_fleet_waits_its_arrivals_out_on_the_wall_clock_for_a_day_at_most():
    check_arrival_span([0.0, MAX_REAL_S], False, "t")
    with pytest.raises(KvbenchError, match="a real fleet replays arrivals on the wall clock"):
        check_arrival_span([0.0, 365 * 86400.0], False, "t")


@pytest.mark.parametrize(
    "kwargs, said",
    [
        ({"tick_s": 1e-9}, "a tick of 1e-09 s is finer than an engine step"),
        ({"tick_s": math.nan}, "a tick of nan s"),
        ({"startup_s": 1e300}, "an instance start-up of 1e+300 s"),
        ({"startup_s": -1.0}, "an instance start-up of -1 s"),
        ({"prefix_groups": 10**12, "prefix_len": 8}, "prefix groups is above kvbench's limit"),
        ({"prefix_groups": 4, "prefix_len": 2047}, "a prefix at most 2,046"),
    ],
)
def test_settings_that_cannot_be_met_are_refused(kwargs, said):
    settings = {"tick_s": None, "startup_s": 20.0, "prefix_groups": 0, "prefix_len": 0, "max_len": 2048, **kwargs}
    with pytest.raises(KvbenchError, match=re.escape(said)):
        check_settings(**settings)


def test_settings_within_the_limits_pass():
    check_settings(0.001, 0.0, 1_000_000, 2046, 2048)
    check_settings(None, 1e9, 0, 10**9, 2048)  # a prefix length without groups is not used
