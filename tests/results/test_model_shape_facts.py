"""A model's shape as a run records it, read as the few typed facts a report states."""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.results.model_shape_facts import ModelShapeFacts

CPU_RUN = Path(__file__).resolve().parents[1] / "report" / "data" / "article-interleaved-a.json"


def test_a_recorded_shape_reads_typed():
    shape = ModelShapeFacts.from_json(json.loads(CPU_RUN.read_text())["meta"]["model_shape"])
    assert shape == ModelShapeFacts("llama", 2, 64, 4, 2, 16, 139584, "fp32", 512)


def test_what_a_run_did_not_record_or_recorded_otherwise_is_none():
    assert ModelShapeFacts.from_json({}) == ModelShapeFacts()
    odd = ModelShapeFacts.from_json({"num_layers": True, "hidden_size": "64", "dtype": "", "num_parameters": "7B"})
    assert odd.num_layers is None and odd.hidden_size is None and odd.dtype is None and odd.num_parameters is None
