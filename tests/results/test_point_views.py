"""A point's typed views of its JSON blocks (the waste shares, the output-length histogram): read from a shipped
sweep's points, empty where an older point wrote none, and the point's JSON form untouched by them."""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.results.length_histogram import LengthHistogram
from kvbench.results.point import Point
from kvbench.results.strategy_point import StrategyPoint
from kvbench.results.waste_shares import WasteShares

SHIPPED = Path(__file__).parents[1] / "report" / "data" / "article-interleaved-a.json"


def shipped_points() -> list[dict]:
    return json.loads(SHIPPED.read_text())["points"]


def test_the_histogram_view_reads_the_points_block():
    for doc in shipped_points():
        point = Point.from_json(doc)
        hist = point.output_histogram
        assert hist == LengthHistogram(doc["output_len_hist"]["edges"], doc["output_len_hist"]["counts"])
        assert hist.to_json() == doc["output_len_hist"]
        assert json.dumps(point.to_json()) == json.dumps(doc)  # the view leaves the JSON form as it was


def test_a_point_without_output_lengths_has_no_histogram():
    assert Point.from_json({"engine": "paged", "concurrency": 1}).output_histogram is None
    assert Point.from_json({"engine": "paged", "concurrency": 1, "output_len_hist": None}).output_histogram is None


def test_a_length_histogram_round_trips():
    data = {"edges": [0.0, 5.0, 10.0], "counts": [3, 1]}
    assert LengthHistogram.from_json(data).to_json() == data


def test_the_shares_view_reads_the_waste_block():
    for doc in shipped_points():
        shares = Point.from_json(doc).shares
        assert shares.to_json() == doc["waste"]
        assert shares.internal_pct == doc["waste"]["internal_pct"]


def test_a_point_without_a_waste_block_has_no_shares():
    shares = Point.from_json({"engine": "paged", "concurrency": 1}).shares
    assert shares == WasteShares() and shares.token_state_pct is None


def test_a_strategy_point_reads_its_shares_as_a_point_does():
    doc = shipped_points()[0]
    assert StrategyPoint.from_json(doc).shares == Point.from_json(doc).shares
