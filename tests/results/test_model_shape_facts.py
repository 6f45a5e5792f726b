"""A model's shape as a run records it, read as the few typed facts a report states."""

from __future__ import annotations

import json
from pathlib import Path

from kvbench.results.model_shape_facts import ModelShapeFacts

CPU_RUN = Path(__file__).resolve().parents[1] / "report" / "data" / "article-interleaved-a.json"
CAPACITY = Path(__file__).resolve().parent / "data"


def test_a_recorded_shape_reads_typed():
    shape = ModelShapeFacts.from_json(json.loads(CPU_RUN.read_text())["meta"]["model_shape"])
    assert shape == ModelShapeFacts("llama", 2, 64, 4, 2, 16, 139584, "fp32", 512, name="tiny")


def test_what_a_run_did_not_record_or_recorded_otherwise_is_none():
    assert ModelShapeFacts.from_json({}) == ModelShapeFacts()
    odd = ModelShapeFacts.from_json({"num_layers": True, "hidden_size": "64", "dtype": "", "num_parameters": "7B"})
    assert odd.num_layers is None and odd.hidden_size is None and odd.dtype is None and odd.num_parameters is None
    assert odd.name is None and odd.sliding_layers == 0 and odd.latent_values is None


def test_the_capacity_records_fields_read_typed():
    mla = ModelShapeFacts.from_json(json.loads((CAPACITY / "capacity-mla-pipeline.json").read_text())["model"])
    assert mla.name == "deepseek-v3" and mla.latent_values == 512 + 64 and mla.active_parameters is not None
    assert (
        mla.sliding_window is None and mla.sliding_layers == 0 and mla.weight_format == "FP8, a scale per 128x128 block"
    )
    windowed = ModelShapeFacts.from_json(json.loads((CAPACITY / "capacity-windowed-mxfp4.json").read_text())["model"])
    assert windowed.sliding_window == 128 and windowed.sliding_layers == 18
    assert windowed.weight_format is not None and windowed.weight_format.startswith("MXFP4")


def test_a_partial_latent_or_weight_format_record_reads_none():
    shape = ModelShapeFacts.from_json({"mla": {"kv_lora_rank": 512}, "weight_format": {"bits": 4}, "sliding_layers": 3})
    assert shape.latent_values is None and shape.weight_format is None and shape.sliding_layers == 0
    assert ModelShapeFacts.from_json({"num_layers": 64.0}).num_layers is None  # counts are ints, never a float
