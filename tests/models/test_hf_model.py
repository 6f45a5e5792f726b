"""Random Llama models from shapes, local safetensors checkpoints, devices and dtypes."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from kvbench.errors import KvbenchError
from kvbench.models.hf_model import (
    build_random_model,
    llama_config_from_shape,
    load_local_model,
    resolve_torch_device,
    resolve_torch_dtype,
)
from kvbench.models.runner import ModelRunner
from kvbench.models.shapes import MODEL_PRESETS, ModelShape

SMALL = ModelShape(
    "small",
    num_layers=1,
    hidden_size=32,
    num_heads=4,
    num_kv_heads=2,
    intermediate_size=48,
    vocab_size=64,
    max_position_embeddings=128,
    dtype="fp32",
    rope_theta=5000.0,
    rope_scaling={"type": "linear", "factor": 2.0},
    eos_token_id=3,
)


def test_config_carries_the_shape() -> None:
    config = llama_config_from_shape(SMALL)
    assert (config.num_hidden_layers, config.hidden_size, config.num_attention_heads) == (1, 32, 4)
    assert config.num_key_value_heads == 2 and config.head_dim == 8 and config.intermediate_size == 48
    assert config.rope_parameters["rope_type"] == "linear" and config.rope_parameters["factor"] == 2.0
    assert config.rope_parameters["rope_theta"] == 5000.0
    assert config.eos_token_id == 3 and not config.tie_word_embeddings


def test_random_model_is_deterministic() -> None:
    a, b = build_random_model(SMALL, seed=1), build_random_model(SMALL, seed=1)
    c = build_random_model(SMALL, seed=2)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters(), strict=True):
        assert torch.equal(pa, pb), name
        assert not torch.equal(pa, pc), name


def test_tied_model_shares_embeddings() -> None:
    model = build_random_model(replace(SMALL, tie_word_embeddings=True))
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_preset_tiny_builds_with_its_shape() -> None:
    model = build_random_model(MODEL_PRESETS["tiny"])
    assert sum(p.numel() for p in model.parameters()) == MODEL_PRESETS["tiny"].num_parameters
    assert model.dtype == torch.float32


def test_opt_shape_is_refused() -> None:
    with pytest.raises(KvbenchError, match="'opt-13b' is opt: the tensor engine runs dense Llama-family models"):
        build_random_model(MODEL_PRESETS["opt-13b"])


@pytest.mark.parametrize("tied", [False, True])
def test_round_trip_through_safetensors(tmp_path: Path, tied: bool) -> None:
    model = build_random_model(replace(SMALL, tie_word_embeddings=tied), seed=3)
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert list(tmp_path.glob("*.safetensors"))
    loaded = load_local_model(tmp_path, "cpu")
    assert loaded.dtype == torch.float32
    for (name, pa), pb in zip(model.named_parameters(), loaded.parameters(), strict=True):
        assert torch.equal(pa, pb), name
    ids = [5, 9, 1, 40]
    runner = ModelRunner(loaded, num_blocks=4, block_size=4)
    logits = runner.forward(runner.build_step([(ids, 0, [2])]))
    with torch.no_grad():
        expected = model(torch.tensor([ids])).logits[0, -1]
    torch.testing.assert_close(logits[0], expected, rtol=1e-4, atol=1e-4)


def test_load_with_dtype(tmp_path: Path) -> None:
    build_random_model(SMALL).save_pretrained(tmp_path, safe_serialization=True)
    assert load_local_model(tmp_path, "cpu", torch.bfloat16).dtype == torch.bfloat16


def test_mistral_like_checkpoint_loads_as_llama(tmp_path: Path) -> None:
    from transformers import MistralConfig, MistralForCausalLM

    config = MistralConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        sliding_window=None,
    )
    mistral = MistralForCausalLM(config).eval()
    mistral.save_pretrained(tmp_path, safe_serialization=True)
    loaded = load_local_model(tmp_path)
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids).logits, mistral(ids).logits)


def write_config(path: Path, **overrides) -> Path:
    config = llama_config_from_shape(SMALL).to_dict() | overrides
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def test_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(KvbenchError, match="not found"):
        load_local_model(tmp_path / "nope")


def test_no_config(tmp_path: Path) -> None:
    with pytest.raises(KvbenchError, match="no config.json"):
        load_local_model(tmp_path)


def test_malformed_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(KvbenchError, match="malformed config"):
        load_local_model(tmp_path)
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(KvbenchError, match="malformed config"):
        load_local_model(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 32}))
    with pytest.raises(KvbenchError, match="malformed config .*config.json: missing field"):
        load_local_model(tmp_path)


def test_bin_only_checkpoint_is_not_unpickled(tmp_path: Path) -> None:
    write_config(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04 not a real pickle and never read")
    with pytest.raises(KvbenchError, match="never unpickles"):
        load_local_model(tmp_path)


def test_no_weights(tmp_path: Path) -> None:
    write_config(tmp_path)
    with pytest.raises(KvbenchError, match="no safetensors weights"):
        load_local_model(tmp_path)


def test_opt_checkpoint_is_shape_only(tmp_path: Path) -> None:
    write_config(tmp_path, model_type="opt", architectures=["OPTForCausalLM"])
    with pytest.raises(KvbenchError, match="model_type 'opt'.*tensor engine runs dense Llama-family"):
        load_local_model(tmp_path)


def test_unsupported_architecture(tmp_path: Path) -> None:
    write_config(tmp_path, model_type="gpt2", architectures=["GPT2LMHeadModel"])
    with pytest.raises(KvbenchError, match="unsupported architecture"):
        load_local_model(tmp_path)


def test_sliding_window_is_refused(tmp_path: Path) -> None:
    write_config(tmp_path, model_type="mistral", sliding_window=16, max_position_embeddings=128)
    with pytest.raises(KvbenchError, match="sliding-window"):
        load_local_model(tmp_path)


def test_corrupt_safetensors(tmp_path: Path) -> None:
    write_config(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"garbage")
    with pytest.raises(KvbenchError, match="cannot load weights"):
        load_local_model(tmp_path)


def test_incomplete_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    model = build_random_model(SMALL)
    write_config(tmp_path)
    state = {k: v.contiguous() for k, v in model.state_dict().items() if "mlp" not in k}
    save_file(state, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(KvbenchError, match="lacks"):
        load_local_model(tmp_path)


def test_devices_and_dtypes() -> None:
    assert resolve_torch_device("cpu") == torch.device("cpu")
    assert resolve_torch_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(KvbenchError, match="unknown device"):
        resolve_torch_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(KvbenchError, match="CUDA is not available"):
            resolve_torch_device("cuda")
    assert resolve_torch_dtype(None, "cpu") == torch.float32
    assert resolve_torch_dtype(None, "cuda") == torch.float16
    assert resolve_torch_dtype("bf16", "cuda") == torch.bfloat16
    assert resolve_torch_dtype(torch.float16, "cpu") == torch.float16
    with pytest.raises(KvbenchError, match="unknown dtype"):
        resolve_torch_dtype("int8", "cpu")


@pytest.mark.parametrize("model_type", ["mixtral", "qwen2", "qwen2_moe"])
def test_shapes_the_engine_does_not_run_name_both_lists(tmp_path: Path, model_type: str) -> None:
    """The shape reader costs these; the tensor engine refuses them and says which it runs."""
    write_config(
        tmp_path,
        model_type=model_type,
        architectures=[],
        num_local_experts=4,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=16,
    )
    with pytest.raises(KvbenchError) as caught:
        load_local_model(tmp_path)
    message = str(caught.value)
    assert f"model_type {model_type!r}" in message
    assert "the tensor engine runs dense Llama-family models (llama, mistral)" in message
    assert "the simulator (waste, capacity, a simulated sweep) reads the shapes of llama, mistral, mixtral" in message


def test_engine_refuses_moe_and_qkv_only_bias_shapes() -> None:
    from kvbench.models.hf_model import check_engine_shape
    from kvbench.models.shapes import MoeSpec

    check_engine_shape(SMALL)
    with pytest.raises(KvbenchError, match="is a mixture of experts"):
        check_engine_shape(replace(SMALL, moe=MoeSpec(4, 2, 16, 1)))
    with pytest.raises(KvbenchError, match="biases on q/k/v only"):
        check_engine_shape(replace(SMALL, qkv_bias=True))


def test_llama_attention_bias_round_trips(tmp_path: Path) -> None:
    shape = replace(SMALL, qkv_bias=True, o_bias=True, mlp_bias=True)
    model = build_random_model(shape)
    assert sum(p.numel() for p in model.parameters()) == shape.num_parameters
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert load_local_model(tmp_path).model.layers[0].self_attn.o_proj.bias is not None


def test_malformed_sliding_window_is_one_line(tmp_path: Path) -> None:
    write_config(tmp_path, model_type="mistral", sliding_window="wide")
    with pytest.raises(KvbenchError, match="sliding_window must be a positive integer"):
        load_local_model(tmp_path)


def test_a_checkpoint_missing_weights_is_one_line_without_a_progress_bar(tmp_path, capfd):
    """transformers draws a loading bar on stderr; the error must be the only thing the user sees."""
    import torch
    from safetensors.torch import save_file

    from kvbench.cli import main

    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "intermediate_size": 128,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    save_file({"model.embed_tokens.weight": torch.zeros(512, 64)}, str(tmp_path / "model.safetensors"))
    assert main(["sweep", "--model", str(tmp_path), "--device", "cpu", "--out", str(tmp_path / "run")]) == 2
    err = capfd.readouterr().err.strip()
    assert err.startswith("error: checkpoint") and "lacks" in err and len(err.splitlines()) == 1
