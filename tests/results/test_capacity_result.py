"""The capacity command's typed result: ``kvbench capacity --json`` read and written back key for key (a model
that fits, one whose weights do not, one whose max-len does not), and the facts the report reads."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.fileio import json_text
from kvbench.results.capacity_result import CapacityResult, NotFitting, StrategyRow

DATA = Path(__file__).parent / "data"
CASES = [
    "capacity-mla-pipeline.json",
    "capacity-windowed-mxfp4.json",
    "capacity-max-len-short.json",
    "capacity-weights-short.json",
    "capacity-max-num-seqs.json",
]


@pytest.mark.parametrize("name", CASES)
def test_the_json_output_reads_back_byte_for_byte(name):
    text = (DATA / name).read_text()
    document = json.loads(text)
    result = CapacityResult.from_json(document)
    assert result.to_json() == document
    assert json_text(result.to_json()) + "\n" == text


def test_the_model_facts_the_report_shows():
    mla = CapacityResult.from_json(json.loads((DATA / "capacity-mla-pipeline.json").read_text()))
    assert mla.model.facts.name == "deepseek-v3" and mla.model.facts.latent_values == 512 + 64
    assert mla.model.facts.active_parameters is not None and mla.model.facts.sliding_window is None
    assert [s.layers for s in mla.stages] == [(0, 31), (31, 61)] and mla.fits and mla.verdict is None
    windowed = CapacityResult.from_json(json.loads((DATA / "capacity-windowed-mxfp4.json").read_text()))
    assert windowed.model.facts.sliding_window == 128 and windowed.model.facts.sliding_layers == 18
    assert windowed.model.facts.weight_format is not None and windowed.model.facts.weight_format.startswith("MXFP4")


def test_a_deployment_that_does_not_fit_says_why_and_what_would():
    weights = CapacityResult.from_json(json.loads((DATA / "capacity-weights-short.json").read_text()))
    (reason,) = weights.reasons
    assert not weights.fits and reason.kind == "weights" and reason.short_bytes and reason.longest_context is None
    assert weights.strategies == [] and weights.kv_token_slots is None and weights.suggestions
    assert weights.verdict is not None and weights.verdict.endswith(reason.message)
    short = CapacityResult.from_json(json.loads((DATA / "capacity-max-len-short.json").read_text()))
    assert short.reasons[0].kind == "max_len" and short.strategies and short.fits_one_max_len_request is False


def test_a_reason_writes_the_advice_only_once_it_has_it():
    reason = NotFitting("max_len", "too long", kv_budget_bytes=10, request_bytes=20, longest_context=5)
    assert list(reason.to_json()) == ["kind", "message", "kv_budget_bytes", "request_bytes", "longest_context"]
    advised = NotFitting.from_json(
        {**reason.to_json(), "smallest_fitting_tensor_parallel_size": None, "gpu_memory_needed_bytes": 7}
    )
    assert list(advised.to_json())[-2:] == ["smallest_fitting_tensor_parallel_size", "gpu_memory_needed_bytes"]


def test_only_a_paged_strategy_writes_its_blocks():
    row = StrategyRow("contiguous-max", 2048, 1, 4, 4, 50.0, 4, 4.5, 9000, "kv_cache", "kv_cache")
    assert "block_size" not in row.to_json() and list(row.to_json())[-1] == "longest_context_limited_by"
    paged = StrategyRow("paged-16", 512, 1, 4, 4, 90.0, 4, 4.5, 9000, "kv_cache", "model", 16, 100, 1600)
    assert list(paged.to_json())[-4:] == ["block_size", "kv_blocks", "kv_cache_tokens", "longest_context_limited_by"]
    assert StrategyRow.from_json(paged.to_json()) == paged
