"""Model shapes: bytes per token, parameter counts, presets and Hugging Face config.json files."""

import json

import pytest

from kvbench.errors import KvbenchError
from kvbench.models.hf_config import shape_from_config
from kvbench.models.resolve import resolve_model
from kvbench.models.shapes import MODEL_PRESETS, ModelShape, MoeSpec, preset_names


def test_llama_2_13b_fp16_bytes_per_token():
    # 2 (K and V) x 40 layers x 40 KV heads x 128 head_dim x 2 bytes
    assert resolve_model("llama-2-13b").bytes_per_token == 2 * 40 * 40 * 128 * 2 == 819_200


def test_gqa_bytes_per_token_use_kv_heads_not_hidden_size():
    assert resolve_model("llama-2-70b").bytes_per_token == 2 * 80 * 8 * 128 * 2 == 327_680
    assert resolve_model("llama-3-8b").bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert resolve_model("llama-2-7b").bytes_per_token == 2 * 32 * 32 * 128 * 2 == 524_288
    assert resolve_model("opt-13b").bytes_per_token == 819_200


def test_dtype_changes_bytes():
    assert resolve_model("llama-2-13b", "fp32").bytes_per_token == 1_638_400
    assert resolve_model("llama-2-13b", "bf16").bytes_per_token == 819_200
    shape = resolve_model("llama-2-7b", "fp32")
    assert shape.weight_bytes == 4 * shape.num_parameters
    with pytest.raises(KvbenchError, match="fp32, fp16, bf16"):
        resolve_model("llama-2-7b", "int3")


@pytest.mark.parametrize(
    "name, published, exact",
    [
        # published sizes, and the exact counts of the Hugging Face checkpoints
        ("llama-2-7b", 6.74e9, 6_738_415_616),
        ("llama-2-13b", 13.0e9, 13_015_864_320),
        ("llama-2-70b", 69.0e9, 68_976_648_192),
        ("llama-3-8b", 8.03e9, 8_030_261_248),
    ],
)
def test_parameter_counts(name, published, exact):
    count = resolve_model(name).num_parameters
    assert count == pytest.approx(published, rel=0.01)
    assert count == exact


def test_opt_13b_parameter_count():
    assert resolve_model("opt-13b").num_parameters == pytest.approx(12.85e9, rel=0.01)


def test_small_shapes_count_like_transformers():
    # Checked once against transformers' LlamaForCausalLM / OPTForCausalLM built from the same config.
    llama = ModelShape(
        "l", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128, vocab_size=100
    )
    # per layer: q 64x64 + k,v 2x64x32 + o 64x64 + MLP 3x64x128 + 2 norms x64 = 36,992;
    # x2 layers + embed 6,400 + lm_head 6,400 + final norm 64
    assert llama.head_dim == 16
    assert llama.num_parameters == 2 * 36_992 + 6_400 + 6_400 + 64 == 86_848
    opt = ModelShape(
        "o", 2, 64, 4, 4, 128, 100, max_position_embeddings=32, architecture="opt", tie_word_embeddings=True
    )
    assert opt.num_parameters == 75_648


def test_presets_and_tiny():
    assert preset_names() == list(MODEL_PRESETS)
    assert {"tiny", "llama-2-7b", "llama-2-13b", "llama-2-70b", "llama-3-8b", "opt-13b"} <= set(preset_names())
    tiny = resolve_model("tiny")
    assert tiny.dtype == "fp32" and tiny.num_kv_heads < tiny.num_heads
    assert resolve_model("llama-2-70b").num_kv_heads == 8


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(KvbenchError) as caught:
        resolve_model("llama-9-1t")
    message = str(caught.value)
    assert "llama-9-1t" in message and all(name in message for name in preset_names())


def test_to_dict_carries_derived_numbers():
    data = resolve_model("llama-2-13b").to_dict()
    assert data["bytes_per_token"] == 819_200 and data["num_parameters"] == 13_015_864_320
    assert data["weight_bytes"] == 2 * 13_015_864_320 and "extra" not in data
    json.dumps(data)


LLAMA_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "_name_or_path": "my-llama",
    "hidden_size": 256,
    "intermediate_size": 688,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 1000,
    "max_position_embeddings": 2048,
    "rope_theta": 500000.0,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "eos_token_id": [2, 3],
}


def test_llama_config_json_from_a_directory_or_the_file(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(LLAMA_CONFIG))
    for spec in (tmp_path, tmp_path / "config.json"):
        shape = resolve_model(str(spec))
        assert shape.name == "my-llama"
        assert (shape.num_layers, shape.hidden_size, shape.num_heads, shape.num_kv_heads) == (4, 256, 8, 2)
        assert shape.head_dim == 32 and shape.dtype == "bf16" and shape.rope_theta == 500000.0
        assert shape.eos_token_id == 2
        assert shape.bytes_per_token == 2 * 4 * 2 * 32 * 2
    assert resolve_model(str(tmp_path), "fp32").bytes_per_token == 2 * 4 * 2 * 32 * 4


def test_config_with_explicit_head_dim_and_no_kv_heads(tmp_path):
    config = dict(LLAMA_CONFIG, head_dim=64)
    del config["num_key_value_heads"]
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = shape_from_config(tmp_path)
    assert shape.num_kv_heads == 8 and shape.head_dim == 64
    assert shape.bytes_per_token == 2 * 4 * 8 * 64 * 2


def test_opt_config(tmp_path):
    config = {
        "model_type": "opt",
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "ffn_dim": 128,
        "vocab_size": 100,
        "max_position_embeddings": 32,
        "torch_dtype": "float16",
        "word_embed_proj_dim": 64,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = shape_from_config(tmp_path)
    assert shape.architecture == "opt" and shape.num_kv_heads == 4 and shape.num_parameters == 75_648


@pytest.mark.parametrize(
    "text, message",
    [
        ("{not json", "malformed config"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({k: v for k, v in LLAMA_CONFIG.items() if k != "vocab_size"}), "missing field 'vocab_size'"),
        (json.dumps(dict(LLAMA_CONFIG, num_hidden_layers=0)), "num_hidden_layers must be a positive integer"),
        (json.dumps(dict(LLAMA_CONFIG, num_hidden_layers=4.5)), "num_hidden_layers must be a positive integer"),
        (json.dumps(dict(LLAMA_CONFIG, hidden_size="big")), "hidden_size must be a positive integer"),
        (json.dumps(dict(LLAMA_CONFIG, num_key_value_heads=3)), "not a multiple of num_key_value_heads"),
        (json.dumps(dict(LLAMA_CONFIG, head_dim=-32)), "head_dim must be a positive integer"),
        (json.dumps(dict(LLAMA_CONFIG, head_dim="x")), "head_dim must be a positive integer"),
        (json.dumps(dict(LLAMA_CONFIG, rope_theta="fast")), "rope_theta must be a positive number"),
        (json.dumps(dict(LLAMA_CONFIG, torch_dtype=["a"])), "torch_dtype must be a string"),
    ],
)
def test_malformed_configs_give_one_line_errors(tmp_path, text, message):
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(KvbenchError, match=message) as caught:
        resolve_model(str(tmp_path))
    assert "\n" not in str(caught.value)


def test_directory_without_config(tmp_path):
    with pytest.raises(KvbenchError, match="no config.json"):
        resolve_model(str(tmp_path))


def test_bad_shapes_are_refused():
    with pytest.raises(KvbenchError, match="hidden_size is not a multiple"):
        ModelShape("x", 2, 65, 4, 4, 128, 100)
    with pytest.raises(KvbenchError, match="unknown dtype"):
        ModelShape("x", 2, 64, 4, 4, 128, 100, dtype="fp8")
    with pytest.raises(KvbenchError, match="max_position_embeddings must be a positive integer"):
        ModelShape("x", 2, 64, 4, 4, 128, 100, max_position_embeddings=0)
    with pytest.raises(KvbenchError, match="head_dim 7 is odd"):
        ModelShape("x", 2, 28, 4, 4, 128, 100)
    with pytest.raises(KvbenchError, match="rope_theta must be a positive number"):
        ModelShape("x", 2, 64, 4, 4, 128, 100, rope_theta=float("nan"))
    with pytest.raises(KvbenchError, match="unsupported rope scaling type 'ntk'"):
        ModelShape("x", 2, 64, 4, 4, 128, 100, rope_scaling={"type": "ntk", "factor": 2.0})
    with pytest.raises(KvbenchError, match="experts per token but only"):
        ModelShape("x", 2, 64, 4, 4, 128, 100, moe=MoeSpec(4, 5, 32, 2))
    with pytest.raises(KvbenchError, match="3 MoE layers but only 2"):
        ModelShape("x", 2, 64, 4, 4, 128, 100, moe=MoeSpec(4, 2, 32, 3))
    with pytest.raises(KvbenchError, match="llama architecture only"):
        ModelShape("x", 2, 64, 4, 4, 128, 100, architecture="opt", moe=MoeSpec(4, 2, 32, 2))
    opt = ModelShape("x", 2, 64, 4, 4, 128, 100, architecture="opt", head_dim=7)  # no rotary: any head_dim
    assert opt.head_dim == 7


def test_transformers_5_rope_parameters_are_read(tmp_path):
    """transformers >= 5 saves rope settings under rope_parameters, without rope_theta/rope_scaling."""
    import json

    from kvbench.models.hf_config import shape_from_config

    config = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 100,
        "max_position_embeddings": 256,
        "rope_parameters": {
            "rope_theta": 500000.0,
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = shape_from_config(tmp_path)
    assert shape.rope_theta == 500000.0
    assert shape.rope_scaling == {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    config["rope_parameters"] = {"rope_theta": 10000.0, "rope_type": "default"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    assert shape_from_config(tmp_path).rope_scaling is None


# ------------------------------------------------------------------------------------------------ KV arithmetic
# Each figure below is written out by hand: values per token and layer x layers x bytes.


def _config(tmp_path, **fields):
    base = {
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 32768,
        "torch_dtype": "bfloat16",
    }
    (tmp_path / "config.json").write_text(json.dumps({**base, **fields}))
    return shape_from_config(tmp_path)


def test_explicit_head_dim_sets_the_kv_width(tmp_path):
    # Mistral-Nemo: hidden 5120 over 32 heads would be 160, but head_dim is 128
    shape = _config(
        tmp_path, model_type="mistral", hidden_size=5120, num_hidden_layers=40, head_dim=128, sliding_window=None
    )
    assert shape.head_dim == 128
    assert shape.bytes_per_token == 2 * 40 * 8 * 128 * 2 == 163_840


def test_multi_query_attention_caches_one_head(tmp_path):
    shape = _config(tmp_path, num_key_value_heads=1)
    assert shape.bytes_per_token == 2 * 32 * 1 * 128 * 2 == 16_384
    assert shape.kv_bytes(1000) == 1000 * 16_384


def test_mistral_sliding_window_stops_growing_at_the_window(tmp_path):
    # Mistral-7B-v0.1: every layer attends to the last 4,096 tokens
    shape = _config(tmp_path, model_type="mistral", sliding_window=4096)
    per_token_layer = 2 * 8 * 128 * 2
    assert shape.sliding_layers == tuple(range(32)) and shape.sliding_window == 4096
    assert shape.kv_bytes(1000) == 32 * 1000 * per_token_layer
    assert shape.kv_bytes(10_000) == shape.kv_bytes(4096) == 32 * 4096 * per_token_layer
    assert shape.bytes_per_token == 32 * per_token_layer  # the growing figure counts every layer


def test_gemma_2_alternates_windowed_and_global_layers(tmp_path):
    # Gemma-2-9B: 42 layers, the even ones (from layer 0) windowed at 4,096 tokens; 8 KV heads of 256
    shape = _config(
        tmp_path,
        model_type="gemma2",
        hidden_size=3584,
        num_hidden_layers=42,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=256,
        sliding_window=4096,
        max_position_embeddings=8192,
    )
    per_token_layer = 2 * 8 * 256 * 2
    assert shape.sliding_layers == tuple(range(0, 42, 2))
    assert shape.kv_bytes(8192) == (21 * 8192 + 21 * 4096) * per_token_layer


def test_gemma_3_keeps_one_global_layer_in_six(tmp_path):
    # Gemma-3-27B: 62 layers, sliding_window_pattern 6 (transformers' default): layers 5, 11, ..., 59 global
    shape = _config(
        tmp_path,
        model_type="gemma3_text",
        hidden_size=5376,
        num_hidden_layers=62,
        num_attention_heads=32,
        num_key_value_heads=16,
        head_dim=128,
        sliding_window=1024,
        max_position_embeddings=131072,
    )
    global_layers = [i for i in range(62) if i not in shape.sliding_layers]
    assert global_layers == [5, 11, 17, 23, 29, 35, 41, 47, 53, 59]
    assert shape.kv_bytes(32768) == (10 * 32768 + 52 * 1024) * (2 * 16 * 128 * 2)
    assert shape.tie_word_embeddings and shape.qk_norm and shape.norms_per_layer == 4


def test_layer_types_name_the_windowed_layers(tmp_path):
    # gpt-oss: layer_types alternates sliding_attention (window 128) and full_attention
    shape = _config(
        tmp_path,
        model_type="gpt_oss",
        hidden_size=2880,
        intermediate_size=2880,
        num_hidden_layers=4,
        num_attention_heads=64,
        head_dim=64,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=128,
        layer_types=["sliding_attention", "full_attention"] * 2,
    )
    assert shape.sliding_layers == (0, 2) and shape.attention_sinks and shape.o_bias and shape.qkv_bias
    assert shape.kv_bytes(1000) == (2 * 1000 + 2 * 128) * (2 * 8 * 64 * 2)
    with pytest.raises(KvbenchError, match="layer_types: unsupported attention type 'linear_attention'"):
        _config(tmp_path, layer_types=["linear_attention"] * 32)
    with pytest.raises(KvbenchError, match="layer_types must list one entry for each of the 32 layers"):
        _config(tmp_path, layer_types=["full_attention"])


def test_qwen_windows_only_with_use_sliding_window(tmp_path):
    assert _config(tmp_path, model_type="qwen2", sliding_window=4096).sliding_layers == ()
    shape = _config(tmp_path, model_type="qwen2", sliding_window=4096, use_sliding_window=True, max_window_layers=28)
    assert shape.sliding_layers == (28, 29, 30, 31)


def test_a_window_past_the_context_is_no_window(tmp_path):
    assert _config(tmp_path, model_type="mistral", sliding_window=32768).sliding_layers == ()


def test_multi_head_latent_attention_caches_the_latent_and_the_rotary_key(tmp_path):
    # DeepSeek-V3: per token and layer kv_lora_rank 512 + qk_rope_head_dim 64 values, not 2 x 128 heads x 192
    shape = _config(
        tmp_path,
        model_type="deepseek_v3",
        hidden_size=7168,
        num_hidden_layers=61,
        num_attention_heads=128,
        num_key_value_heads=128,
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        qk_nope_head_dim=128,
        v_head_dim=128,
        q_lora_rank=1536,
        intermediate_size=18432,
        n_routed_experts=256,
        num_experts_per_tok=8,
        moe_intermediate_size=2048,
        n_shared_experts=1,
        first_k_dense_replace=3,
        vocab_size=129280,
    )
    assert shape.bytes_per_token == 61 * (512 + 64) * 2 == 70_272
    assert shape.with_kv_dtype("fp8").bytes_per_token == 61 * 576 * 1
    assert shape.kv_bytes(1000) == 1000 * 70_272
    assert shape.moe.num_moe_layers == 58 and shape.moe_layer_indices() == tuple(range(3, 61))


def test_kv_cache_dtype_sets_the_value_bytes():
    shape = resolve_model("llama-2-70b")
    assert shape.with_kv_dtype("fp8").bytes_per_token == 2 * 80 * 8 * 128 * 1
    assert shape.with_kv_dtype("fp8_e5m2").bytes_per_token == shape.with_kv_dtype("int8").bytes_per_token
    assert shape.with_kv_dtype("auto").bytes_per_token == 327_680
    assert shape.with_kv_dtype("fp8").weight_bytes == shape.weight_bytes  # weights keep their dtype
    with pytest.raises(KvbenchError, match="unknown KV cache dtype 'fp4'"):
        shape.with_kv_dtype("fp4")


def test_moe_weights_count_every_expert():
    # 2 layers of 4 experts (top-1) of width 32 on hidden 64: each expert 3 x 64 x 32 = 6,144
    moe = ModelShape("m", 2, 64, 4, 2, 96, 100, moe=MoeSpec(4, 1, 32, 2))
    dense = ModelShape("d", 2, 64, 4, 2, 96, 100)
    dense_mlp = 3 * 64 * 96
    assert moe.num_parameters - dense.num_parameters == 2 * (4 * 6_144 + 4 * 64 - dense_mlp)
    assert moe.num_parameters - moe.active_parameters == 2 * 3 * 6_144
    assert moe.weight_bytes == 2 * moe.num_parameters


def test_kimi_k2_is_latent_attention_with_one_dense_layer(tmp_path):
    # moonshotai/Kimi-K2-Instruct: DeepSeek-V3's attention with 64 heads, 384 experts, the first layer dense
    shape = _config(
        tmp_path,
        model_type="kimi_k2",
        architectures=["DeepseekV3ForCausalLM"],
        hidden_size=7168,
        intermediate_size=18432,
        num_hidden_layers=61,
        num_attention_heads=64,
        num_key_value_heads=64,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope_head_dim=128,
        qk_rope_head_dim=64,
        v_head_dim=128,
        n_routed_experts=384,
        n_shared_experts=1,
        num_experts_per_tok=8,
        moe_intermediate_size=2048,
        first_k_dense_replace=1,
        vocab_size=163840,
        max_position_embeddings=131072,
    )
    assert shape.bytes_per_token == 61 * (512 + 64) * 2 == 70_272  # the heads do not enter the cache
    assert shape.moe_layer_indices() == tuple(range(1, 61)) and shape.moe.num_experts == 384
    # published: "1 trillion total parameters, 32 billion activated" (without the input embedding)
    assert round(shape.num_parameters / 1e12, 2) == 1.03
    assert round((shape.active_parameters - 163840 * 7168) / 1e9) == 32
