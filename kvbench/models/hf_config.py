"""Read a Hugging Face ``config.json`` into a :class:`ModelShape`, every field checked.

Each architecture the reader understands has a reader below; anything else is refused by name rather than
costed as a dense Llama. Every bad value ends in one line that names the file and the field.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvbench import json_input
from kvbench.errors import KvbenchError
from kvbench.models.rope_params import (
    check_rope_theta,
    check_rotary_head_dim,
    is_positive_int,
    split_rope_scaling,
)
from kvbench.models.shapes import ModelShape, MoeSpec
from kvbench.values import is_number

_DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# A config without model_type is named by its class in "architectures"; with neither it is read as Llama.
_ARCHITECTURE_CLASSES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "OPTForCausalLM": "opt",
}
_MISSING = object()
MAX_CONFIG_BYTES = 16 << 20  # a config.json is kilobytes


def read_config_json(config_path: Path) -> dict[str, Any]:
    """The JSON object in a ``config.json``, or a one-line error saying what is wrong with the file."""
    if not config_path.is_file():
        raise KvbenchError(f"no config.json at {config_path}")
    try:
        config = json_input.loads(json_input.read_text(config_path, MAX_CONFIG_BYTES))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise KvbenchError(f"malformed config {config_path}: {err}") from None
    if not isinstance(config, dict):
        raise KvbenchError(f"malformed config {config_path}: expected a JSON object")
    return config


class ConfigFields:
    """Typed reads from one config; a failure is a one-line error naming the file and the field."""

    def __init__(self, config: dict[str, Any], path: Path) -> None:
        self.config = config
        self.path = path

    def error(self, message: str) -> KvbenchError:
        return KvbenchError(f"malformed config {self.path}: {message}")

    def get(self, name: str, default: Any = None) -> Any:
        """The value, with ``default`` for an absent field or a JSON null."""
        value = self.config.get(name)
        return default if value is None else value

    def positive_int(self, name: str, default: Any = _MISSING) -> int:
        value = self.config.get(name)
        if value is None:
            if default is _MISSING:
                raise self.error(f"missing field {name!r}")
            return default
        if not is_positive_int(value):
            raise self.error(f"{name} must be a positive integer, got {value!r}")
        return value

    def positive_number(self, name: str, default: float) -> float:
        value = self.get(name, default)
        if not is_number(value, finite=True) or value <= 0:
            raise self.error(f"{name} must be a positive number, got {value!r}")
        return float(value)

    def boolean(self, name: str, default: bool) -> bool:
        value = self.get(name, default)
        if not isinstance(value, bool):
            raise self.error(f"{name} must be true or false, got {value!r}")
        return value

    def dtype(self) -> str:
        """The checkpoint's dtype in kvbench's names; fp16 when absent or not one kvbench runs."""
        value = self.config.get("torch_dtype") or self.config.get("dtype")
        if value is not None and not isinstance(value, str):
            raise self.error(f"torch_dtype must be a string such as 'bfloat16', got {value!r}")
        return _DTYPE_NAMES.get(value, "fp16")

    def name(self) -> str:
        return str(self.config.get("_name_or_path") or self.path.parent.name)


# transformers' own default for Llama-family and OPT configs that do not say (present but bad is still an error)
DEFAULT_CONTEXT = 2048


def model_type_of(config: dict[str, Any]) -> str:
    """``model_type``, else the architecture class's model type, else ``llama``."""
    model_type = config.get("model_type")
    if model_type is not None:
        return str(model_type)
    architectures = config.get("architectures") or []
    if isinstance(architectures, list):
        for name in architectures:
            if name in _ARCHITECTURE_CLASSES:
                return _ARCHITECTURE_CLASSES[name]
    return "llama"


def shape_from_config(path: Path) -> ModelShape:
    """Read a Hugging Face ``config.json`` (or a directory holding one) into a shape."""
    config_path = path / "config.json" if path.is_dir() else path
    return shape_from_config_dict(read_config_json(config_path), config_path)


def shape_from_config_dict(config: dict[str, Any], config_path: Path) -> ModelShape:
    """The shape of an already parsed config; ``config_path`` names the file in errors."""
    model_type = model_type_of(config)
    reader = SHAPE_READERS.get(model_type)
    if reader is None:
        raise KvbenchError(
            f"unsupported architecture {model_type!r} in {config_path}: the shape reader understands: "
            f"{', '.join(SHAPE_READERS)}"
        )
    fields = ConfigFields(config, config_path)
    try:
        return reader(fields)
    except KvbenchError as err:
        message = str(err)
        if message.startswith("malformed config "):
            raise
        raise fields.error(message) from None
    except (TypeError, ValueError) as err:  # a value of a type no check above foresaw
        raise fields.error(str(err)) from None


def _read_opt(fields: ConfigFields) -> ModelShape:
    hidden = fields.positive_int("hidden_size")
    projection = fields.positive_int("word_embed_proj_dim", hidden)
    if projection != hidden:
        # OPT-350m embeds in a smaller width and projects in and out: not costed here
        raise fields.error(f"word_embed_proj_dim ({projection}) differs from hidden_size ({hidden}): not supported")
    heads = fields.positive_int("num_attention_heads")
    return ModelShape(
        name=fields.name(),
        num_layers=fields.positive_int("num_hidden_layers"),
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=heads,
        intermediate_size=fields.positive_int("ffn_dim"),
        vocab_size=fields.positive_int("vocab_size"),
        max_position_embeddings=fields.positive_int("max_position_embeddings", DEFAULT_CONTEXT),
        architecture="opt",
        tie_word_embeddings=fields.boolean("tie_word_embeddings", True),
        dtype=fields.dtype(),
        eos_token_id=_first_int(fields.config.get("eos_token_id")),
        extra={"model_type": "opt"},
    )


def _read_rotary(fields: ConfigFields, head_dim: int) -> tuple[float, dict[str, Any] | None]:
    """``rope_theta`` and the scaling, from transformers 4 fields or transformers 5 ``rope_parameters``."""
    check_rotary_head_dim(head_dim)
    rope = fields.get("rope_parameters", {})
    field = "rope_parameters"
    if not isinstance(rope, dict):
        raise fields.error(f"rope_parameters must be a JSON object, got {rope!r}")
    theta = fields.config.get("rope_theta")
    theta = check_rope_theta(rope.get("rope_theta", 10000.0) if theta is None else theta)
    scaling = fields.config.get("rope_scaling")
    if scaling is not None:
        field = "rope_scaling"
    else:
        scaling = rope
    rope_type, params = split_rope_scaling(scaling, field)
    if rope_type == "default":
        return theta, None
    return theta, {"rope_type": rope_type, **params}


def _head_dim(fields: ConfigFields, hidden: int, heads: int) -> int:
    if fields.config.get("head_dim") is not None:
        return fields.positive_int("head_dim")
    if hidden % heads:
        raise fields.error(f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads})")
    return hidden // heads


def _read_llama_family(fields: ConfigFields, model_type: str) -> ModelShape:
    """Llama, Mistral, Mixtral, Qwen2 and Qwen2-MoE: SwiGLU MLPs (or experts), RMSNorm, rotary, GQA."""
    hidden = fields.positive_int("hidden_size")
    heads = fields.positive_int("num_attention_heads")
    kv_heads = fields.positive_int("num_key_value_heads", heads)
    if heads % kv_heads:
        raise fields.error(
            f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})"
        )
    head_dim = _head_dim(fields, hidden, heads)
    theta, scaling = _read_rotary(fields, head_dim)
    layers = fields.positive_int("num_hidden_layers")
    attention_bias = fields.boolean("attention_bias", False)
    return ModelShape(
        name=fields.name(),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=fields.positive_int("intermediate_size"),
        vocab_size=fields.positive_int("vocab_size"),
        max_position_embeddings=fields.positive_int("max_position_embeddings", DEFAULT_CONTEXT),
        head_dim=head_dim,
        architecture="llama",
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=fields.positive_number("rms_norm_eps", 1e-6 if model_type.startswith("qwen2") else 1e-5),
        tie_word_embeddings=fields.boolean("tie_word_embeddings", False),
        dtype=fields.dtype(),
        eos_token_id=_first_int(fields.config.get("eos_token_id")),
        moe=_read_moe(fields, model_type, layers),
        qkv_bias=_qkv_bias(fields, model_type, attention_bias),
        o_bias=attention_bias and not model_type.startswith("qwen2"),
        mlp_bias=model_type == "llama" and fields.boolean("mlp_bias", False),
        extra={"model_type": model_type},
    )


def _qkv_bias(fields: ConfigFields, model_type: str, attention_bias: bool) -> bool:
    """Qwen2 always has q/k/v biases (Qwen2-MoE: unless ``qkv_bias`` is false); Llama's come with attention_bias."""
    if model_type == "qwen2":
        return True
    if model_type == "qwen2_moe":
        return fields.boolean("qkv_bias", True)
    return attention_bias


def _read_moe(fields: ConfigFields, model_type: str, layers: int) -> MoeSpec | None:
    if model_type == "mixtral":
        return MoeSpec(
            num_experts=fields.positive_int("num_local_experts"),
            experts_per_token=fields.positive_int("num_experts_per_tok"),
            expert_intermediate_size=fields.positive_int("intermediate_size"),
            num_moe_layers=layers,
        )
    if model_type == "qwen2_moe":
        return _read_qwen2_moe(fields, layers)
    return None


def _read_qwen2_moe(fields: ConfigFields, layers: int) -> MoeSpec | None:
    """Qwen2-MoE puts experts in every ``decoder_sparse_step``-th layer not listed in ``mlp_only_layers``."""
    experts = fields.config.get("num_experts")
    if experts == 0:
        return None  # no experts: every layer keeps its dense MLP
    step = fields.positive_int("decoder_sparse_step", 1)
    dense_only = fields.get("mlp_only_layers", [])
    if not isinstance(dense_only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense_only):
        raise fields.error(f"mlp_only_layers must be a list of layer indices, got {dense_only!r}")
    moe_layers = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    if moe_layers == 0:
        return None
    shared = fields.get("shared_expert_intermediate_size", 0)
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
        raise fields.error(f"shared_expert_intermediate_size must be an integer >= 0, got {shared!r}")
    return MoeSpec(
        num_experts=fields.positive_int("num_experts"),
        experts_per_token=fields.positive_int("num_experts_per_tok"),
        expert_intermediate_size=fields.positive_int("moe_intermediate_size"),
        num_moe_layers=moe_layers,
        shared_expert_intermediate_size=shared,
    )


def _llama_reader(model_type: str) -> Callable[[ConfigFields], ModelShape]:
    return lambda fields: _read_llama_family(fields, model_type)


SHAPE_READERS: dict[str, Callable[[ConfigFields], ModelShape]] = {
    "llama": _llama_reader("llama"),
    "mistral": _llama_reader("mistral"),
    "mixtral": _llama_reader("mixtral"),
    "qwen2": _llama_reader("qwen2"),
    "qwen2_moe": _llama_reader("qwen2_moe"),
    "opt": _read_opt,
}
SHAPE_ARCHITECTURES = tuple(SHAPE_READERS)  # model types whose parameters and KV bytes kvbench costs


def _first_int(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
