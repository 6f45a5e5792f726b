"""The waste study's typed document: summary.json written by ``kvbench waste`` read back and written again key for
key, and an older or partial document read with the defaults the renderers used."""

from __future__ import annotations

import json

import pytest

from kvbench.results.strategy_point import StrategyPoint
from kvbench.results.waste_shares import WasteShares
from kvbench.results.waste_study import WasteAnalytic, WasteMeta, WasteStudy
from kvbench.studies.waste import STRATEGY_NAMES, WasteSettings, parse_strategies, run_waste_study, waste_workload


def _study(**changes) -> WasteStudy:
    settings = WasteSettings(
        strategies=tuple(parse_strategies(list(STRATEGY_NAMES), [16])),
        max_len=256,
        mean_len=100,
        requests=60,
        concurrency=8,
        **changes,
    )
    return run_waste_study(settings, waste_workload(settings))


@pytest.fixture(scope="module")
def eos_document() -> dict:
    return json.loads(json.dumps(_study(stop="eos").to_json()))


def test_a_written_document_reads_back_and_writes_the_same_json(eos_document):
    again = WasteStudy.from_json(eos_document).to_json()
    assert again == eos_document
    assert json.dumps(again) == json.dumps(eos_document)  # the same keys in the same order
    assert list(eos_document) == ["schema_version", "kind", "meta", "analytic", "points"]


def test_the_points_carry_what_the_study_adds(eos_document):
    study = WasteStudy.from_json(eos_document)
    by_engine = {p.engine: p for p in study.points}
    assert by_engine["contiguous-oracle"].hindsight_bound and not by_engine["paged-16"].hindsight_bound
    assert "hindsight_bound" not in eos_document["points"][-1]  # written only when set
    assert eos_document["points"][2]["hindsight_bound"] is True
    paged = by_engine["paged-16"]
    assert paged.bytes_per_token == eos_document["meta"]["model"]["bytes_per_token"]
    assert paged.max_concurrency == paged.peak_running == 8
    assert paged.shares.token_state_pct == eos_document["points"][-1]["waste"]["token_state_pct"]
    assert study.meta.stop == "eos" and study.meta.max_len == 256 and study.meta.model_name == "llama-2-13b"
    assert study.analytic is not None and study.analytic.mean_len == 100


def test_an_old_point_without_the_study_fields_writes_none_of_them():
    old = {"engine": "paged-16", "concurrency": 8, "scenario": "waste", "status": "ok"}
    point = StrategyPoint.from_json(old)
    assert point.max_concurrency is None and point.bytes_per_token is None and not point.hindsight_bound
    written = point.to_json()
    assert not {"max_concurrency", "bytes_per_token", "simulated_seconds", "hindsight_bound"} & set(written)


def test_a_partial_document_reads_with_the_defaults_the_page_used():
    study = WasteStudy.from_json({"schema_version": 1, "kind": "waste", "points": []})
    assert study.analytic is None and study.points == []
    assert study.meta == WasteMeta.from_json({})
    assert study.meta.stop == "length" and study.meta.model_name is None and study.meta.dataset is None
    analytic = WasteAnalytic.from_json({"at_mean_len_pct": 60.0})
    assert analytic.at_sampled_mean_pct == 0 and analytic.sampled_mean_len == 0 and analytic.mean_len is None
    assert "analytic" not in study.to_json()


def test_waste_shares_round_trip_and_tolerate_missing_parts():
    block = {
        "token_state_pct": 40.0,
        "reservation_pct": 10.0,
        "internal_pct": 5.0,
        "external_pct": 0.0,
        "free_pct": 45.0,
    }
    assert WasteShares.from_json(block).to_json() == block
    assert WasteShares.from_json({"internal_pct": 2.0}) == WasteShares(internal_pct=2.0)
