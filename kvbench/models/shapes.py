"""Model shapes: what a decoder-only transformer costs in parameters, weight bytes and KV bytes; presets."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError
from kvbench.models.rope_params import (
    check_rope_theta,
    check_rotary_head_dim,
    scaled_context_length,
    split_rope_scaling,
)

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}


def _is_positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True)
class MoeSpec:
    """A mixture-of-experts MLP: a router picks ``experts_per_token`` of ``num_experts`` SwiGLU experts per token.

    ``num_moe_layers`` layers have one (the others keep a dense MLP of the shape's ``intermediate_size``).
    A shared expert (Qwen-MoE) runs for every token next to the routed ones, behind a one-output gate.
    """

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_moe_layers: int
    shared_expert_intermediate_size: int = 0

    def __post_init__(self) -> None:
        for name in ("num_experts", "experts_per_token", "expert_intermediate_size", "num_moe_layers"):
            value = getattr(self, name)
            if not _is_positive_int(value):
                raise KvbenchError(f"mixture of experts: {name} must be a positive integer, got {value!r}")
        shared = self.shared_expert_intermediate_size
        if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
            raise KvbenchError(f"mixture of experts: shared_expert_intermediate_size must be >= 0, got {shared!r}")
        if self.experts_per_token > self.num_experts:
            raise KvbenchError(
                f"mixture of experts: {self.experts_per_token} experts per token but only {self.num_experts} experts"
            )

    def expert_parameters(self, hidden_size: int) -> int:
        """One routed expert: gate, up and down projections."""
        return 3 * hidden_size * self.expert_intermediate_size

    def block_parameters(self, hidden_size: int, experts: int) -> int:
        """One layer's MoE block with ``experts`` routed experts counted: router, experts, shared expert."""
        router = hidden_size * self.num_experts
        shared = 0
        if self.shared_expert_intermediate_size:
            shared = 3 * hidden_size * self.shared_expert_intermediate_size + hidden_size  # MLP + its gate
        return router + experts * self.expert_parameters(hidden_size) + shared


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
    moe: MoeSpec | None = None  # None: a dense MLP in every layer
    qkv_bias: bool = False  # biases on the q, k and v projections (Qwen2; Llama's attention_bias)
    o_bias: bool = False  # bias on the output projection (Llama's attention_bias)
    mlp_bias: bool = False  # biases on the dense MLP's projections (Llama's mlp_bias)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "intermediate_size", "vocab_size",
                     "max_position_embeddings"):
            value = getattr(self, name)
            if not _is_positive_int(value):
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
        if self.architecture not in ("llama", "opt"):
            raise KvbenchError(f"model {self.name!r}: unknown architecture {self.architecture!r}; choose llama or opt")
        if self.architecture == "llama":
            self._check_rotary()
        elif self.moe is not None:
            raise KvbenchError(f"model {self.name!r}: mixture of experts is costed for the llama architecture only")
        if self.moe is not None and self.moe.num_moe_layers > self.num_layers:
            raise KvbenchError(
                f"model {self.name!r}: {self.moe.num_moe_layers} MoE layers but only {self.num_layers} layers"
            )

    def _check_rotary(self) -> None:
        try:
            check_rotary_head_dim(self.head_dim)
            check_rope_theta(self.rope_theta)
            split_rope_scaling(self.rope_scaling)
        except KvbenchError as err:
            raise KvbenchError(f"model {self.name!r}: {err}") from None

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one token: 2 (K and V) x layers x KV heads x head_dim x dtype bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def context_length(self) -> int:
        """The longest context the model is meant for: ``max_position_embeddings``, stretched by rope scaling."""
        if self.architecture != "llama":
            return self.max_position_embeddings
        rope_type, params = split_rope_scaling(self.rope_scaling)
        return scaled_context_length(rope_type, params, self.max_position_embeddings)

    @property
    def num_parameters(self) -> int:
        """Parameter count from the shape (embeddings, attention, MLP or every expert and router, norms, LM head)."""
        return self._count_parameters(routed_experts=self.moe.num_experts if self.moe else 0)

    @property
    def active_parameters(self) -> int:
        """Parameters one token runs through: all of a dense model; the dense part and its top-k experts of an MoE.

        Like :attr:`num_parameters` it counts the embeddings, so ``2 x active_parameters`` FLOPs per token is
        the usual (slightly high) estimate.
        """
        return self._count_parameters(routed_experts=self.moe.experts_per_token if self.moe else 0)

    @property
    def routed_expert_bytes(self) -> int:
        """Bytes of one routed expert summed over the MoE layers (0 for a dense model)."""
        if self.moe is None:
            return 0
        return self.moe.num_moe_layers * self.moe.expert_parameters(self.hidden_size) * self.dtype_bytes

    def _count_parameters(self, routed_experts: int) -> int:
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
        attn += (q_out + 2 * kv_out if self.qkv_bias else 0) + (h if self.o_bias else 0)
        dense_mlp = 3 * h * self.intermediate_size + (2 * self.intermediate_size + h if self.mlp_bias else 0)
        norms = 2 * h
        moe_layers = self.moe.num_moe_layers if self.moe else 0
        mlps = (layers - moe_layers) * dense_mlp
        if self.moe is not None:
            mlps += moe_layers * self.moe.block_parameters(h, routed_experts)
        return embed + layers * (attn + norms) + mlps + h + lm_head

    @property
    def weight_bytes(self) -> int:
        return self.num_parameters * self.dtype_bytes

    def with_dtype(self, dtype: str) -> ModelShape:
        if dtype not in DTYPE_BYTES:
            raise KvbenchError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
        return replace(self, dtype=dtype)

    def to_dict(self) -> dict[str, Any]:
        """The fields and derived bytes; MoE and bias fields appear only when set, so dense models keep their keys."""
        data = asdict(self)
        data.pop("extra")
        for name in ("moe", "qkv_bias", "o_bias", "mlp_bias"):
            if not data[name]:
                data.pop(name)
        data.update(
            bytes_per_token=self.bytes_per_token,
            num_parameters=self.num_parameters,
            weight_bytes=self.weight_bytes,
        )
        if self.moe is not None:
            data["active_parameters"] = self.active_parameters
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
    """A preset name, or a path to a checkpoint directory, a ``config.json`` file or a GGUF file."""
    from kvbench.models.gguf_file import is_gguf, shape_from_gguf  # the readers build on this module
    from kvbench.models.hf_config import shape_from_config

    if spec in MODEL_PRESETS:
        shape = MODEL_PRESETS[spec]
    else:
        path = Path(spec)
        if not path.exists():
            raise KvbenchError(
                f"unknown model {spec!r}: not a preset ({', '.join(MODEL_PRESETS)}) and no such path"
            )
        shape = shape_from_gguf(path) if is_gguf(path) else shape_from_config(path)
    return shape.with_dtype(dtype) if dtype else shape
