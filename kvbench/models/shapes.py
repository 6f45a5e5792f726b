"""Model shapes: presets and local Hugging Face ``config.json`` files, and what they cost in bytes."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a decoder-only transformer that decide its weight and KV-cache bytes."""

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int = 4096
    head_dim: int = 0  # 0: hidden_size // num_heads
    architecture: str = "llama"  # "llama" (SwiGLU MLP, RMSNorm, rotary) or "opt" (GELU MLP, LayerNorm, learned pos)
    rope_theta: float = 10000.0
    rope_scaling: dict[str, Any] | None = None
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    dtype: str = "fp16"
    eos_token_id: int | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise KvbenchError(f"model {self.name!r}: {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise KvbenchError(
                f"model {self.name!r}: num_heads ({self.num_heads}) is not a multiple of num_kv_heads ({self.num_kv_heads})"
            )
        if not isinstance(self.head_dim, int) or isinstance(self.head_dim, bool) or self.head_dim < 0:
            raise KvbenchError(f"model {self.name!r}: head_dim must be a positive integer, got {self.head_dim!r}")
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise KvbenchError(f"model {self.name!r}: hidden_size is not a multiple of num_heads")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.dtype not in DTYPE_BYTES:
            raise KvbenchError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one token: 2 (K and V) x layers x KV heads x head_dim x dtype bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def num_parameters(self) -> int:
        """Parameter count from the shape (embeddings, attention, MLP, norms, LM head)."""
        h, layers = self.hidden_size, self.num_layers
        q_out = self.num_heads * self.head_dim
        kv_out = self.num_kv_heads * self.head_dim
        embed = self.vocab_size * h
        lm_head = 0 if self.tie_word_embeddings else self.vocab_size * h
        if self.architecture == "opt":
            attn = h * q_out + 2 * h * kv_out + q_out * h + q_out + 2 * kv_out + h  # with biases
            mlp = 2 * h * self.intermediate_size + self.intermediate_size + h
            norms = 2 * 2 * h
            positions = (self.max_position_embeddings + 2) * h
            return embed + positions + layers * (attn + mlp + norms) + 2 * h + lm_head
        attn = h * q_out + 2 * h * kv_out + q_out * h
        mlp = 3 * h * self.intermediate_size
        norms = 2 * h
        return embed + layers * (attn + mlp + norms) + h + lm_head

    @property
    def weight_bytes(self) -> int:
        return self.num_parameters * self.dtype_bytes

    def with_dtype(self, dtype: str) -> ModelShape:
        if dtype not in DTYPE_BYTES:
            raise KvbenchError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
        return replace(self, dtype=dtype)

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("extra")
        data.update(
            bytes_per_token=self.bytes_per_token,
            num_parameters=self.num_parameters,
            weight_bytes=self.weight_bytes,
        )
        return data


MODEL_PRESETS: dict[str, ModelShape] = {
    # Small enough for CPU sweeps on 2 cores; GQA (4 query heads share 2 KV heads) to exercise grouping.
    "tiny": ModelShape("tiny", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, intermediate_size=128,
                       vocab_size=512, max_position_embeddings=4096, dtype="fp32"),
    "llama-2-7b": ModelShape("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    "llama-2-13b": ModelShape("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    "llama-2-70b": ModelShape("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    "llama-3-8b": ModelShape("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, rope_theta=500000.0),
    "opt-13b": ModelShape("opt-13b", 40, 5120, 40, 40, 20480, 50272, 2048, architecture="opt",
                          tie_word_embeddings=True),
}


def preset_names() -> list[str]:
    return list(MODEL_PRESETS)


def resolve_model(spec: str, dtype: str | None = None) -> ModelShape:
    """A preset name, or a path to a checkpoint directory / ``config.json`` file."""
    if spec in MODEL_PRESETS:
        shape = MODEL_PRESETS[spec]
    else:
        path = Path(spec)
        if not path.exists():
            raise KvbenchError(
                f"unknown model {spec!r}: not a preset ({', '.join(MODEL_PRESETS)}) and no such path"
            )
        shape = shape_from_config(path)
    return shape.with_dtype(dtype) if dtype else shape


_DTYPE_NAMES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def read_config_json(config_path: Path) -> dict[str, Any]:
    """The JSON object in a ``config.json``, or a one-line error saying what is wrong with the file."""
    if not config_path.is_file():
        raise KvbenchError(f"no config.json at {config_path}")
    try:
        config = json.loads(config_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise KvbenchError(f"malformed config {config_path}: {err}") from None
    if not isinstance(config, dict):
        raise KvbenchError(f"malformed config {config_path}: expected a JSON object")
    return config


def shape_from_config(path: Path) -> ModelShape:
    """Read a Hugging Face ``config.json`` (or a directory holding one) into a shape."""
    config_path = path / "config.json" if path.is_dir() else path
    config = read_config_json(config_path)
    model_type = config.get("model_type", "llama")
    try:
        if model_type == "opt":
            return ModelShape(
                name=str(config.get("_name_or_path") or path.name),
                num_layers=config["num_hidden_layers"],
                hidden_size=config["hidden_size"],
                num_heads=config["num_attention_heads"],
                num_kv_heads=config["num_attention_heads"],
                intermediate_size=config["ffn_dim"],
                vocab_size=config["vocab_size"],
                max_position_embeddings=config.get("max_position_embeddings", 2048),
                architecture="opt",
                tie_word_embeddings=config.get("tie_word_embeddings", True),
                dtype=_DTYPE_NAMES.get(config.get("torch_dtype") or config.get("dtype"), "fp16"),
                eos_token_id=_first_int(config.get("eos_token_id")),
            )
        num_heads = config["num_attention_heads"]
        rope = config.get("rope_parameters") or {}  # transformers >= 5 keeps rope settings here
        return ModelShape(
            name=str(config.get("_name_or_path") or path.name),
            num_layers=config["num_hidden_layers"],
            hidden_size=config["hidden_size"],
            num_heads=num_heads,
            num_kv_heads=config.get("num_key_value_heads") or num_heads,
            intermediate_size=config["intermediate_size"],
            vocab_size=config["vocab_size"],
            max_position_embeddings=config.get("max_position_embeddings", 4096),
            head_dim=config.get("head_dim") or 0,
            architecture="llama",
            rope_theta=float(config.get("rope_theta", rope.get("rope_theta", 10000.0))),
            rope_scaling=config.get("rope_scaling") or _declared_scaling(rope),
            rms_norm_eps=float(config.get("rms_norm_eps", 1e-5)),
            tie_word_embeddings=bool(config.get("tie_word_embeddings", False)),
            dtype=_DTYPE_NAMES.get(config.get("torch_dtype") or config.get("dtype"), "fp16"),
            eos_token_id=_first_int(config.get("eos_token_id")),
            extra={"model_type": model_type},
        )
    except KeyError as err:
        raise KvbenchError(f"malformed config {config_path}: missing field {err.args[0]!r}") from None
    except (TypeError, ValueError) as err:
        raise KvbenchError(f"malformed config {config_path}: {err}") from None


def _declared_scaling(rope: dict[str, Any]) -> dict[str, Any] | None:
    """A rope_parameters block declares scaling unless its type is the plain default."""
    if rope.get("rope_type", "default") == "default":
        return None
    return {k: v for k, v in rope.items() if k != "rope_theta"}


def _first_int(value: Any) -> int | None:
    if isinstance(value, list):
        value = value[0] if value else None
    return value if isinstance(value, int) else None
