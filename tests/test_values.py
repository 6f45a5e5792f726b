"""The one number test every layer shares."""

from __future__ import annotations

import math

import pytest

from kvbench.values import is_number, number


@pytest.mark.parametrize("value", [0, 3, -2.5, 1e300])
def test_numbers_are_numbers_either_way(value):
    assert is_number(value, finite=True) and is_number(value, finite=False)


@pytest.mark.parametrize("value", [True, False, None, "1", [1]])
def test_bools_and_non_numbers_never_are(value):
    assert not is_number(value, finite=True) and not is_number(value, finite=False)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_count_only_when_the_caller_allows_them(value):
    assert not is_number(value, finite=True) and is_number(value, finite=False)


@pytest.mark.parametrize(
    "value, read",
    [(3, 3.0), (-2.5, -2.5), (math.inf, math.inf), (math.nan, None), (True, None), ("1", None), (None, None)],
)
def test_a_figure_reads_as_a_float_or_none_never_a_guess(value, read):
    assert number(value) == read
