"""The dataset command's typed document: summary.json read and written back key for key, a run's draw from a
dataset kept whole, and an older or hand-made document read with the defaults the report used."""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.fileio import json_text
from kvbench.results.dataset_draw import DatasetDraw
from kvbench.results.dataset_result import DatasetResult
from kvbench.studies.dataset_profile import DatasetSettings, describe_dataset

DATA = Path(__file__).parent / "data"


def test_a_written_summary_reads_back_byte_for_byte():
    text = (DATA / "dataset-summary.json").read_text()
    document = json.loads(text)
    result = DatasetResult.from_json(document)
    assert result.to_json() == document
    assert json_text(result.to_json()) == text.rstrip("\n")
    assert list(result.lengths) == ["prompt", "output", "total"] and result.lengths["total"].count == 40
    assert [p.engine for p in result.points] == ["contiguous-max", "contiguous-pow2", "paged-8", "paged-16", "paged-32"]
    assert result.point("paged-16") is result.points[3] and result.point("paged-64") is None
    assert result.meta.dataset.dropped_records == {"shorter than 4 tokens": 4}
    assert result.meta.command is not None and result.meta.command.startswith("kvbench dataset")
    assert result.meta.max_len == 512 and result.meta.scenario == "dataset" and result.meta.note


def test_the_study_writes_what_it_reads():
    result = describe_dataset(DatasetSettings("real-chat", requests=12, seed=1, block_sizes=(8, 32)), None)
    document = json.loads(json_text(result.to_json()))
    assert DatasetResult.from_json(document) == result
    assert list(document) == ["schema_version", "kind", "meta", "lengths", "histograms", "analytic", "points"]
    assert list(document["points"][0]) == [
        "engine",
        "concurrency",
        "held_tokens",
        "written_tokens",
        "waste_pct",
        "scenario",
        "status",
    ]
    assert list(document["meta"])[-6:] == ["scenario", "dataset", "model", "max_len", "seed", "note"]


def test_a_hand_made_document_takes_the_reports_defaults():
    result = DatasetResult.from_json(
        {
            "meta": {"dataset": {"path": "x.json", "counted_by": "words"}},
            "lengths": {},
            "points": [{"engine": "paged-16", "waste_pct": 3.0}],
        }
    )
    assert result.analytic is None and result.histograms == {} and result.meta.max_len is None
    assert result.meta.note == "" and result.meta.model is None
    (point,) = result.points
    assert point.held_tokens is None and point.status == "ok" and point.concurrency == 1


def test_a_draw_keeps_every_field_in_order():
    record = {
        "path": "a.jsonl",
        "format": "jsonl",
        "records": 10,
        "usable": 8,
        "requests": 20,
        "with_replacement": True,
        "skipped_records": {"not JSON": 1},
        "dropped_records": {"longer than max-len": 1},
        "counted_by": "tok",
    }
    assert json.dumps(DatasetDraw.from_json(record).to_json()) == json.dumps(record)
    assert DatasetDraw.from_json({"path": "a"}).to_json()["skipped_records"] == {}
