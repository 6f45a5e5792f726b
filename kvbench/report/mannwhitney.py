"""Two-sided Mann-Whitney U test, the rank test asv uses to call a benchmark change significant.

Small samples without ties get the exact null distribution of U; otherwise the normal approximation
with tie and continuity corrections (the defaults of ``scipy.stats.mannwhitneyu``, without scipy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

EXACT_MAX_SIZE = 20  # the exact distribution is used when both samples are at most this long and untied


@dataclass(frozen=True)
class MannWhitneyResult:
    u: float  # U of the first sample: pairs (x, y) with x > y, a tie counting 1/2
    p_value: float  # two-sided
    method: str  # "exact" or "normal"


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> MannWhitneyResult:
    """Test whether ``x`` and ``y`` come from the same distribution (two-sided)."""
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("Mann-Whitney U needs at least one value in each sample")
    ranks, tie_sizes = _midranks([*x, *y])
    u = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    if max(tie_sizes) == 1 and max(n1, n2) <= EXACT_MAX_SIZE:
        return MannWhitneyResult(u, _exact_p(round(u), n1, n2), "exact")
    return MannWhitneyResult(u, _normal_p(u, n1, n2, tie_sizes), "normal")


def min_two_sided_p(n1: int, n2: int) -> float:
    """The smallest two-sided p-value samples of these sizes can reach (complete separation)."""
    return min(1.0, 2 / math.comb(n1 + n2, n1))


def _midranks(values: Sequence[float]) -> tuple[list[float], list[int]]:
    """1-based ranks, tied values sharing their mean rank; and the size of each group of ties."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    tie_sizes: list[int] = []
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        mean_rank = (start + end) / 2 + 1
        for i in order[start : end + 1]:
            ranks[i] = mean_rank
        tie_sizes.append(end - start + 1)
        start = end + 1
    return ranks, tie_sizes


def _exact_p(u: int, n1: int, n2: int) -> float:
    counts = _u_counts(n1, n2)
    total = math.comb(n1 + n2, n1)
    lower = sum(counts[: u + 1]) / total
    upper = sum(counts[u:]) / total
    return min(1.0, 2 * min(lower, upper))


@cache
def _u_counts(n1: int, n2: int) -> tuple[int, ...]:
    """Number of orderings of n1 x's and n2 y's giving each U = 0 .. n1*n2.

    The largest value is either an x (it beats all n2 y's) or a y (it beats no x).
    """
    if n1 == 0 or n2 == 0:
        return (1,)
    x_largest = _u_counts(n1 - 1, n2)
    y_largest = _u_counts(n1, n2 - 1)
    return tuple(
        (x_largest[u - n2] if 0 <= u - n2 < len(x_largest) else 0)
        + (y_largest[u] if u < len(y_largest) else 0)
        for u in range(n1 * n2 + 1)
    )


def _normal_p(u: float, n1: int, n2: int, tie_sizes: Sequence[int]) -> float:
    n = n1 + n2
    tie_term = sum(t**3 - t for t in tie_sizes) / (n * (n - 1))
    variance = n1 * n2 / 12 * ((n + 1) - tie_term)
    if variance <= 0:  # every value tied: no evidence of a difference
        return 1.0
    z = max(0.0, abs(u - n1 * n2 / 2) - 0.5) / math.sqrt(variance)
    return min(1.0, math.erfc(z / math.sqrt(2)))
