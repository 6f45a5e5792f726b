"""The one number test every layer shares."""

from __future__ import annotations

import math

import pytest

from kvbench.values import int_or_none, is_number, number, text_or_none


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


@pytest.mark.parametrize(("value", "read"), [(3, 3), (4.9, 4), (-2.5, -2), (0, 0)])
def test_a_finite_number_reads_as_an_int(value, read):
    assert int_or_none(value) == read and type(int_or_none(value)) is int


@pytest.mark.parametrize("value", [True, False, None, "3", math.nan, math.inf, -math.inf, [3], {"n": 3}])
def test_anything_else_is_no_int(value):
    assert int_or_none(value) is None


@pytest.mark.parametrize(("value", "read"), [("a100", "a100"), (3, "3"), (0, "0"), (False, "False"), (" ", " ")])
def test_a_recorded_value_reads_as_text(value, read):
    assert text_or_none(value) == read


@pytest.mark.parametrize("value", [None, ""])
def test_nothing_recorded_is_no_text(value):
    assert text_or_none(value) is None
