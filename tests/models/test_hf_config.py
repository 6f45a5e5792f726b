"""The config.json reader: architectures it costs (mixture of experts included), and one-line errors for bad fields."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from kvbench.errors import KvbenchError
from kvbench.models.gpus import kv_budget, resolve_gpu
from kvbench.models.hf_config import SHAPE_ARCHITECTURES, shape_from_config
from kvbench.models.resolve import resolve_model

# Mixtral-8x7B as published (config.json of mistralai/Mixtral-8x7B-v0.1).
MIXTRAL_8X7B = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "tie_word_embeddings": False,
    "rope_theta": 1e6,
    "rms_norm_eps": 1e-5,
    "torch_dtype": "bfloat16",
    "sliding_window": None,
}
# Qwen1.5-MoE-A2.7B: 60 routed experts (top-4) and a shared expert in every layer.
QWEN_MOE_A2_7B = {
    "model_type": "qwen2_moe",
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "moe_intermediate_size": 1408,
    "shared_expert_intermediate_size": 5632,
    "num_hidden_layers": 24,
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "vocab_size": 151936,
    "max_position_embeddings": 8192,
    "num_experts": 60,
    "num_experts_per_tok": 4,
    "decoder_sparse_step": 1,
    "tie_word_embeddings": False,
    "rope_theta": 1e6,
}


def write(directory: Path, config: dict) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_mixtral_8x7b_counts_every_expert_and_does_not_fit_an_80g_gpu(tmp_path: Path) -> None:
    shape = resolve_model(str(write(tmp_path, MIXTRAL_8X7B)), "fp16")
    assert shape.moe is not None and (shape.moe.num_experts, shape.moe.experts_per_token) == (8, 2)
    # per layer: attention 41.9 M + 8 experts x 176.2 M + router 32,768 + norms; embeddings and LM head 262 M
    assert shape.num_parameters == 46_702_792_704
    assert shape.num_parameters == pytest.approx(46.7e9, rel=0.005)
    assert shape.active_parameters == pytest.approx(12.9e9, rel=0.005)  # 2 of 8 experts per token
    assert shape.weight_bytes == 2 * shape.num_parameters
    assert shape.bytes_per_token == 2 * 32 * 8 * 128 * 2  # GQA: the experts do not change the KV cache
    assert not kv_budget(shape, resolve_gpu("a100-80g")).fits
    assert not kv_budget(shape, resolve_gpu("h100-80g")).fits
    assert kv_budget(shape, resolve_gpu("h200-141g")).fits
    data = shape.to_dict()
    assert data["moe"]["num_experts"] == 8 and data["active_parameters"] == shape.active_parameters


def test_qwen_moe_counts_routed_and_shared_experts(tmp_path: Path) -> None:
    shape = resolve_model(str(write(tmp_path, QWEN_MOE_A2_7B)))
    assert shape.num_parameters == pytest.approx(14.3e9, rel=0.005)  # published: 14.3 B total, 2.7 B active
    assert shape.active_parameters == pytest.approx(2.7e9, rel=0.01)
    assert shape.qkv_bias and not shape.o_bias


MLA_SMALL = {
    "kv_lora_rank": 32,
    "q_lora_rank": 24,
    "qk_rope_head_dim": 8,
    "qk_nope_head_dim": 16,
    "v_head_dim": 16,
    "n_routed_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 24,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "num_key_value_heads": 4,
}
SMALL = {
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 128,
}


def _transformers_model(model_type: str, **overrides):
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(model_type, **{**SMALL, **overrides})
    return config, AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize(
    "model_type, overrides",
    [
        ("llama", {}),
        ("llama", {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True}),
        ("mistral", {"head_dim": 32}),
        ("qwen2", {}),
        ("mixtral", {"num_local_experts": 4, "num_experts_per_tok": 2}),
        (
            "qwen2_moe",
            {
                "num_experts": 6,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 48,
                "mlp_only_layers": [1],
            },
        ),
        (
            "qwen2_moe",
            {
                "num_experts": 6,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "shared_expert_intermediate_size": 48,
                "decoder_sparse_step": 2,
            },
        ),
        ("qwen3", {"head_dim": 32}),
        ("qwen3_moe", {"num_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32}),
        ("gemma", {"head_dim": 16}),
        ("gemma2", {"head_dim": 16}),
        ("gemma3_text", {"head_dim": 16}),
        ("gpt_oss", {"head_dim": 16, "num_local_experts": 4, "num_experts_per_tok": 2}),
        ("deepseek_v2", {**MLA_SMALL, "q_lora_rank": None, "n_shared_experts": 2}),
        ("deepseek_v2", MLA_SMALL),
        ("deepseek_v3", {**MLA_SMALL, "n_group": 1, "topk_group": 1}),
    ],
)
def test_parameter_counts_equal_transformers(tmp_path: Path, model_type: str, overrides: dict) -> None:
    """The independent count: what transformers builds from the same config (its state dict, which holds
    DeepSeek-V3's router bias as a buffer; tied embeddings counted once)."""
    config, model = _transformers_model(model_type, **overrides)
    shape = shape_from_config(write(tmp_path, json.loads(config.to_json_string())))
    stored = {
        name: tensor
        for name, tensor in model.state_dict().items()
        if not (config.tie_word_embeddings and name == "lm_head.weight")
    }
    assert shape.num_parameters == sum(t.numel() for t in stored.values())


def test_model_type_from_the_architecture_class(tmp_path: Path) -> None:
    config = {k: v for k, v in MIXTRAL_8X7B.items() if k != "model_type"}
    assert resolve_model(str(write(tmp_path, config))).moe is not None


def test_dense_to_dict_keeps_its_keys() -> None:
    data = resolve_model("llama-2-13b").to_dict()
    assert not {"moe", "active_parameters", "qkv_bias", "o_bias", "mlp_bias"} & set(data)


def test_unsupported_architecture_names_what_the_reader_understands(tmp_path: Path) -> None:
    gpt2 = {
        "model_type": "gpt2",
        "architectures": ["GPT2LMHeadModel"],
        "n_embd": 768,
        "n_head": 12,
        "n_layer": 12,
        "vocab_size": 50257,
        "n_positions": 1024,
    }
    with pytest.raises(KvbenchError) as caught:
        resolve_model(str(write(tmp_path, gpt2)))
    message = str(caught.value)
    assert message.startswith("unsupported architecture 'gpt2' in ") and str(tmp_path) in message
    assert message.endswith("the shape reader understands: " + ", ".join(SHAPE_ARCHITECTURES))
    assert "num_attention_heads" not in message
    assert SHAPE_ARCHITECTURES == (
        "llama",
        "mistral",
        "mixtral",
        "qwen2",
        "qwen2_moe",
        "qwen3",
        "qwen3_moe",
        "gemma",
        "gemma2",
        "gemma3_text",
        "gpt_oss",
        "deepseek_v2",
        "deepseek_v3",
        "kimi_k2",
        "opt",
    )


def test_opt_with_a_projected_embedding_is_refused(tmp_path: Path) -> None:
    opt = {
        "model_type": "opt",
        "hidden_size": 1024,
        "word_embed_proj_dim": 512,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "ffn_dim": 4096,
        "vocab_size": 50272,
        "max_position_embeddings": 2048,
    }
    with pytest.raises(KvbenchError, match="word_embed_proj_dim .512. differs from hidden_size"):
        resolve_model(str(write(tmp_path, opt)))


@pytest.mark.parametrize(
    "scaling, max_pos, expected",
    [
        (None, 4096, 4096),
        ({"rope_type": "linear", "factor": 4.0}, 16384, 16384),  # linear configs give the extended length
        ({"rope_type": "dynamic", "factor": 2.0}, 4096, 8192),  # dynamic NTK stretches past it
        ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}, 32768, 131072),
        (
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 8192,
            },
            131072,
            131072,
        ),
    ],
)
def test_context_length_follows_rope_scaling(tmp_path: Path, scaling, max_pos: int, expected: int) -> None:
    config = dict(SMALL, model_type="llama", max_position_embeddings=max_pos, rope_scaling=scaling)
    assert resolve_model(str(write(tmp_path, config))).context_length == expected


# ---------------------------------------------------------------------------------------------- malformed configs
# Every case through both readers: the shape reader (waste, capacity, simulation) and the tensor engine's
# checkpoint loader, on a directory that also holds valid weights, so the config is what is refused.

NAN = float("nan")
DROP = object()
MALFORMED = [
    ("rope_scaling", "linear", "rope_scaling must be a JSON object"),
    ("rope_scaling", {"type": "su", "factor": 2.0}, "unsupported rope scaling type 'su' in rope_scaling"),
    ("rope_scaling", {"type": "longrope", "factor": 2.0}, "unsupported rope scaling type 'longrope'"),
    ("rope_scaling", {"type": "linear", "factor": 0}, "rope_scaling.factor must be a positive number, got 0"),
    ("rope_scaling", {"type": "dynamic", "factor": -2.0}, "rope_scaling.factor must be a positive number"),
    ("rope_scaling", {"type": "linear", "factor": NAN}, "rope_scaling.factor must be a positive number, got nan"),
    ("rope_scaling", {"type": "linear"}, "rope scaling 'linear' needs factor"),
    (
        "rope_scaling",
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0},
        "high_freq_factor .4.0. must exceed low_freq_factor",
    ),
    ("rope_scaling", {"rope_type": "yarn", "factor": 4.0, "beta_fast": 0}, "rope_scaling.beta_fast must be a positive"),
    (
        "rope_scaling",
        {"rope_type": "yarn", "original_max_position_embeddings": -64},
        "original_max_position_embeddings must be a positive integer",
    ),
    ("rope_parameters", "yarn", "rope_parameters must be a JSON object"),
    ("head_dim", 7, "head_dim 7 is odd: rotary embeddings need an even head_dim"),
    ("head_dim", 0, "head_dim must be a positive integer, got 0"),
    ("num_hidden_layers", -1, "num_hidden_layers must be a positive integer, got -1"),
    ("hidden_size", 0, "hidden_size must be a positive integer, got 0"),
    ("intermediate_size", NAN, "intermediate_size must be a positive integer, got nan"),
    ("num_attention_heads", True, "num_attention_heads must be a positive integer, got True"),
    ("num_key_value_heads", 0, "num_key_value_heads must be a positive integer, got 0"),
    ("vocab_size", 64.0, "vocab_size must be a positive integer, got 64.0"),
    ("rope_theta", NAN, "rope_theta must be a positive number, got nan"),
    ("rope_theta", 0, "rope_theta must be a positive number, got 0"),
    ("rope_theta", -10000.0, "rope_theta must be a positive number"),
    ("rope_theta", True, "rope_theta must be a positive number, got True"),
    ("rms_norm_eps", -1e-6, "rms_norm_eps must be a positive number"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings must be true or false"),
    ("max_position_embeddings", 0, "max_position_embeddings must be a positive integer, got 0"),
    ("max_position_embeddings", -4096, "max_position_embeddings must be a positive integer"),
]
_IDS = [f"{field}={value!r}" for field, value, _ in MALFORMED]


def _malformed_config(base: dict, field: str, value) -> dict:
    config = {k: v for k, v in base.items() if k != field}
    if value is not DROP:
        config[field] = value
    if field == "rope_scaling":
        config.pop("rope_parameters", None)
    return config


def _check_one_line(caught: pytest.ExceptionInfo, directory: Path, field: str, message: str) -> None:
    text = str(caught.value)
    assert "\n" not in text
    assert f"malformed config {directory / 'config.json'}: " in text
    assert field.split(".")[0] in text
    assert re.search(message, text), text


@pytest.mark.parametrize("field, value, message", MALFORMED, ids=_IDS)
def test_malformed_config_through_the_shape_reader(tmp_path: Path, field: str, value, message: str) -> None:
    base = dict(SMALL, model_type="llama", rope_theta=10000.0)
    write(tmp_path, _malformed_config(base, field, value))
    with pytest.raises(KvbenchError) as caught:
        resolve_model(str(tmp_path))
    _check_one_line(caught, tmp_path, field, message)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    """A tiny valid Llama checkpoint: its config (as a dict) and the folder with its safetensors weights."""
    from kvbench.models.hf_model import build_random_model, llama_config_from_shape
    from kvbench.models.shapes import ModelShape

    shape = ModelShape(
        "small",
        num_layers=1,
        hidden_size=32,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=48,
        vocab_size=64,
        max_position_embeddings=128,
        dtype="fp32",
    )
    folder = tmp_path_factory.mktemp("checkpoint")
    build_random_model(shape).save_pretrained(folder, safe_serialization=True)
    return folder, json.loads(llama_config_from_shape(shape).to_json_string())


@pytest.mark.parametrize("field, value, message", MALFORMED, ids=_IDS)
def test_malformed_config_through_the_engine_loader(
    tmp_path: Path, checkpoint, field: str, value, message: str
) -> None:
    from kvbench.models.hf_model import load_local_model
    from kvbench.studies.local_model import load_model

    folder, config = checkpoint
    for weights in folder.glob("*.safetensors"):
        shutil.copy(weights, tmp_path / weights.name)
    write(tmp_path, _malformed_config(config, field, value))
    with pytest.raises(KvbenchError) as caught:
        load_model(str(tmp_path), device="cpu")
    _check_one_line(caught, tmp_path, field, message)
    with pytest.raises(KvbenchError) as caught:
        load_local_model(tmp_path, "cpu")
    _check_one_line(caught, tmp_path, field, message)


def test_the_valid_checkpoint_loads(tmp_path: Path, checkpoint) -> None:
    from kvbench.studies.local_model import load_model

    folder, config = checkpoint
    for weights in folder.glob("*.safetensors"):
        shutil.copy(weights, tmp_path / weights.name)
    write(tmp_path, config)
    assert load_model(str(tmp_path), device="cpu").shape.num_layers == 1


def test_a_config_without_max_position_embeddings_gets_the_transformers_default(tmp_path: Path) -> None:
    config = {k: v for k, v in SMALL.items() if k != "max_position_embeddings"}
    write(tmp_path, dict(config, model_type="llama"))
    assert resolve_model(str(tmp_path)).max_position_embeddings == 2048
