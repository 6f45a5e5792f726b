"""Rotary embeddings: our inverse frequencies and cos/sin equal transformers' for every supported scaling."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

from kvbench.errors import KvbenchError
from kvbench.models.rope import (
    RotaryEmbedding,
    apply_rotary,
    compute_inv_freq,
    rope_config,
    rope_config_from_hf,
)

HEAD_DIM = 16
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 2.5},
    "dynamic": {"rope_type": "dynamic", "factor": 3.0},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512,
    },
    "yarn": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    "yarn-mscale": {
        "rope_type": "yarn",
        "factor": 4.0,
        "original_max_position_embeddings": 64,
        "mscale": 0.7,
        "mscale_all_dim": 1.0,
        "beta_fast": 16,
        "beta_slow": 2,
    },
}


def hf_config(scaling: dict | None, max_pos: int = 64, theta: float = 10000.0) -> LlamaConfig:
    rope = {"rope_type": "default", **(scaling or {}), "rope_theta": theta}
    return LlamaConfig(
        hidden_size=HEAD_DIM * 4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=64,
        num_hidden_layers=1,
        vocab_size=32,
        max_position_embeddings=max_pos,
        rope_parameters=rope,
    )


@pytest.mark.parametrize("name", list(SCALINGS))
def test_cos_sin_match_transformers(name: str) -> None:
    config = hf_config(SCALINGS[name])
    hf_rope = LlamaRotaryEmbedding(config)
    ours = RotaryEmbedding(rope_config_from_hf(config))
    positions = torch.arange(60)
    ref_cos, ref_sin = hf_rope(torch.zeros(1, dtype=torch.float32), positions[None])
    cos, sin = ours.cos_sin(positions, max_position=59, seq_lens=torch.full((60,), 60))
    torch.testing.assert_close(cos, ref_cos[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(sin, ref_sin[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", ["llama3", "yarn", "yarn-mscale"])
def test_scaled_inv_freq_differs_from_default(name: str) -> None:
    cfg = rope_config_from_hf(hf_config(SCALINGS[name]))
    base, _ = compute_inv_freq(rope_config(HEAD_DIM, 10000.0, 64, None))
    scaled, _ = compute_inv_freq(cfg)
    assert not torch.allclose(base, scaled)
    assert torch.equal(base[0], scaled[0])  # the highest frequency is kept by both


def test_dynamic_grows_with_the_sequence() -> None:
    """Past the pretraining length each request's own length sets the base; shorter ones use the table."""
    max_pos = 16
    config = hf_config(SCALINGS["dynamic"], max_pos=max_pos)
    ours = RotaryEmbedding(rope_config_from_hf(config))
    for seq_len in (10, 17, 40):
        hf_rope = LlamaRotaryEmbedding(config)
        positions = torch.arange(seq_len)
        ref_cos, ref_sin = hf_rope(torch.zeros(1), positions[None])
        cos, sin = ours.cos_sin(positions, seq_len - 1, torch.full((seq_len,), seq_len))
        torch.testing.assert_close(cos, ref_cos[0], rtol=0, atol=1e-6)
        torch.testing.assert_close(sin, ref_sin[0], rtol=0, atol=1e-6)
    # a batch mixing a long and a short request: the short one is unaffected by its neighbour
    positions = torch.cat((torch.arange(30), torch.arange(5)))
    lens = torch.cat((torch.full((30,), 30), torch.full((5,), 5)))
    cos, _ = ours.cos_sin(positions, 29, lens)
    short_cos, _ = ours.cos_sin(torch.arange(5), 4, torch.full((5,), 5))
    assert torch.equal(cos[30:], short_cos)


def test_table_grows_past_max_positions() -> None:
    ours = RotaryEmbedding(rope_config(HEAD_DIM, 10000.0, 8, None))
    cos, sin = ours.cos_sin(torch.tensor([3, 20]), 20)
    assert ours.table_len > 20
    inv_freq, _ = compute_inv_freq(ours.cfg)
    torch.testing.assert_close(cos[1], torch.cos(20.0 * inv_freq).repeat(2))
    torch.testing.assert_close(sin[1], torch.sin(20.0 * inv_freq).repeat(2))


def test_apply_rotary_matches_rotate_half() -> None:
    x = torch.randn(5, 3, HEAD_DIM, generator=torch.Generator().manual_seed(0))
    ours = RotaryEmbedding(rope_config(HEAD_DIM, 10000.0, 64, None))
    cos, sin = ours.cos_sin(torch.arange(5), 4)
    rotated_half = torch.cat((-x[..., HEAD_DIM // 2 :], x[..., : HEAD_DIM // 2]), -1)
    expected = x * cos[:, None] + rotated_half * sin[:, None]
    assert torch.equal(apply_rotary(x, *ours.rotation(torch.arange(5), 4)), expected)


def test_legacy_type_key_and_errors() -> None:
    assert rope_config(HEAD_DIM, 1e4, 64, {"type": "linear", "factor": 2.0}).rope_type == "linear"
    with pytest.raises(KvbenchError, match="unsupported rope scaling type 'longrope'"):
        rope_config(HEAD_DIM, 1e4, 64, {"rope_type": "longrope", "factor": 2.0})
    with pytest.raises(KvbenchError, match="needs factor"):
        rope_config(HEAD_DIM, 1e4, 64, {"rope_type": "linear"})
    with pytest.raises(KvbenchError, match="partial rotary"):
        rope_config(HEAD_DIM, 1e4, 64, {"rope_type": "default", "partial_rotary_factor": 0.5})
