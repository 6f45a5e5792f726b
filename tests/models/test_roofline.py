"""The roofline's least work against hand arithmetic and a published parameter count; what it refuses."""

from __future__ import annotations

import pytest

from kvbench.errors import KvbenchError
from kvbench.models import roofline
from kvbench.models.shapes import MlaSpec, ModelShape

TINY = ModelShape("tiny", num_layers=2, hidden_size=8, num_heads=2, num_kv_heads=1, intermediate_size=16, vocab_size=32)


def test_tinyllama_matmuls_are_its_published_parameters_less_embedding_and_norms() -> None:
    # TinyLlama-1.1B: 1,100,048,384 parameters; the embedding (32000 x 2048) is looked up, not multiplied, and the
    # 45 norms (22 layers x 2 + the final one, 2048 each) are vectors
    tinyllama = ModelShape("tinyllama", 22, 2048, 32, 4, 5632, 32000, 2048)
    layers, head = roofline.matmul_parameters(tinyllama)
    assert head == 32000 * 2048
    assert layers + head == 1_100_048_384 - 32000 * 2048 - 45 * 2048


def test_tiny_work_by_hand() -> None:
    # per layer: q 8x8, k and v 4x8 each, o 8x8, gate and up 16x8 each, down 8x16 = 64 + 64 + 64 + 256 + 128 = 576
    layers, head = 2 * 576, 32 * 8
    assert roofline.matmul_parameters(TINY) == (layers, head)
    # 3 requests, 4 prompt tokens, 2 output tokens: 5 tokens through the layers, 2 lm_head rows, causal attention
    # over contexts 1..5 (15 keys per layer, 2 layers) at 4 x 8 (heads x head_dim) per key
    flops = 3 * (2 * layers * 5 + 2 * head * 2 + 4 * 8 * 2 * 15)
    # fp32 weights: (1152 + 256) x 4 bytes per pass; the one decode pass reads each request's 4 cached tokens' K and
    # V (2 layers x 2 x 1 head x 4 dims x 4 bytes = 64 bytes a token)
    weight_bytes = (layers + head) * 4
    memory = weight_bytes + (weight_bytes + 3 * 4 * 64)
    assert roofline.work(TINY, 3, 4, 2, dtype="fp32") == roofline.Work(flops, memory, 2)


def test_caches_keep_part_of_a_pass_and_bfloat16_weights_halve_it() -> None:
    plain = roofline.work(TINY, 3, 4, 2, dtype="fp32")
    kept = roofline.work(TINY, 3, 4, 2, dtype="fp32", cache_bytes=1000)
    assert kept.flops == plain.flops
    assert kept.memory_bytes == plain.memory_bytes - 2 * 1000
    everything = roofline.work(TINY, 3, 4, 2, dtype="fp32", cache_bytes=1 << 30)
    assert everything.memory_bytes == 0
    halved = roofline.work(TINY, 1, 4, 1, dtype="fp32", weight_bytes_per_value=2)
    assert halved.memory_bytes == roofline.work(TINY, 1, 4, 1, dtype="fp32").memory_bytes / 2


def test_windowed_layers_stop_attending_at_their_window() -> None:
    windowed = ModelShape(
        "windowed", 2, 8, 2, 1, 16, 32, sliding_window=2, sliding_layers=(0,), tie_word_embeddings=True
    )
    full, ours = roofline.work(TINY, 1, 4, 2, dtype="fp32"), roofline.work(windowed, 1, 4, 2, dtype="fp32")
    # layer 0 attends to min(context, 2) keys over contexts 1..5: 1 + 2 + 2 + 2 + 2 = 9 instead of 15
    assert full.flops - ours.flops == 4 * 8 * (15 - 9)


def test_least_seconds_is_the_slower_of_arithmetic_and_reads() -> None:
    need = roofline.Work(flops=100.0, memory_bytes=10.0, passes=1)
    assert need.least_seconds(flops_per_second=10.0, read_bytes_per_second=100.0) == 10.0
    assert need.least_seconds(flops_per_second=1000.0, read_bytes_per_second=2.0) == 5.0


@pytest.mark.parametrize(("requests", "prompt", "output"), [(0, 4, 2), (1, 0, 2), (1, 4, 0)])
def test_empty_workloads_are_refused(requests: int, prompt: int, output: int) -> None:
    with pytest.raises(KvbenchError, match="at least one"):
        roofline.work(TINY, requests, prompt, output, dtype="fp32")


def test_latent_attention_and_unknown_dtypes_are_refused() -> None:
    mla = ModelShape(
        "latent",
        2,
        64,
        4,
        4,
        128,
        32,
        mla=MlaSpec(kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8),
    )
    with pytest.raises(KvbenchError, match="latent attention"):
        roofline.work(mla, 1, 4, 2, dtype="fp32")
    with pytest.raises(KvbenchError, match="unknown dtype"):
        roofline.work(TINY, 1, 4, 2, dtype="fp64")
