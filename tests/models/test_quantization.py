"""Quantized weights: each format's bytes for one matrix written out by hand, which roles stay in the model's dtype,
and whole models from their quantization_config."""

from __future__ import annotations

import json

import pytest

from kvbench.errors import KvbenchError
from kvbench.models.hf_config import shape_from_config
from kvbench.models.quantization import format_from_config, roles_of_modules
from kvbench.models.weights import WeightGroup, vector

# an MLP up projection of Llama-2-7B: 11,008 outputs x 4,096 inputs
UP = WeightGroup("mlp", 11008, 4096)
NUMEL = 11008 * 4096


def nbytes(config: dict, group: WeightGroup = UP, dtype_bytes: int = 2) -> int:
    return format_from_config(config).group_bytes(group, dtype_bytes)


def test_awq_4bit_group_128():
    # packed weights in x out / 2; per group of 128 inputs and per output: an fp16 scale and a 4-bit zero
    groups = 4096 // 128
    expected = NUMEL // 2 + groups * 11008 * 2 + groups * 11008 // 2
    assert nbytes({"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True}) == expected == 23_425_024


def test_gptq_4bit_adds_the_group_index():
    groups = 4096 // 128
    expected = NUMEL // 2 + groups * 11008 * 2 + groups * 11008 // 2 + 4096 * 4
    assert nbytes({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False}) == expected
    # group_size -1: one scale and zero per output channel
    assert nbytes({"quant_method": "gptq", "bits": 8, "group_size": -1}) == NUMEL + 11008 * 2 + 11008 + 4096 * 4


def test_fp8_block_and_tensor_scales():
    block = {"quant_method": "fp8", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    # a DeepSeek-V3 expert's up projection: 2,048 x 7,168, float32 scale per 128 x 128 block
    expert = WeightGroup("expert", 2048, 7168, count=3)
    assert nbytes(block, expert) == 3 * (2048 * 7168 + 16 * 56 * 4)
    assert nbytes({"quant_method": "fp8"}) == NUMEL + 4
    assert nbytes({"quant_method": "fp8", "activation_scheme": "static"}) == NUMEL + 8


def test_bitsandbytes_4bit_and_8bit():
    blocks = NUMEL // 64
    assert (
        nbytes({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"})
        == NUMEL // 2 + blocks * 4
    )
    double = {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True}
    assert nbytes(double) == NUMEL // 2 + blocks + -(-blocks // 256) * 4
    assert nbytes({"quant_method": "bitsandbytes", "_load_in_8bit": True}) == NUMEL + 11008 * 4


def test_mxfp4_is_four_and_a_quarter_bits():
    assert nbytes({"quant_method": "mxfp4"}) == NUMEL // 2 + NUMEL // 32 == NUMEL * 17 // 32


def test_compressed_tensors_fp8_per_channel():
    config = {
        "quant_method": "compressed-tensors",
        "format": "float-quantized",
        "ignore": ["lm_head"],
        "config_groups": {
            "group_0": {
                "targets": ["Linear"],
                "weights": {"num_bits": 8, "type": "float", "strategy": "channel", "symmetric": True},
            }
        },
    }
    assert nbytes(config) == NUMEL + 11008 * 2
    w4 = json.loads(json.dumps(config))
    w4["config_groups"]["group_0"]["weights"] = {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 128}
    assert nbytes(w4) == NUMEL // 2 + 11008 * 32 * 2


def test_what_is_never_quantized():
    awq = format_from_config({"quant_method": "awq", "bits": 4, "group_size": 128})
    for group in (
        WeightGroup("embed", 32000, 4096),
        WeightGroup("lm_head", 32000, 4096),
        WeightGroup("router", 8, 4096),
        vector("norm", 4096, 2),
        vector("bias", 4096),
    ):
        assert awq.group_bytes(group, 2) == group.parameters * 2


def test_modules_not_converted_become_roles():
    assert roles_of_modules(
        ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]
    ) == {"attn_q", "attn_kv", "attn_o", "mla_down", "mla_up", "router", "embed", "lm_head"}
    assert roles_of_modules(["gate", "re:.*shared_expert.*", "visual"]) == {"router", "shared_expert", "vision"}
    gpt_oss = format_from_config({"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]})
    assert gpt_oss.group_bytes(WeightGroup("attn_q", 4096, 2880), 2) == 4096 * 2880 * 2
    assert gpt_oss.group_bytes(WeightGroup("expert", 2880, 2880, 8), 2) == 8 * 2880 * 2880 * 17 // 32


@pytest.mark.parametrize(
    "config, message",
    [
        ({"quant_method": "hqq"}, "unsupported quantization_config.quant_method 'hqq'"),
        ({"quant_method": "awq", "bits": 3}, "quantization_config.bits must be one of 4, 8"),
        ({"quant_method": "gptq", "bits": 4, "group_size": 0}, "group_size must be a positive integer or -1"),
        ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size must be two positive integers"),
        ({"quant_method": "bitsandbytes"}, "without load_in_4bit or load_in_8bit"),
        ({"quant_method": "compressed-tensors", "config_groups": {}}, "one quantization group"),
        ([1], "quantization_config must be a JSON object"),
    ],
)
def test_bad_quantization_configs_are_refused(config, message):
    with pytest.raises(KvbenchError, match=message):
        format_from_config(config)


def test_an_awq_checkpoint_by_hand(tmp_path):
    # Llama shape, 2 layers, hidden 256, MLP 512, 4 heads of 64 (2 KV heads), vocab 1,000, fp16; AWQ 4-bit g128
    config = {
        "model_type": "llama",
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "vocab_size": 1000,
        "torch_dtype": "float16",
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = shape_from_config(tmp_path)

    def awq(out: int, inp: int) -> int:
        groups = inp // 128
        return out * inp // 2 + groups * out * 2 + groups * out // 2

    per_layer = awq(256, 256) + 2 * awq(128, 256) + awq(256, 256) + 2 * awq(512, 256) + awq(256, 512) + 2 * 256 * 2
    outer = 2 * 1000 * 256 * 2 + 256 * 2  # embeddings and LM head in fp16, the final norm
    assert shape.weight_bytes == 2 * per_layer + outer
    assert shape.to_dict()["weight_format"]["description"] == "AWQ 4-bit, group 128"
