"""Mann-Whitney U against values worked out by hand."""

import math

import pytest

from kvbench.report.mannwhitney import _u_counts, mann_whitney_u, min_two_sided_p


def test_complete_separation_three_vs_three_is_exact_and_cannot_reach_five_percent():
    # U = 0; exactly 1 of the C(6,3) = 20 orderings is this extreme on each side: p = 2/20.
    result = mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert result.method == "exact"
    assert result.u == 0
    assert result.p_value == pytest.approx(0.1)
    assert min_two_sided_p(3, 3) == pytest.approx(0.1)


def test_one_inversion_three_vs_three():
    # x = 1,2,4 and y = 3,5,6: only 4 > 3, so U = 1. U <= 1 in 2 of 20 orderings: p = 2 * 2/20.
    result = mann_whitney_u([1, 2, 4], [3, 5, 6])
    assert result.u == 1
    assert result.p_value == pytest.approx(0.2)


def test_separation_four_vs_four_reaches_five_percent():
    result = mann_whitney_u([10.0, 11.0, 12.0, 13.0], [1.0, 2.0, 3.0, 4.0])
    assert result.u == 16  # every x beats every y
    assert result.p_value == pytest.approx(2 / 70)


def test_u_distribution_counts_every_ordering():
    assert _u_counts(3, 3) == (1, 1, 2, 3, 3, 3, 3, 2, 1, 1)
    assert sum(_u_counts(5, 7)) == math.comb(12, 5)


def test_ties_use_the_normal_approximation_with_tie_correction():
    # Pooled, sorted: 1x 2x 2x 2y 3x 3y 4y 5y. Midranks: 1; 3,3,3; 5.5,5.5; 7; 8.
    # R_x = 1 + 3 + 3 + 5.5 = 12.5, U = 12.5 - 4*5/2 = 2.5, mean 8.
    # Ties of size 3 and 2: sum(t^3 - t) = 24 + 6 = 30; var = 4*4/12 * (9 - 30/(8*7)).
    result = mann_whitney_u([1, 2, 2, 3], [2, 3, 4, 5])
    assert result.method == "normal"
    assert result.u == pytest.approx(2.5)
    z = (abs(2.5 - 8) - 0.5) / math.sqrt(16 / 12 * (9 - 30 / 56))
    assert result.p_value == pytest.approx(math.erfc(z / math.sqrt(2)))
    assert result.p_value == pytest.approx(0.1367, abs=1e-4)


def test_identical_samples_give_p_one():
    assert mann_whitney_u([5, 5, 5], [5, 5, 5]).p_value == 1.0
    assert mann_whitney_u([1, 2, 3], [1, 2, 3]).p_value == 1.0


def test_empty_sample_is_refused():
    with pytest.raises(ValueError):
        mann_whitney_u([], [1.0])
