"""Arrival times: a seeded Poisson process, and times recorded in a file."""

from __future__ import annotations

import math

import numpy as np
import pytest

from kvbench.errors import KvbenchError
from kvbench.workload.arrivals import gamma_arrivals, poisson_arrivals, recorded_arrivals


def test_poisson_arrivals_are_seeded_sorted_and_at_the_rate():
    times = poisson_arrivals(20000, 50.0, seed=1)
    assert times == poisson_arrivals(20000, 50.0, seed=1) and times[0] == 0.0
    assert all(b >= a for a, b in zip(times, times[1:], strict=False))
    assert len(times) / times[-1] == pytest.approx(50.0, rel=0.03)
    gaps = np.diff(times)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)  # exponential gaps


@pytest.mark.parametrize("rate", [0.0, -1.0, float("nan"), float("inf")])
def test_a_rate_that_is_not_positive_is_refused(rate):
    with pytest.raises(KvbenchError, match="arrival rate must be a positive number"):
        poisson_arrivals(5, rate, 0)


def test_recorded_arrivals_from_jsonl_and_csv(tmp_path):
    jsonl = tmp_path / "r.jsonl"
    jsonl.write_text(
        '{"prompt_token_ids": [1], "output_len": 2, "arrival_time": 10.5}\n'
        '{"prompt_token_ids": [1], "output_len": 2, "arrival_time": 11}\n'
    )
    assert recorded_arrivals(jsonl) == [0.0, 0.5]
    csv = tmp_path / "t.csv"
    csv.write_text("prompt_len,output_len,timestamp\n3,4,2\n3,4,5\n")
    assert recorded_arrivals(csv) == [0.0, 3.0]
    none = tmp_path / "n.jsonl"
    none.write_text('{"prompt_token_ids": [1], "output_len": 2}\n')
    assert recorded_arrivals(none) is None


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ('{"arrival_time": 1}\n{"x": 1}\n', "no arrival_time"),
        ('{"arrival_time": 2}\n{"arrival_time": 1}\n', "earlier than the row before"),
        ('{"arrival_time": "soon"}\n', "must be a number of seconds"),
        ('{"arrival_time": -3}\n', "non-negative"),
    ],
)
def test_bad_recorded_arrivals_are_one_line_errors(tmp_path, rows, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(rows)
    with pytest.raises(KvbenchError, match=message):
        recorded_arrivals(path)


def test_gamma_arrivals_have_the_rate_and_burstiness_asked():
    assert gamma_arrivals(50, 3.0, 1.0, 5) == poisson_arrivals(50, 3.0, 5)  # burstiness 1 is the Poisson process
    for burstiness in (0.25, 1.0, 4.0):
        times = gamma_arrivals(20000, 50.0, burstiness, seed=2)
        gaps = np.diff(times)
        assert times[0] == 0.0 and 1 / gaps.mean() == pytest.approx(50.0, rel=0.03)
        # a gamma of shape k has a coefficient of variation 1 / sqrt(k)
        assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)
    assert gamma_arrivals(4, 2.0, math.inf, 0) == [0.0, 0.5, 1.0, 1.5]
    assert gamma_arrivals(3, math.inf, 1.0, 0) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    ("rate", "burstiness", "message"),
    [
        (0.0, 1.0, "arrival rate"),
        (float("nan"), 1.0, "arrival rate"),
        (-2.0, 1.0, "arrival rate"),
        (1.0, 0.0, "burstiness"),
        (1.0, float("nan"), "burstiness"),
        (1.0, -1.0, "burstiness"),
    ],
)
def test_gamma_arrivals_refuse_values_outside_their_meaning(rate, burstiness, message):
    with pytest.raises(KvbenchError, match=message):
        gamma_arrivals(3, rate, burstiness, 0)
