"""The waste study's parts: the analytic estimate, the strategies and their simulation."""

from __future__ import annotations

import pytest

from kvbench.engine.timing import UniformTiming
from kvbench.errors import KvbenchError
from kvbench.studies.waste import Strategy, analytic_waste, parse_strategies, run_strategy


def test_analytic_waste_of_the_article():
    assert analytic_waste(500, 2048) == (2048 - 500) / 2048
    assert round(100 * analytic_waste(500, 2048), 1) == 75.6
    assert analytic_waste(2048, 2048) == 0.0


def test_parse_strategies():
    names = [s.name for s in parse_strategies(["contiguous-max", "paged", "contiguous-oracle"], [8, 16])]
    assert names == ["contiguous-max", "paged-8", "paged-16", "contiguous-oracle"]
    pow2 = parse_strategies(["contiguous-pow2"], [16])[0]
    assert (pow2.kind, pow2.block_size, pow2.policy) == ("contiguous", 1, "pow2")
    with pytest.raises(KvbenchError, match="unknown strategy 'best'"):
        parse_strategies(["best"], [16])


def test_run_strategy_with_a_budget_below_one_block():
    with pytest.raises(KvbenchError, match="holds no block"):
        run_strategy(
            Strategy("paged-16", "paged", 16),
            [(2, 2)],
            pool_slots=15,
            max_len=16,
            concurrency=1,
            timing=UniformTiming(),
        )


def test_run_strategy_returns_every_block():
    pairs = [(3, 5), (8, 2), (1, 9), (4, 4)]
    for strategy in parse_strategies(["contiguous-max", "contiguous-pow2", "contiguous-oracle", "paged"], [4]):
        result = run_strategy(strategy, pairs, pool_slots=40, max_len=16, concurrency=3, timing=UniformTiming())
        assert len(result.completed) == 4
