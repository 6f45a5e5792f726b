"""Read a Hugging Face ``config.json`` into a :class:`ModelShape`, every field checked.

Each architecture the reader understands has a reader below; anything else is refused by name rather than
costed as a dense Llama. Every bad value ends in one line that names the file and the field. Fields a config
may leave out take the defaults of transformers' config class for that architecture (Gemma 3's
``sliding_window_pattern`` of 6, gpt-oss' alternating layers), since that is what the checkpoint was built with.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kvbench import json_input
from kvbench.errors import KvbenchError
from kvbench.models.quantization import format_from_config
from kvbench.models.rope_params import (
    check_rope_theta,
    check_rotary_head_dim,
    is_positive_int,
    split_rope_scaling,
)
from kvbench.models.shapes import SHAPE_LIMITS, MlaSpec, ModelShape, MoeSpec
from kvbench.values import is_number

_DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}
# A config without model_type is named by its class in "architectures"; with neither it is read as Llama.
_ARCHITECTURE_CLASSES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "MixtralForCausalLM": "mixtral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen2MoeForCausalLM": "qwen2_moe",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Gemma3ForConditionalGeneration": "gemma3",
    "DeepseekV2ForCausalLM": "deepseek_v2",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "GptOssForCausalLM": "gpt_oss",
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


# the config fields whose counts a reader walks (layers, heads), limited as the shape is
_READ_LIMITS = {
    "num_hidden_layers": SHAPE_LIMITS["num_layers"],
    "num_attention_heads": SHAPE_LIMITS["num_heads"],
    "num_key_value_heads": SHAPE_LIMITS["num_kv_heads"],
}


class ConfigFields:
    """Typed reads from one config; a failure is a one-line error naming the file and the field."""

    def __init__(self, config: dict[str, Any], path: Path, name: str | None = None) -> None:
        self.config = config
        self.path = path
        self._name = name

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
        limit = _READ_LIMITS.get(name)
        if limit is not None and value > limit:  # before anything walks the layers or heads one by one
            raise self.error(f"{name} of {value:,} is above {limit:,}, more than any model has: a broken config")
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

    def dtype(self, default: Any = None) -> str:
        """The checkpoint's dtype in kvbench's names; ``default`` (a torch dtype name) or fp16 when absent, fp16
        when not one kvbench runs."""
        value = self.config.get("torch_dtype") or self.config.get("dtype")
        if value is None and isinstance(default, str):
            value = default
        if value is not None and not isinstance(value, str):
            raise self.error(f"torch_dtype must be a string such as 'bfloat16', got {value!r}")
        return "fp16" if value is None else _DTYPE_NAMES.get(value, "fp16")

    def name(self) -> str:
        folder = self.path.parent.name if self.path.name == "config.json" else self.path.stem
        return self._name or str(self.config.get("_name_or_path") or folder)

    def non_negative_int(self, name: str, default: int = 0) -> int:
        value = self.get(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise self.error(f"{name} must be an integer >= 0, got {value!r}")
        return value

    def layer_list(self, name: str, layers: int) -> list[Any] | None:
        """A per-layer list such as ``layer_types``: None when absent, one entry per layer when present."""
        value = self.config.get(name)
        if value is None:
            return None
        if not isinstance(value, list) or len(value) != layers:
            raise self.error(f"{name} must list one entry for each of the {layers} layers, got {value!r}")
        return value


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
            if isinstance(name, str) and name in _ARCHITECTURE_CLASSES:
                return _ARCHITECTURE_CLASSES[name]
    return "llama"


def shape_from_config(path: Path, name: str | None = None) -> ModelShape:
    """Read a Hugging Face ``config.json`` (or a directory holding one) into a shape; ``name`` replaces the one
    the config or its folder gives (a Hub id, whose cache folder is a commit hash)."""
    config_path = path / "config.json" if path.is_dir() else path
    return shape_from_config_dict(read_config_json(config_path), config_path, name)


# Wrappers of a language model and a vision tower: the language model's fields are under ``text_config``.
_MULTIMODAL = {"gemma3": "gemma3_text"}


def shape_from_config_dict(config: dict[str, Any], config_path: Path, name: str | None = None) -> ModelShape:
    """The shape of an already parsed config; ``config_path`` names the file in errors."""
    model_type = model_type_of(config)
    outer = ConfigFields(config, config_path, name)
    if model_type in _MULTIMODAL:
        config, model_type = _text_config(outer, model_type)
    reader = SHAPE_READERS.get(model_type)
    if reader is None:
        raise KvbenchError(
            f"unsupported architecture {model_type!r} in {config_path}: the shape reader understands: "
            f"{', '.join(SHAPE_READERS)}"
        )
    fields = ConfigFields(config, config_path, outer.name())
    try:
        shape = reader(fields)
        weight_format = format_from_config(config.get("quantization_config"))
        vision = _vision_parameters(outer, shape.hidden_size) if outer.config is not config else 0
        if weight_format is not None or vision:
            shape = replace(shape, weight_format=weight_format, vision_parameters=vision)
        return shape
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
    if isinstance(rope.get("full_attention"), dict):  # per layer type (Gemma 3): the global layers' scaling
        rope, field = rope["full_attention"], "rope_parameters.full_attention"
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


def _head_dim(fields: ConfigFields, hidden: int, heads: int, default: int | None = None) -> int:
    if fields.config.get("head_dim") is not None:
        return fields.positive_int("head_dim")
    if default is not None:
        return default
    if hidden % heads:
        raise fields.error(f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({heads})")
    return hidden // heads


# Defaults of transformers' config classes for fields a published config may leave out.
_FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma": {"head_dim": 256, "tie_word_embeddings": True, "rms_norm_eps": 1e-6, "max_position_embeddings": 8192},
    "gemma2": {
        "head_dim": 256,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 8192,
        "sliding_window": 4096,
        "vocab_size": 256_000,
    },
    "gemma3_text": {
        "head_dim": 256,
        "tie_word_embeddings": True,
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": 131_072,
        "sliding_window": 4096,
        "vocab_size": 262_208,
        "num_key_value_heads": 4,
    },
    "gpt_oss": {
        "head_dim": 64,
        "sliding_window": 128,
        "attention_bias": True,
        "max_position_embeddings": 131_072,
        "vocab_size": 201_088,
        "num_key_value_heads": 8,
        "torch_dtype": "bfloat16",
    },  # the published config names none; its unquantized weights are bf16
}


def _default(fields: ConfigFields, model_type: str, name: str) -> Any:
    return _FAMILY_DEFAULTS.get(model_type, {}).get(name, _MISSING)


def _read_llama_family(fields: ConfigFields, model_type: str) -> ModelShape:
    """Llama, Mistral, Mixtral, Qwen2/3 (and their MoE), Gemma 1/2/3, gpt-oss: RMSNorm, rotary, GQA or MQA, a
    gated MLP or experts, sliding-window layers where the config has them."""

    def int_field(name: str, fallback: Any = _MISSING) -> int:
        default = _default(fields, model_type, name)
        return fields.positive_int(name, fallback if default is _MISSING else default)

    def bool_field(name: str, fallback: bool) -> bool:
        default = _default(fields, model_type, name)
        return fields.boolean(name, fallback if default is _MISSING else default)

    hidden = int_field("hidden_size")
    heads = int_field("num_attention_heads")
    kv_heads = int_field("num_key_value_heads", heads)
    if heads % kv_heads:
        raise fields.error(f"num_attention_heads ({heads}) is not a multiple of num_key_value_heads ({kv_heads})")
    family_head_dim = _default(fields, model_type, "head_dim")
    head_dim = _head_dim(fields, hidden, heads, None if family_head_dim is _MISSING else family_head_dim)
    theta, scaling = _read_rotary(fields, head_dim)
    layers = int_field("num_hidden_layers")
    attention_bias = bool_field("attention_bias", False)
    window, windowed = _read_windows(fields, model_type, layers)
    return ModelShape(
        name=fields.name(),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        intermediate_size=int_field("intermediate_size"),
        vocab_size=int_field("vocab_size"),
        max_position_embeddings=int_field("max_position_embeddings", DEFAULT_CONTEXT),
        head_dim=head_dim,
        architecture="llama",
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=fields.positive_number("rms_norm_eps", 1e-6 if model_type.startswith(("qwen", "gemma")) else 1e-5),
        tie_word_embeddings=bool_field("tie_word_embeddings", False),
        dtype=fields.dtype(_default(fields, model_type, "torch_dtype")),
        eos_token_id=_first_int(fields.config.get("eos_token_id")),
        moe=_read_moe(fields, model_type, layers),
        qkv_bias=_qkv_bias(fields, model_type, attention_bias),
        o_bias=attention_bias and not model_type.startswith("qwen2"),
        mlp_bias=model_type == "llama" and fields.boolean("mlp_bias", False),
        sliding_window=window,
        sliding_layers=windowed,
        qk_norm=model_type in ("qwen3", "qwen3_moe", "gemma3_text"),
        norms_per_layer=4 if model_type in ("gemma2", "gemma3_text") else 2,
        attention_sinks=model_type == "gpt_oss",
        extra={"model_type": model_type},
    )


def _read_windows(fields: ConfigFields, model_type: str, layers: int) -> tuple[int | None, tuple[int, ...]]:
    """The sliding window and the layers that use it.

    ``layer_types`` (transformers >= 4.54 writes it) names each layer ``sliding_attention`` or
    ``full_attention``; without it each family has its rule: Mistral and Mixtral window every layer when
    ``sliding_window`` is set, Qwen2/3 the layers from ``max_window_layers`` on when ``use_sliding_window``,
    Gemma 2 every other layer from the first, Gemma 3 all but every ``sliding_window_pattern``-th, gpt-oss every
    other layer from the first.
    """
    default = _default(fields, model_type, "sliding_window")
    raw = fields.config.get("sliding_window", None if default is _MISSING else default)
    if model_type.startswith("qwen") and not fields.boolean("use_sliding_window", False):
        raw = None
    types = fields.layer_list("layer_types", layers)
    if types is not None:
        unknown = sorted({t for t in types if t not in ("sliding_attention", "full_attention")}, key=str)
        if unknown:
            raise fields.error(
                f"layer_types: unsupported attention type {unknown[0]!r} (kvbench reads "
                "sliding_attention and full_attention)"
            )
        windowed = tuple(i for i, kind in enumerate(types) if kind == "sliding_attention")
    elif raw is None:
        return None, ()
    elif model_type in ("gemma2", "gpt_oss"):
        windowed = tuple(range(0, layers, 2))
    elif model_type == "gemma3_text":
        pattern = fields.config.get("sliding_window_pattern", fields.config.get("_sliding_window_pattern", 6))
        if not isinstance(pattern, int) or isinstance(pattern, bool) or pattern < 1:
            raise fields.error(f"sliding_window_pattern must be a positive integer, got {pattern!r}")
        windowed = tuple(i for i in range(layers) if (i + 1) % pattern)
    elif model_type.startswith("qwen"):
        start = fields.non_negative_int("max_window_layers", layers)
        windowed = tuple(range(min(start, layers), layers))
    else:
        windowed = tuple(range(layers))
    if not windowed:
        return None, ()
    if raw is None:
        raise fields.error("layer_types has sliding_attention layers but sliding_window is not set")
    if not is_positive_int(raw):
        raise fields.error(f"sliding_window must be a positive integer, got {raw!r}")
    if raw >= fields.config.get("max_position_embeddings", raw + 1):  # never reached: every layer sees it all
        return None, ()
    return raw, windowed


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
    if model_type == "gpt_oss":
        experts_per_token = fields.config.get("num_experts_per_tok", fields.config.get("experts_per_token"))
        if not is_positive_int(experts_per_token):
            raise fields.error(f"num_experts_per_tok must be a positive integer, got {experts_per_token!r}")
        return MoeSpec(
            num_experts=fields.positive_int("num_local_experts", 128),
            experts_per_token=experts_per_token,
            expert_intermediate_size=fields.positive_int("intermediate_size"),
            num_moe_layers=layers,
            expert_bias=True,
            router_bias=True,
        )
    if model_type in ("qwen2_moe", "qwen3_moe"):
        return _read_qwen_moe(fields, layers)
    return None


def _read_qwen_moe(fields: ConfigFields, layers: int) -> MoeSpec | None:
    """Qwen-MoE puts experts in every ``decoder_sparse_step``-th layer not listed in ``mlp_only_layers``."""
    experts_field = "num_experts" if "num_experts" in fields.config else "num_local_experts"  # transformers 5
    experts = fields.config.get(experts_field)
    if experts == 0:
        return None  # no experts: every layer keeps its dense MLP
    step = fields.positive_int("decoder_sparse_step", 1)
    dense_only = fields.get("mlp_only_layers", [])
    if not isinstance(dense_only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in dense_only):
        raise fields.error(f"mlp_only_layers must be a list of layer indices, got {dense_only!r}")
    moe_layers = tuple(i for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    if not moe_layers:
        return None
    shared = fields.get("shared_expert_intermediate_size", 0)
    if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
        raise fields.error(f"shared_expert_intermediate_size must be an integer >= 0, got {shared!r}")
    return MoeSpec(
        num_experts=fields.positive_int(experts_field),
        experts_per_token=fields.positive_int("num_experts_per_tok"),
        expert_intermediate_size=fields.positive_int("moe_intermediate_size"),
        num_moe_layers=len(moe_layers),
        shared_expert_intermediate_size=shared,
        layers=None if moe_layers == tuple(range(layers - len(moe_layers), layers)) else moe_layers,
    )


def _read_deepseek(fields: ConfigFields, model_type: str) -> ModelShape:
    """DeepSeek-V2/V3 and Kimi K2: multi-head latent attention and fine-grained experts with shared ones, after
    ``first_k_dense_replace`` dense layers (every ``moe_layer_freq``-th layer from there)."""
    hidden = fields.positive_int("hidden_size")
    heads = fields.positive_int("num_attention_heads")
    layers = fields.positive_int("num_hidden_layers")
    q_lora = fields.get("q_lora_rank", 0)
    if not isinstance(q_lora, int) or isinstance(q_lora, bool) or q_lora < 0:
        raise fields.error(f"q_lora_rank must be a positive integer or null, got {q_lora!r}")
    mla = MlaSpec(
        kv_lora_rank=fields.positive_int("kv_lora_rank"),
        qk_rope_head_dim=fields.positive_int("qk_rope_head_dim"),
        qk_nope_head_dim=fields.positive_int("qk_nope_head_dim"),
        v_head_dim=fields.positive_int("v_head_dim"),
        q_lora_rank=q_lora,
    )
    head_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    theta, scaling = _read_rotary(fields, mla.qk_rope_head_dim)
    first_dense = fields.non_negative_int("first_k_dense_replace", 0)
    frequency = fields.positive_int("moe_layer_freq", 1)
    experts = fields.non_negative_int("n_routed_experts", 0)
    moe_layers = tuple(i for i in range(layers) if experts and i >= first_dense and i % frequency == 0)
    moe = None
    if moe_layers:
        moe = MoeSpec(
            num_experts=experts,
            experts_per_token=fields.positive_int("num_experts_per_tok"),
            expert_intermediate_size=fields.positive_int("moe_intermediate_size"),
            num_moe_layers=len(moe_layers),
            shared_expert_intermediate_size=fields.non_negative_int("n_shared_experts", 0)
            * fields.positive_int("moe_intermediate_size"),
            shared_expert_gate=False,
            router_bias=model_type != "deepseek_v2",  # V3's e_score_correction_bias
            layers=None if moe_layers == tuple(range(layers - len(moe_layers), layers)) else moe_layers,
        )
    return ModelShape(
        name=fields.name(),
        num_layers=layers,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=heads,  # every head reads the same latent: the cache is one latent per token and layer
        intermediate_size=fields.positive_int("intermediate_size"),
        vocab_size=fields.positive_int("vocab_size"),
        max_position_embeddings=fields.positive_int("max_position_embeddings", DEFAULT_CONTEXT),
        head_dim=head_dim,
        rope_theta=theta,
        rope_scaling=scaling,
        rms_norm_eps=fields.positive_number("rms_norm_eps", 1e-6),
        tie_word_embeddings=fields.boolean("tie_word_embeddings", False),
        dtype=fields.dtype(),
        eos_token_id=_first_int(fields.config.get("eos_token_id")),
        moe=moe,
        mla=mla,
        extra={"model_type": model_type},
    )


def _text_config(outer: ConfigFields, model_type: str) -> tuple[dict[str, Any], str]:
    """The language model's config inside a multimodal one, with the outer dtype and quantization."""
    text = outer.config.get("text_config")
    if not isinstance(text, dict):
        raise outer.error(f"a {model_type} config needs a text_config object")
    merged = dict(text)
    for name in ("torch_dtype", "dtype", "quantization_config"):
        if merged.get(name) is None and outer.config.get(name) is not None:
            merged[name] = outer.config[name]
    return merged, str(text.get("model_type") or _MULTIMODAL[model_type])


def _vision_parameters(outer: ConfigFields, text_hidden: int) -> int:
    """Parameters of a SigLIP vision tower (Gemma 3) and its projector into the language model."""
    vision = outer.config.get("vision_config")
    if not isinstance(vision, dict):
        return 0
    fields = ConfigFields(vision, outer.path)

    def number(name: str, default: int) -> int:
        try:
            return fields.positive_int(name, default)
        except KvbenchError as err:
            raise outer.error(f"vision_config.{str(err).split(': ', 1)[1]}") from None

    width, inner = number("hidden_size", 768), number("intermediate_size", 3072)
    layers, patch, image = number("num_hidden_layers", 12), number("patch_size", 16), number("image_size", 224)
    channels = number("num_channels", 3)
    per_layer = 4 * (width * width + width) + 2 * 2 * width + 2 * width * inner + inner + width
    embeddings = channels * patch * patch * width + width + (image // patch) ** 2 * width
    projector = width + width * text_hidden  # Gemma 3: an RMSNorm of the tower's width, then a projection
    return layers * per_layer + embeddings + 2 * width + projector


def _llama_reader(model_type: str) -> Callable[[ConfigFields], ModelShape]:
    return lambda fields: _read_llama_family(fields, model_type)


def _deepseek_reader(model_type: str) -> Callable[[ConfigFields], ModelShape]:
    return lambda fields: _read_deepseek(fields, model_type)


SHAPE_READERS: dict[str, Callable[[ConfigFields], ModelShape]] = {
    "llama": _llama_reader("llama"),
    "mistral": _llama_reader("mistral"),
    "mixtral": _llama_reader("mixtral"),
    "qwen2": _llama_reader("qwen2"),
    "qwen2_moe": _llama_reader("qwen2_moe"),
    "qwen3": _llama_reader("qwen3"),
    "qwen3_moe": _llama_reader("qwen3_moe"),
    "gemma": _llama_reader("gemma"),
    "gemma2": _llama_reader("gemma2"),
    "gemma3_text": _llama_reader("gemma3_text"),
    "gpt_oss": _llama_reader("gpt_oss"),
    "deepseek_v2": _deepseek_reader("deepseek_v2"),
    "deepseek_v3": _deepseek_reader("deepseek_v3"),
    "kimi_k2": _deepseek_reader("kimi_k2"),
    "opt": _read_opt,
}
SHAPE_ARCHITECTURES = tuple(SHAPE_READERS)  # model types whose parameters and KV bytes kvbench costs


def _first_int(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
