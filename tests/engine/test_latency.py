"""Latency statistics as ``vllm bench serve`` computes and names them, so rows line up column by column."""

from __future__ import annotations

import numpy as np
import pytest

from kvbench.engine.latency import LATENCY_STATS, summarise, weighted_percentile


def test_percentiles_interpolate_linearly_as_numpy_and_vllm_do() -> None:
    """60 distinct TTFTs: p90 and p99 differ (the "lower" method gave both the 59th value), each numpy's figure."""
    values = np.linspace(0.010, 0.0662, 60)
    stats = summarise("ttft", values)
    assert stats["p90_ttft_ms"] == pytest.approx(1000 * np.percentile(values, 90))
    assert stats["p99_ttft_ms"] == pytest.approx(1000 * np.percentile(values, 99))
    assert stats["p90_ttft_ms"] < stats["p99_ttft_ms"] < 1000 * values[-1]
    assert stats["p50_ttft_ms"] == stats["median_ttft_ms"] == pytest.approx(1000 * np.median(values))


def test_every_statistic_in_vllm_bench_serve_names_and_formulas() -> None:
    """mean, median, std (population, numpy's default) and p50/p90/p99, ``{stat}_{metric}_ms``."""
    rng = np.random.default_rng(3)
    values = rng.lognormal(-3, 0.5, 37)
    stats = summarise("e2el", values)
    assert list(stats) == [f"{stat}_e2el_ms" for stat in LATENCY_STATS]
    expected = {
        "mean": np.mean(values),
        "median": np.median(values),
        "std": np.std(values),
        "p50": np.percentile(values, 50),
        "p90": np.percentile(values, 90),
        "p99": np.percentile(values, 99),
    }
    for stat, value in expected.items():
        assert stats[f"{stat}_e2el_ms"] == pytest.approx(1000 * value, rel=1e-12)


@pytest.mark.parametrize("q", [0, 1, 10, 50, 90, 99, 100])
def test_weighted_percentile_equals_the_repeated_values(q: float) -> None:
    """Weights are counts (the simulator's spans of equal gaps): the same figure as the values repeated."""
    rng = np.random.default_rng(int(q))
    values = rng.random(25)
    weights = rng.integers(0, 6, 25).astype(float)
    weights[3] = 4
    repeated = np.repeat(values, weights.astype(int))
    assert weighted_percentile(values, weights, q) == pytest.approx(np.percentile(repeated, q), rel=1e-12)
    stats = summarise("itl", values, weights)
    assert stats["std_itl_ms"] == pytest.approx(1000 * np.std(repeated), rel=1e-9)
    assert stats["mean_itl_ms"] == pytest.approx(1000 * np.mean(repeated), rel=1e-12)


def test_no_sample_gives_no_figure() -> None:
    assert set(summarise("tpot", []).values()) == {None}
    assert set(summarise("itl", [0.1, 0.2], [0, 0]).values()) == {None}  # values that occurred no time
    single = summarise("ttft", [0.004])
    assert single["p99_ttft_ms"] == single["median_ttft_ms"] == pytest.approx(4.0) and single["std_ttft_ms"] == 0
