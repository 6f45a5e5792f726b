"""What one GPU holds under tensor and pipeline parallelism, written out by hand for real shapes."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvbench.errors import KvbenchError
from kvbench.models.deployment import (
    Parallelism,
    check_parallelism,
    deployment_budget,
    kv_bytes_per_token_layer,
    kv_heads_per_gpu,
    kv_replication,
    pipeline_stages,
    stage_shares,
)
from kvbench.models.gpus import GIB, activation_reserve_bytes, resolve_gpu
from kvbench.models.hf_config import shape_from_config
from kvbench.models.resolve import resolve_model

PUBLISHED = Path(__file__).parent / "data" / "published"


def published(name: str):
    return shape_from_config(PUBLISHED / f"{name}.json", name=name)


@pytest.mark.parametrize(
    "layers, stages, sizes",
    [
        (80, 1, [80]),
        (80, 2, [40, 40]),
        (80, 3, [27, 27, 26]),
        (61, 4, [15, 15, 16, 15]),
        (30, 4, [7, 8, 8, 7]),
    ],
)
def test_pipeline_stages_follow_vllm(layers, stages, sizes):
    # vLLM: layers // PP each; the remainder one each to the stages before the last, from the second-to-last back
    ranges = pipeline_stages(layers, stages)
    assert [len(r) for r in ranges] == sizes
    assert ranges[0].start == 0 and ranges[-1].stop == layers
    assert all(a.stop == b.start for a, b in zip(ranges, ranges[1:], strict=False))


def test_llama_3_1_70b_on_four_gpus_by_hand():
    shape = published("llama-3.1-70b-instruct")
    (share,) = stage_shares(shape, Parallelism(tensor=4))
    h, inter, vocab, layers = 8192, 28672, 128256, 80
    per_layer = (h * h + 2 * 1024 * h + h * h + 3 * h * inter) // 4 * 2 + 2 * h * 2  # matrices split, norms copied
    assert share.weight_bytes == layers * per_layer + 2 * (vocab * h // 4 * 2) + h * 2
    assert kv_heads_per_gpu(shape, 4) == 2 and kv_replication(shape, 4) == 1
    assert share.bytes_per_token == 80 * 2 * 2 * 128 * 2 == 81_920  # a quarter of 327,680
    assert share.activation_bytes == activation_reserve_bytes(shape, 2048, 4)


def test_tensor_parallelism_past_the_kv_heads_replicates_them():
    shape = published("llama-3.1-70b-instruct")  # 8 KV heads
    assert kv_heads_per_gpu(shape, 16) == 1 and kv_replication(shape, 16) == 2
    # one head per GPU at TP 8 and at TP 16: the KV per GPU stops shrinking
    assert kv_bytes_per_token_layer(shape, 16) == kv_bytes_per_token_layer(shape, 8) == 2 * 1 * 128 * 2
    (at8,), (at16,) = stage_shares(shape, Parallelism(8)), stage_shares(shape, Parallelism(16))
    kv_proj = 2 * 1024 * 8192 * 2 * 80  # K and V projections of every layer, bf16
    assert at8.weight_bytes - at16.weight_bytes > 0
    assert kv_proj // 8 == kv_proj // 16 * 2  # the K/V projections stay at one head's worth: not halved again


def test_latent_attention_is_whole_on_every_gpu():
    shape = published("deepseek-v3")
    assert kv_replication(shape, 8) == 8
    (share,) = stage_shares(shape, Parallelism(tensor=8))
    assert share.bytes_per_token == 61 * 576 * 2 == shape.bytes_per_token == 70_272


def test_pipeline_stages_hold_their_layers_and_the_ends():
    shape = resolve_model("llama-2-13b")  # 40 layers, hidden 5120, vocab 32000, fp16, untied
    first, last = stage_shares(shape, Parallelism(pipeline=2))
    h, inter, vocab = 5120, 13824, 32000
    layer = (4 * h * h + 3 * h * inter + 2 * h) * 2
    assert first.weight_bytes == 20 * layer + vocab * h * 2
    assert last.weight_bytes == 20 * layer + (h + vocab * h) * 2
    assert first.bytes_per_token == last.bytes_per_token == 20 * 2 * 40 * 128 * 2
    assert last.activation_bytes - first.activation_bytes == 4 * vocab * 256  # only the last stage has logits


def test_tied_embeddings_give_the_last_stage_its_own_lm_head():
    from dataclasses import replace

    shape = replace(resolve_model("tiny"), tie_word_embeddings=True)
    one = stage_shares(shape, Parallelism())[0].weight_bytes
    first, last = stage_shares(shape, Parallelism(pipeline=2))
    assert first.weight_bytes + last.weight_bytes == one + shape.vocab_size * shape.hidden_size * 4


def test_the_budget_and_kv_cache_memory():
    shape = resolve_model("llama-2-13b")
    gpu = resolve_gpu("a100-80g")
    budget = deployment_budget(shape, gpu, Parallelism(2), 0.9)
    (stage,) = budget.stages
    assert stage.kv_bytes == int(0.9 * 80 * GIB) - stage.share.weight_bytes - stage.share.activation_bytes
    assert budget.token_slots == stage.kv_bytes // (40 * 2 * 20 * 128 * 2)
    fixed = deployment_budget(shape, gpu, Parallelism(), 0.9, kv_cache_memory=GIB)
    assert fixed.stages[0].kv_bytes == GIB and fixed.token_slots == GIB // 819_200
    too_much = deployment_budget(shape, gpu, Parallelism(), 0.9, kv_cache_memory=70 * GIB)
    assert not too_much.weights_fit


@pytest.mark.parametrize(
    "tensor, pipeline, message",
    [
        (3, 1, "tensor parallel size 3 does not divide the 40 attention heads"),
        (1, 41, "pipeline parallel size 41 exceeds the 40 layers"),
        (0, 1, "tensor parallel size must be a positive integer"),
    ],
)
def test_parallelism_vllm_refuses(tensor, pipeline, message):
    with pytest.raises(KvbenchError, match=message):
        check_parallelism(resolve_model("llama-2-13b"), Parallelism(tensor, pipeline))
