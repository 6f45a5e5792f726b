"""Model shapes: what a decoder-only transformer costs in parameters, weight bytes and KV bytes; presets.

The KV arithmetic covers grouped- and multi-query attention with any ``head_dim``, sliding-window layers
(their cache stops growing at the window), and multi-head latent attention (one compressed latent per token and
layer instead of a K and a V per head). The weights are groups of tensors (:mod:`kvbench.models.weights`), so a
quantized checkpoint (:mod:`kvbench.models.quantization`) and a tensor-parallel split can cost each group by its
role. Readers of config files and GGUF headers build shapes; :mod:`kvbench.models.resolve` picks the reader.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

from kvbench.errors import KvbenchError
from kvbench.models.rope_params import (
    check_rope_theta,
    check_rotary_head_dim,
    scaled_context_length,
    split_rope_scaling,
)
from kvbench.models.weights import WeightGroup, vector

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
# KV-cache dtypes (vLLM's --kv-cache-dtype spellings, plus int8 as TensorRT-LLM and LMDeploy store it)
KV_DTYPE_BYTES = {**DTYPE_BYTES, "fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "int8": 1}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive_int(value: Any) -> bool:
    return _is_int(value) and value > 0


@dataclass(frozen=True)
class MoeSpec:
    """A mixture-of-experts MLP: a router picks ``experts_per_token`` of ``num_experts`` SwiGLU experts per token.

    ``num_moe_layers`` layers have one (the others keep a dense MLP of the shape's ``intermediate_size``): the
    layers listed in ``layers``, or the last ``num_moe_layers`` when it is None (DeepSeek's dense first layers).
    A shared expert runs for every token next to the routed ones: Qwen-MoE's behind a one-output gate
    (``shared_expert_gate``), DeepSeek's without one.
    """

    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    num_moe_layers: int
    shared_expert_intermediate_size: int = 0
    shared_expert_gate: bool = True
    expert_bias: bool = False  # biases on every expert's projections (gpt-oss)
    router_bias: bool = False  # a bias per expert on the router (gpt-oss; DeepSeek-V3's score correction)
    layers: tuple[int, ...] | None = None

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
        if self.layers is not None and len(self.layers) != self.num_moe_layers:
            raise KvbenchError(
                f"mixture of experts: {len(self.layers)} layer indices for {self.num_moe_layers} MoE layers"
            )

    def expert_parameters(self, hidden_size: int) -> int:
        """One routed expert: gate, up and down projections (and their biases)."""
        bias = 2 * self.expert_intermediate_size + hidden_size if self.expert_bias else 0
        return 3 * hidden_size * self.expert_intermediate_size + bias

    def block_groups(self, hidden_size: int, experts: int) -> list[WeightGroup]:
        """One layer's MoE block with ``experts`` routed experts counted: router, experts, shared expert."""
        h, inter = hidden_size, self.expert_intermediate_size
        groups = [WeightGroup("router", self.num_experts, h)]
        if self.router_bias:
            groups.append(vector("router", self.num_experts))
        groups += [WeightGroup("expert", inter, h, 2 * experts), WeightGroup("expert", h, inter, experts)]
        if self.expert_bias:
            groups.append(vector("expert", 2 * inter + h, experts))
        shared = self.shared_expert_intermediate_size
        if shared:
            groups += [WeightGroup("shared_expert", shared, h, 2), WeightGroup("shared_expert", h, shared)]
            if self.shared_expert_gate:
                groups.append(WeightGroup("router", 1, h))
        return groups

    def block_parameters(self, hidden_size: int, experts: int) -> int:
        return sum(group.parameters for group in self.block_groups(hidden_size, experts))


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): K and V are rebuilt from a latent of
    ``kv_lora_rank`` values plus a shared rotary key of ``qk_rope_head_dim``: that is all the cache holds."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int = 0  # 0: queries come from one projection (DeepSeek-V2-Lite)

    def __post_init__(self) -> None:
        for name in ("kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim"):
            if not _is_positive_int(getattr(self, name)):
                raise KvbenchError(f"latent attention: {name} must be a positive integer, got {getattr(self, name)!r}")
        if not isinstance(self.q_lora_rank, int) or isinstance(self.q_lora_rank, bool) or self.q_lora_rank < 0:
            raise KvbenchError(f"latent attention: q_lora_rank must be >= 0, got {self.q_lora_rank!r}")

    @property
    def cache_values(self) -> int:
        """Values cached per token and layer: the latent and the rotary key (no separate V)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


# Beyond these a config is broken, not a model (the largest have a few hundred layers and heads, vocabularies of
# a few hundred thousand): refused up front, since layer and head counts are walked one by one.
SHAPE_LIMITS = {
    "num_layers": 10_000,
    "hidden_size": 1 << 20,
    "num_heads": 1 << 16,
    "num_kv_heads": 1 << 16,
    "intermediate_size": 1 << 24,
    "vocab_size": 1 << 24,
    "max_position_embeddings": 1 << 31,
}


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
    kv_dtype: str = "auto"  # the KV cache's dtype; auto: the model's
    sliding_window: int | None = None  # tokens a windowed layer attends to (and caches)
    sliding_layers: tuple[int, ...] = ()  # indices of the windowed layers; the others attend to everything
    mla: MlaSpec | None = None  # multi-head latent attention instead of per-head K and V
    qk_norm: bool = False  # an RMSNorm of head_dim on queries and keys (Qwen3, Gemma 3)
    norms_per_layer: int = 2  # Gemma 2/3 add a norm after attention and after the MLP
    attention_sinks: bool = False  # one learned logit per head (gpt-oss)
    vision_parameters: int = 0  # a vision tower and projector loaded with the language model
    weight_format: Any = None  # quantization.WeightFormat | GgufStorage; None: every weight in ``dtype``
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for name in (
            "num_layers",
            "hidden_size",
            "num_heads",
            "num_kv_heads",
            "intermediate_size",
            "vocab_size",
            "max_position_embeddings",
        ):
            value = getattr(self, name)
            if not _is_positive_int(value):
                raise KvbenchError(f"model {self.name!r}: {name} must be a positive integer, got {value!r}")
            if value > SHAPE_LIMITS[name]:
                raise KvbenchError(
                    f"model {self.name!r}: {name} of {value:,} is above {SHAPE_LIMITS[name]:,}, more than any "
                    "model has: a broken config"
                )
        eos = self.eos_token_id
        if eos is not None and (not _is_int(eos) or not 0 <= eos < self.vocab_size):
            raise KvbenchError(
                f"model {self.name!r}: eos_token_id {eos!r} is outside its vocabulary of {self.vocab_size:,} ids "
                "(the model could never produce it, so no answer would end)"
            )
        if self.num_heads % self.num_kv_heads:
            raise KvbenchError(
                f"model {self.name!r}: num_heads ({self.num_heads}) is not a multiple of num_kv_heads "
                f"({self.num_kv_heads})"
            )
        if not isinstance(self.head_dim, int) or isinstance(self.head_dim, bool) or self.head_dim < 0:
            raise KvbenchError(f"model {self.name!r}: head_dim must be a positive integer, got {self.head_dim!r}")
        if self.head_dim == 0:
            if self.hidden_size % self.num_heads:
                raise KvbenchError(f"model {self.name!r}: hidden_size is not a multiple of num_heads")
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.dtype not in DTYPE_BYTES:
            raise KvbenchError(f"unknown dtype {self.dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
        if self.kv_dtype != "auto" and self.kv_dtype not in KV_DTYPE_BYTES:
            raise KvbenchError(
                f"unknown KV cache dtype {self.kv_dtype!r}; choose auto or one of {', '.join(KV_DTYPE_BYTES)}"
            )
        if self.architecture not in ("llama", "opt"):
            raise KvbenchError(f"model {self.name!r}: unknown architecture {self.architecture!r}; choose llama or opt")
        if self.architecture == "llama":
            self._check_rotary()
        elif self.moe is not None or self.mla is not None:
            raise KvbenchError(
                f"model {self.name!r}: mixture of experts and latent attention are costed for the "
                "llama architecture only"
            )
        if self.moe is not None:
            if self.moe.num_moe_layers > self.num_layers:
                raise KvbenchError(
                    f"model {self.name!r}: {self.moe.num_moe_layers} MoE layers but only {self.num_layers} layers"
                )
            self._check_layer_indices(self.moe.layers or (), "MoE layer")
        self._check_windows()
        if not isinstance(self.norms_per_layer, int) or self.norms_per_layer < 0:
            raise KvbenchError(f"model {self.name!r}: norms_per_layer must be >= 0, got {self.norms_per_layer!r}")
        if not isinstance(self.vision_parameters, int) or self.vision_parameters < 0:
            raise KvbenchError(f"model {self.name!r}: vision_parameters must be >= 0")

    def _check_rotary(self) -> None:
        try:
            check_rotary_head_dim(self.head_dim)
            check_rope_theta(self.rope_theta)
            split_rope_scaling(self.rope_scaling)
        except KvbenchError as err:
            raise KvbenchError(f"model {self.name!r}: {err}") from None

    def _check_layer_indices(self, indices: tuple[int, ...], what: str) -> None:
        if any(not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < self.num_layers for i in indices) or len(
            set(indices)
        ) != len(indices):
            raise KvbenchError(
                f"model {self.name!r}: {what} indices must be distinct layers in "
                f"[0, {self.num_layers}), got {list(indices)!r}"
            )

    def _check_windows(self) -> None:
        object.__setattr__(self, "sliding_layers", tuple(sorted(self.sliding_layers)))
        self._check_layer_indices(self.sliding_layers, "sliding-window layer")
        if self.sliding_layers and not _is_positive_int(self.sliding_window):
            raise KvbenchError(
                f"model {self.name!r}: sliding_window must be a positive integer, got {self.sliding_window!r}"
            )
        if not self.sliding_layers:
            object.__setattr__(self, "sliding_window", None)

    # ------------------------------------------------------------------------------------------- KV cache

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype] if self.kv_dtype == "auto" else KV_DTYPE_BYTES[self.kv_dtype]

    @property
    def kv_values_per_layer(self) -> int:
        """Values one token caches in one layer: K and V of every KV head, or MLA's latent and rotary key."""
        if self.mla is not None:
            return self.mla.cache_values
        return 2 * self.num_kv_heads * self.head_dim

    @property
    def bytes_per_token(self) -> int:
        """KV bytes of one token in every layer: 2 (K and V) x layers x KV heads x head_dim x dtype bytes, or
        layers x (kv_lora_rank + qk_rope_head_dim) x dtype bytes with latent attention. Windowed layers are
        counted as if they grew with the context: see :meth:`kv_bytes` for what a context really holds."""
        return self.num_layers * self.kv_values_per_layer * self.kv_dtype_bytes

    @property
    def full_attention_layers(self) -> int:
        return self.num_layers - len(self.sliding_layers)

    def kv_bytes(self, tokens: int) -> int:
        """KV bytes of one context of ``tokens`` tokens: windowed layers keep at most ``sliding_window``."""
        windowed = 0
        if self.sliding_layers:
            assert self.sliding_window is not None  # __post_init__ refuses windowed layers without a window
            windowed = min(tokens, self.sliding_window)
        cached = self.full_attention_layers * tokens + len(self.sliding_layers) * windowed
        return cached * self.kv_values_per_layer * self.kv_dtype_bytes

    @property
    def context_length(self) -> int:
        """The longest context the model is meant for: ``max_position_embeddings``, stretched by rope scaling."""
        if self.architecture != "llama":
            return self.max_position_embeddings
        rope_type, params = split_rope_scaling(self.rope_scaling)
        return scaled_context_length(rope_type, params, self.max_position_embeddings)

    # ------------------------------------------------------------------------------------------- weights

    def moe_layer_indices(self) -> tuple[int, ...]:
        if self.moe is None:
            return ()
        if self.moe.layers is not None:
            return tuple(self.moe.layers)
        return tuple(range(self.num_layers - self.moe.num_moe_layers, self.num_layers))

    def _attention_groups(self) -> list[WeightGroup]:
        h, heads = self.hidden_size, self.num_heads
        if self.mla is not None:
            mla = self.mla
            qk_dim = mla.qk_nope_head_dim + mla.qk_rope_head_dim
            if mla.q_lora_rank:
                groups = [
                    WeightGroup("mla_down", mla.q_lora_rank, h),
                    vector("norm", mla.q_lora_rank),
                    WeightGroup("mla_up", heads * qk_dim, mla.q_lora_rank),
                ]
            else:
                groups = [WeightGroup("attn_q", heads * qk_dim, h)]
            return groups + [
                WeightGroup("mla_down", mla.kv_lora_rank + mla.qk_rope_head_dim, h),
                vector("norm", mla.kv_lora_rank),
                WeightGroup("mla_up", heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank),
                WeightGroup("attn_o", h, heads * mla.v_head_dim),
            ]
        q_out, kv_out = heads * self.head_dim, self.num_kv_heads * self.head_dim
        groups = [
            WeightGroup("attn_q", q_out, h),
            WeightGroup("attn_kv", kv_out, h, 2),
            WeightGroup("attn_o", h, q_out),
        ]
        opt = self.architecture == "opt"
        if self.qkv_bias or opt:
            groups.append(vector("bias", q_out + 2 * kv_out))
        if self.o_bias or opt:
            groups.append(vector("bias", h))
        if self.qk_norm:
            groups.append(vector("norm", self.head_dim, 2))
        if self.attention_sinks:
            groups.append(vector("sink", heads))
        return groups

    def _dense_mlp_groups(self) -> list[WeightGroup]:
        h, inter = self.hidden_size, self.intermediate_size
        if self.architecture == "opt":
            return [WeightGroup("mlp", inter, h), WeightGroup("mlp", h, inter), vector("bias", inter + h)]
        groups = [WeightGroup("mlp", inter, h, 2), WeightGroup("mlp", h, inter)]
        if self.mlp_bias:
            groups.append(vector("bias", 2 * inter + h))
        return groups

    def layer_weights(self, index: int, routed_experts: int | None = None) -> list[WeightGroup]:
        """The weights of decoder layer ``index``; ``routed_experts`` counts that many experts (default: all)."""
        norms = (
            [vector("norm", 2 * self.hidden_size, 2)]
            if self.architecture == "opt"
            else [vector("norm", self.hidden_size, self.norms_per_layer)]
            if self.norms_per_layer
            else []
        )
        if self.moe is not None and index in self._moe_set():
            experts = self.moe.num_experts if routed_experts is None else routed_experts
            mlp = self.moe.block_groups(self.hidden_size, experts)
        else:
            mlp = self._dense_mlp_groups()
        return self._attention_groups() + mlp + norms

    def _moe_set(self) -> frozenset[int]:
        return frozenset(self.moe_layer_indices())

    def outer_weights(self) -> list[tuple[WeightGroup, str]]:
        """Weights outside the decoder layers with where a pipeline keeps them: ``first`` or ``last`` stage."""
        h = self.hidden_size
        outer = [(WeightGroup("embed", self.vocab_size, h), "first")]
        if self.architecture == "opt":
            outer.append((WeightGroup("position", self.max_position_embeddings + 2, h), "first"))
        if self.vision_parameters:
            outer.append((vector("vision", self.vision_parameters), "first"))
        outer.append((vector("norm", 2 * h if self.architecture == "opt" else h), "last"))
        if not self.tie_word_embeddings:
            outer.append((WeightGroup("lm_head", self.vocab_size, h), "last"))
        return outer

    def weight_groups(self, routed_experts: int | None = None) -> list[WeightGroup]:
        """Every weight of the model, layer groups multiplied out over the layers that share them."""
        moe_layers = len(self.moe_layer_indices())
        dense_layers = self.num_layers - moe_layers
        groups = [group for group, _ in self.outer_weights()]
        for index, count in (
            (self.representative_layer(False), dense_layers),
            (self.representative_layer(True), moe_layers),
        ):
            if count and index is not None:
                groups += [replace(g, count=g.count * count) for g in self.layer_weights(index, routed_experts)]
        return groups

    def representative_layer(self, moe: bool) -> int | None:
        """The first layer with (``moe``) or without experts; None when there is none."""
        moe_set = self._moe_set()
        return next((i for i in range(self.num_layers) if (i in moe_set) == moe), None)

    @property
    def num_parameters(self) -> int:
        """Parameter count from the shape (embeddings, attention, MLP or every expert and router, norms, LM head)."""
        return sum(group.parameters for group in self.weight_groups())

    @property
    def active_parameters(self) -> int:
        """Parameters one token runs through: all of a dense model; the dense part and its top-k experts of an MoE.

        Like :attr:`num_parameters` it counts the embeddings, so ``2 x active_parameters`` FLOPs per token is
        the usual (slightly high) estimate.
        """
        routed = self.moe.experts_per_token if self.moe else None
        return sum(group.parameters for group in self.weight_groups(routed))

    def group_bytes(self, group: WeightGroup) -> int:
        """Bytes of a weight group as the checkpoint stores it (quantized or in ``dtype``)."""
        if self.weight_format is None:
            return group.parameters * self.dtype_bytes
        return self.weight_format.group_bytes(group, self.dtype_bytes)

    @property
    def weight_bytes(self) -> int:
        return sum(self.group_bytes(group) for group in self.weight_groups())

    @property
    def routed_expert_bytes(self) -> int:
        """Bytes of one routed expert summed over the MoE layers (0 for a dense model)."""
        if self.moe is None:
            return 0
        index = self.representative_layer(True)
        assert index is not None  # an MoE spec names at least one MoE layer (MoeSpec checks)
        experts = [g for g in self.layer_weights(index) if g.role == "expert"]
        per_layer = sum(self.group_bytes(g) for g in experts) / self.moe.num_experts
        return round(per_layer * self.moe.num_moe_layers)

    def with_dtype(self, dtype: str) -> ModelShape:
        if dtype not in DTYPE_BYTES:
            raise KvbenchError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPE_BYTES)}")
        return replace(self, dtype=dtype)

    def with_kv_dtype(self, kv_dtype: str) -> ModelShape:
        """The same model with its KV cache in ``kv_dtype`` (``auto``: the model's dtype)."""
        return replace(self, kv_dtype=kv_dtype)

    def to_dict(self) -> dict[str, Any]:
        """The fields and derived bytes; fields beyond a dense Llama's appear only when set, so dense models keep
        their keys."""
        data = asdict(self)
        for name in ("extra", "weight_format"):
            data.pop(name)
        defaults = {
            "moe": None,
            "qkv_bias": False,
            "o_bias": False,
            "mlp_bias": False,
            "kv_dtype": "auto",
            "sliding_window": None,
            "sliding_layers": (),
            "mla": None,
            "qk_norm": False,
            "norms_per_layer": 2,
            "attention_sinks": False,
            "vision_parameters": 0,
        }
        for name, default in defaults.items():
            if data[name] == default:
                data.pop(name)
        if "sliding_layers" in data:
            data["sliding_layers"] = list(data["sliding_layers"])
        if self.moe is not None:
            data["moe"] = {
                k: v
                for k, v in data["moe"].items()
                if v is not None
                and not (k in ("expert_bias", "router_bias") and v is False)
                and not (k == "shared_expert_gate" and not self.moe.shared_expert_intermediate_size)
            }
        data.update(
            bytes_per_token=self.bytes_per_token,
            num_parameters=self.num_parameters,
            weight_bytes=self.weight_bytes,
        )
        if self.weight_format is not None:
            data["weight_format"] = self.weight_format.to_dict()
        if self.moe is not None:
            data["active_parameters"] = self.active_parameters
        return data


MODEL_PRESETS: dict[str, ModelShape] = {
    # Small enough for CPU sweeps on 2 cores; GQA (4 query heads share 2 KV heads) to exercise grouping.
    "tiny": ModelShape(
        "tiny",
        num_layers=2,
        hidden_size=64,
        num_heads=4,
        num_kv_heads=2,
        intermediate_size=128,
        vocab_size=512,
        max_position_embeddings=4096,
        dtype="fp32",
    ),
    "llama-2-7b": ModelShape("llama-2-7b", 32, 4096, 32, 32, 11008, 32000, 4096),
    "llama-2-13b": ModelShape("llama-2-13b", 40, 5120, 40, 40, 13824, 32000, 4096),
    "llama-2-70b": ModelShape("llama-2-70b", 80, 8192, 64, 8, 28672, 32000, 4096),
    "llama-3-8b": ModelShape("llama-3-8b", 32, 4096, 32, 8, 14336, 128256, 8192, rope_theta=500000.0),
    # the same shape with a 128k context (llama3 rope scaling): long prompts, as chat and agent traces send
    "llama-3.1-8b": ModelShape(
        "llama-3.1-8b",
        32,
        4096,
        32,
        8,
        14336,
        128256,
        131072,
        rope_theta=500000.0,
        rope_scaling={
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    ),
    "opt-13b": ModelShape(
        "opt-13b", 40, 5120, 40, 40, 20480, 50272, 2048, architecture="opt", tie_word_embeddings=True
    ),
}


def preset_names() -> list[str]:
    return list(MODEL_PRESETS)
