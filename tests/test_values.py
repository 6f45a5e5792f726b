"""The one number test and the one byte formatter every layer shares."""

from __future__ import annotations

import math

import pytest

from kvbench.values import human_bytes, is_number


@pytest.mark.parametrize("value", [0, 3, -2.5, 1e300])
def test_numbers_are_numbers_either_way(value):
    assert is_number(value, finite=True) and is_number(value, finite=False)


@pytest.mark.parametrize("value", [True, False, None, "1", [1]])
def test_bools_and_non_numbers_never_are(value):
    assert not is_number(value, finite=True) and not is_number(value, finite=False)


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_nan_and_infinity_count_only_when_the_caller_allows_them(value):
    assert not is_number(value, finite=True) and is_number(value, finite=False)


def test_bytes_in_the_fitting_unit_or_a_fixed_one():
    assert human_bytes(None) == "-" and human_bytes(512) == "512 B" and human_bytes(1536) == "1.50 KiB"
    assert human_bytes(3 * 1024**3) == "3.00 GiB" and human_bytes(2 * 1024**5) == "2,048.00 TiB"
    assert human_bytes(512 * 1024**2, "GiB") == "0.50 GiB" and human_bytes(6 * 1024**3, "GiB") == "6.00 GiB"
    assert human_bytes(2048, "B") == "2,048 B"
