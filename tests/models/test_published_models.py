"""Well-known models: kvbench's KV bytes per token and weight bytes against the figures their model cards and papers
publish, from fixtures holding the real configs' fields, and the table in docs/CAPACITY.md kept true to both."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kvbench.models.hf_config import shape_from_config
from kvbench.models.shapes import ModelShape

ROOT = Path(__file__).resolve().parents[2]
PUBLISHED = Path(__file__).parent / "data" / "published"
GIB = 1024**3


def shape(fixture: str) -> ModelShape:
    return shape_from_config(PUBLISHED / fixture, name=fixture)


def past_window_bytes(model: ModelShape) -> int:
    return model.full_attention_layers * model.kv_values_per_layer * model.kv_dtype_bytes


def embedding(model: ModelShape) -> int:
    return model.vocab_size * model.hidden_size


def within(ours: float, published: float, precision: float) -> bool:
    """``published`` is ``ours`` as rounded to ``precision`` (half a unit either way: 15.625 shows as 15.62)."""
    return abs(ours - published) <= precision / 2 + 1e-9


# fixture -> (what, kvbench's figure, the published one, its precision): the sources are in docs/CAPACITY.md
CHECKS = {
    "llama-3.1-8b-instruct.json": lambda m: [
        ("KV GiB at 128k tokens, fp16", m.kv_bytes(128_000) / GIB, 15.62, 0.01),
        ("fp16 weights, GB", m.weight_bytes / 1e9, 16, 1),
    ],
    "llama-3.1-70b-instruct.json": lambda m: [
        ("KV GiB at 128k tokens, fp16", m.kv_bytes(128_000) / GIB, 39.06, 0.01),
        ("fp16 weights, GB (70B x 2 bytes, rounded to tens)", m.weight_bytes / 1e9, 140, 10),
    ],
    "mixtral-8x7b-v0.1.json": lambda m: [
        ("total parameters, B", m.num_parameters / 1e9, 46.7, 0.1),
        ("parameters per token, B", m.active_parameters / 1e9, 12.9, 0.1),
        ("KV values per token and layer (2 x 8 KV heads x 128)", m.kv_values_per_layer, 2 * 8 * 128, 1),
    ],
    "deepseek-v3.json": lambda m: [
        ("total parameters, B", m.num_parameters / 1e9, 671, 1),
        ("activated parameters without the input embedding, B", (m.active_parameters - embedding(m)) / 1e9, 37, 1),
        ("KV values per token ((d_c + d_h^R) x layers)", m.kv_values_per_layer * m.num_layers, (512 + 64) * 61, 1),
    ],
    "gemma-3-27b-it.json": lambda m: [
        ("non-embedding parameters, M", (m.num_parameters - m.vision_parameters - embedding(m)) / 1e6, 25_600, 1),
        ("embedding parameters, M (0.45% under: see the docs)", embedding(m) / 1e6, 1_416, 13),
        ("vision encoder, M (the projector apart)", (m.vision_parameters - 1152 - 1152 * 5376) / 1e6, 417, 1),
        ("global layers (1 in 6)", m.full_attention_layers, 62 // 6, 1),
    ],
    "qwen3-235b-a22b.json": lambda m: [
        ("total parameters, B", m.num_parameters / 1e9, 235, 1),
        ("activated parameters, B", m.active_parameters / 1e9, 22, 1),
        ("non-embedding parameters, B", (m.num_parameters - 2 * embedding(m)) / 1e9, 234, 1),
        ("KV values per token and layer (2 x 4 KV heads x 128)", m.kv_values_per_layer, 2 * 4 * 128, 1),
    ],
    "gpt-oss-120b.json": lambda m: [
        ("total parameters, B", m.num_parameters / 1e9, 116.83, 0.01),
        ("active parameters without the embedding, B", (m.active_parameters - embedding(m)) / 1e9, 5.13, 0.01),
        ("checkpoint, GiB", m.weight_bytes / GIB, 60.8, 0.1),
        ("KV values per token and layer (2 x 8 KV heads x 64)", m.kv_values_per_layer, 2 * 8 * 64, 1),
    ],
}


@pytest.mark.parametrize("fixture", sorted(CHECKS))
def test_figures_agree_with_what_is_published(fixture):
    model = shape(fixture)
    wrong = [
        (what, ours, published)
        for what, ours, published, precision in CHECKS[fixture](model)
        if not within(ours, published, precision)
    ]
    assert wrong == []


def _docs_rows() -> dict[str, list[str]]:
    text = (ROOT / "docs" / "CAPACITY.md").read_text(encoding="utf-8")
    table = text.split("<!-- published-models -->")[1].split("<!-- /published-models -->")[0]
    rows = {}
    for line in table.strip().splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        fixture = re.search(r"`([^`]+\.json)`", cells[0]).group(1)
        rows[fixture] = cells
    return rows


def test_the_docs_table_lists_every_checked_model():
    assert sorted(_docs_rows()) == sorted(CHECKS)


@pytest.mark.parametrize("fixture", sorted(CHECKS))
def test_the_docs_table_shows_kvbench_figures(fixture):
    model = shape(fixture)
    _, kv_cell, weight_cell, published_cell, source = _docs_rows()[fixture]
    assert kv_cell.startswith(f"{model.bytes_per_token:,} B in ")  # 16-bit values: bf16 as served
    if model.sliding_layers:
        assert f"{past_window_bytes(model):,} B past {model.sliding_window:,} tokens" in kv_cell
    assert f"{model.num_parameters:,} parameters" in weight_cell
    assert f"{model.weight_bytes:,} B" in weight_cell
    if model.moe is not None:
        assert f"({model.active_parameters:,} active)" in weight_cell
    for _, _, published, _ in CHECKS[fixture](model):
        if isinstance(published, float):
            assert f"{published:g}" in published_cell
    assert source.startswith("[") and "](https://" in source
