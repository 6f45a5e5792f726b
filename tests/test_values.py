"""The one number test every layer shares."""

from __future__ import annotations

import math

import pytest

from kvbench.values import is_number


@pytest.mark.parametrize("value", [0, 3, -2.5, 1e300])
def test_numbers_are_numbers_either_way(value):
    assert is_number(value, finite=True) and is_number(value, finite=False)


@pytest.mark.parametrize("value", [True, False, None, "1", [1]])
def test_bools_and_non_numbers_never_are(value):
    assert not is_number(value, finite=True) and not is_number(value, finite=False)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_count_only_when_the_caller_allows_them(value):
    assert not is_number(value, finite=True) and is_number(value, finite=False)
