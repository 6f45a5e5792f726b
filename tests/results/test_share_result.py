"""The share command's typed document: summary.json read and written back key for key, the per-mode costs
recovered from their flat keys, and a hand-made document read with the defaults the report used."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvbench.fileio import json_text
from kvbench.results.share_result import ShareResult, ShareRow, ShareSavings, WidthCost

DATA = Path(__file__).parent / "data"


@pytest.mark.parametrize("name", ["share-beam-summary.json", "share-dataset-summary.json"])
def test_a_written_summary_reads_back_byte_for_byte(name):
    text = (DATA / name).read_text()
    document = json.loads(text)
    result = ShareResult.from_json(document)
    assert result.to_json() == document
    assert json_text(result.to_json()) == text.rstrip("\n")


def test_the_fields_are_typed():
    result = ShareResult.from_json(json.loads((DATA / "share-beam-summary.json").read_text()))
    assert result.meta.kind == "beam" and result.meta.width == 2 and result.meta.dataset is None
    assert list(result.savings.costs) == ["paged-shared", "paged-copy", "contiguous"]
    assert result.savings.cost("paged-copy") == WidthCost(1.8571428571428572, 2.0)
    assert [(p.mode, p.width) for p in result.points][:2] == [("paged-shared", 2), ("paged-copy", 2)]
    assert result.meta.command is not None and result.meta.command.startswith("kvbench share")
    assert result.meta.block_size is not None and result.meta.model_name is not None
    withdata = ShareResult.from_json(json.loads((DATA / "share-dataset-summary.json").read_text()))
    assert withdata.meta.dataset is not None and withdata.meta.dataset.requests == 3


def test_savings_keep_their_flat_keys_in_mode_order():
    savings = ShareSavings(20.0, None, {"paged-shared": WidthCost(1.5, 2.0), "contiguous": WidthCost(3.0, 3.0)})
    assert list(savings.to_json()) == [
        "saved_by_sharing_pct_mean",
        "saved_by_sharing_pct_peak",
        "paged-shared_cost_vs_width1_mean",
        "paged-shared_cost_vs_width1_peak",
        "contiguous_cost_vs_width1_mean",
        "contiguous_cost_vs_width1_peak",
    ]
    assert ShareSavings.from_json(savings.to_json()) == savings


def test_a_hand_made_document_takes_the_reports_defaults():
    result = ShareResult.from_json(
        {
            "meta": {"kind": "parallel"},
            "points": [{"engine": "paged-shared", "concurrency": 3, "mean_blocks": 2.0, "peak_blocks": 3}],
        }
    )
    assert result.savings == ShareSavings() and result.meta.model_name is None and result.meta.dataset is None
    assert result.points == [ShareRow("paged-shared", 3, 2.0, 3, 0.0, 0)]
    assert result.points[0].to_json()["engine"] == "paged-shared" and result.points[0].to_json()["width"] == 3
