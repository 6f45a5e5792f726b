"""How a checkpoint stores its weights: bytes per weight group for quantized formats.

A Hugging Face ``quantization_config`` names the method; each method stores the decoder layers' matrices
(:data:`kvbench.models.weights.QUANTIZABLE_ROLES`) in its own layout, and everything else (embeddings, the LM
head, norms, routers, biases, modules it lists as not converted) in the checkpoint's dtype. The layouts, for a
matrix of ``out x in`` features quantized in groups of ``g`` input features (``G = ceil(in / g)``):

- AWQ (``awq``): packed ``b``-bit weights ``in x out x b/8``, fp16 scales ``G x out x 2``, packed zeros
  ``G x out x b/8``.
- GPTQ (``gptq``): the same plus the int32 group index of every input feature, ``in x 4``.
- FP8 (``fp8``): one byte per weight, plus float32 scales: one per ``bn x bk`` block with ``weight_block_size``,
  else one per tensor (two with static activation scales).
- bitsandbytes 4-bit: half a byte per weight plus a float32 absmax per 64 weights (with double quantization an
  8-bit absmax per 64 and a float32 per 256 of those); 8-bit (LLM.int8): a byte per weight plus a float32 scale
  per output row.
- MXFP4 (``mxfp4``, gpt-oss): half a byte per weight plus an 8-bit scale per 32.
- compressed-tensors (``compressed-tensors``): ``num_bits`` per weight plus one scale per tensor, output channel,
  group or block, in the checkpoint's dtype.

Small per-tensor constants (bitsandbytes' 16- and 256-entry code books, a packed tensor's recorded shape) are
left out. A GGUF file's tensor table gives its bytes exactly: :class:`GgufStorage`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from kvbench.errors import KvbenchError
from kvbench.models.weights import QUANTIZABLE_ROLES, WeightGroup

QUANT_METHODS = ("awq", "gptq", "fp8", "bitsandbytes", "mxfp4", "compressed-tensors")
_ATTENTION_ROLES = frozenset({"attn_q", "attn_kv", "attn_o", "mla_down", "mla_up"})


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class WeightFormat:
    """A weight-only quantization of the quantizable matrices (see the module docstring for each layout)."""

    method: str
    bits: int
    group_size: int = 0  # input features per scale; 0: one scale per output channel (or per tensor, see scales)
    block: tuple[int, int] | None = None  # (output, input) features per scale block (fp8, compressed-tensors)
    scales: str = "group"  # group | channel | tensor | block
    scale_bytes: int = 2
    zero_points: bool = False
    group_index: bool = False  # GPTQ's int32 per input feature
    double_quant: bool = False  # bitsandbytes 4-bit
    static_activation_scale: bool = False  # fp8 per-tensor with a stored input scale
    skipped_roles: frozenset[str] = field(default_factory=frozenset)  # kept in the checkpoint's dtype
    label: str = ""

    def quantizes(self, group: WeightGroup) -> bool:
        return group.quantizable and group.role not in self.skipped_roles

    def group_bytes(self, group: WeightGroup, dtype_bytes: int) -> int:
        """Bytes of the ``count`` tensors of ``group`` as stored."""
        if not self.quantizes(group):
            return group.parameters * dtype_bytes
        return self._matrix_bytes(group.rows, group.cols, dtype_bytes) * group.count

    def _matrix_bytes(self, rows: int, cols: int, dtype_bytes: int) -> int:
        numel = rows * cols
        if self.method == "bitsandbytes":
            if self.bits == 8:
                return numel + rows * 4  # int8 weights + a float32 scale per output row (SCB)
            blocks = _ceil(numel, 64)
            absmax = blocks + _ceil(blocks, 256) * 4 if self.double_quant else blocks * 4
            return _ceil(numel, 2) + absmax
        if self.method == "mxfp4":
            return _ceil(numel, 2) + _ceil(numel, 32)
        weights = _ceil(numel * self.bits, 8)
        if self.scales == "block" and self.block is not None:
            count = _ceil(rows, self.block[0]) * _ceil(cols, self.block[1])
        elif self.scales == "tensor":
            count = 2 if self.static_activation_scale else 1
        elif self.scales == "channel" or self.group_size <= 0:
            count = rows
        else:
            count = rows * _ceil(cols, self.group_size)
        total = weights + count * self.scale_bytes
        if self.zero_points:
            total += _ceil(count * self.bits, 8) if self.method in ("awq", "gptq") else count * self.scale_bytes
        if self.group_index:
            total += cols * 4
        return total

    def describe(self) -> str:
        return self.label or self.method

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {"method": self.method, "bits": self.bits, "description": self.describe()}
        if self.skipped_roles:
            data["kept_in_model_dtype"] = sorted(self.skipped_roles & QUANTIZABLE_ROLES)
        return data


@dataclass(frozen=True)
class GgufStorage:
    """A GGUF file's weights: bytes per role summed from its tensor table (each tensor's own ggml type).

    A role's bytes are spread over the shape's groups of that role in proportion to their elements, so the
    total is the file's exactly and a tensor-parallel share is the role's average rate times its elements.
    """

    role_bytes: tuple[tuple[str, int], ...]
    role_numel: tuple[tuple[str, int], ...]
    type_bytes: tuple[tuple[str, int], ...]  # ggml type name -> bytes, for the description
    method: str = "gguf"

    def group_bytes(self, group: WeightGroup, dtype_bytes: int) -> int:
        numel = dict(self.role_numel).get(group.role)
        if not numel:
            return group.parameters * dtype_bytes
        return round(group.parameters * dict(self.role_bytes)[group.role] / numel)

    @property
    def file_bytes(self) -> int:
        return sum(size for _, size in self.role_bytes)

    def describe(self) -> str:
        total = sum(size for _, size in self.type_bytes) or 1
        parts = sorted(self.type_bytes, key=lambda item: -item[1])
        return "GGUF " + ", ".join(f"{name} {100 * size / total:.0f}%" for name, size in parts[:4])

    def to_dict(self) -> dict[str, Any]:
        return {"method": "gguf", "description": self.describe(), "bytes_by_type": dict(self.type_bytes)}


# ---------------------------------------------------------------------------------------------- config


def roles_of_modules(names: Any) -> frozenset[str]:
    """Roles named by a list of module names or patterns (``modules_to_not_convert``, ``ignore``, ...)."""
    if not isinstance(names, list):
        return frozenset()
    roles: set[str] = set()
    for raw in names:
        if not isinstance(raw, str):
            continue
        name = raw.removeprefix("re:").lower()
        leaf = re.split(r"[.*:$\\]+", name.rstrip(".*$"))[-1] if name else ""
        if "lm_head" in name:
            roles.add("lm_head")
        elif "embed" in name:
            roles.add("embed")
        elif "vision" in name or "visual" in name or "multi_modal" in name:
            roles.add("vision")
        elif "router" in name or leaf == "gate":
            roles.add("router")
        elif "shared_expert" in name:
            roles.add("shared_expert")
        elif "experts" in name:
            roles.add("expert")
        elif re.search(r"q_a_proj|kv_a_proj", name):
            roles.add("mla_down")
        elif re.search(r"q_b_proj|kv_b_proj", name):
            roles.add("mla_up")
        elif re.search(r"q_proj", name):
            roles.add("attn_q")
        elif re.search(r"[kv]_proj", name):
            roles.add("attn_kv")
        elif re.search(r"o_proj", name):
            roles.add("attn_o")
        elif "attn" in name or "attention" in name:
            roles |= _ATTENTION_ROLES
        elif "mlp" in name or "feed_forward" in name:
            roles |= {"mlp", "expert", "shared_expert", "router"}
    return frozenset(roles)


def _int(config: dict[str, Any], name: str, default: Any, where: str) -> int:
    value = config.get(name, default)
    if value is None:
        value = default
    if isinstance(value, bool) or not isinstance(value, int):
        raise KvbenchError(f"{where}.{name} must be an integer, got {value!r}")
    return value


def _bits(config: dict[str, Any], where: str, allowed: tuple[int, ...], default: Any = None) -> int:
    bits = _int(config, "bits", default, where)
    if bits not in allowed:
        raise KvbenchError(f"{where}.bits must be one of {', '.join(map(str, allowed))}, got {bits}")
    return bits


def _group(config: dict[str, Any], where: str, default: int = 128) -> int:
    size = _int(config, "group_size", default, where)
    if size == 0 or size < -1:
        raise KvbenchError(f"{where}.group_size must be a positive integer or -1 (per channel), got {size}")
    return max(size, 0)


def format_from_config(config: Any, where: str = "quantization_config") -> WeightFormat | None:
    """The weight format a ``quantization_config`` describes; None when there is none. An unknown method, or a
    value outside its meaning, is refused in one line that names the field."""
    if config is None:
        return None
    if not isinstance(config, dict):
        raise KvbenchError(f"{where} must be a JSON object, got {config!r}")
    method = str(config.get("quant_method", "")).lower()
    skipped = roles_of_modules(config.get("modules_to_not_convert"))
    if method == "awq":
        bits = _bits(config, where, (4, 8), 4)
        group = _group(config, where)
        return WeightFormat(
            "awq",
            bits,
            group,
            zero_points=True,
            skipped_roles=skipped,
            label=f"AWQ {bits}-bit, group {group or 'per channel'}",
        )
    if method == "gptq":
        bits = _bits(config, where, (2, 3, 4, 8), 4)
        group = _group(config, where)
        return WeightFormat(
            "gptq",
            bits,
            group,
            zero_points=True,
            group_index=True,
            skipped_roles=skipped,
            label=f"GPTQ {bits}-bit, group {group or 'per channel'}",
        )
    if method == "fp8":
        return _fp8(config, where, skipped)
    if method == "bitsandbytes":
        return _bitsandbytes(config, where)
    if method == "mxfp4":
        return WeightFormat(
            "mxfp4", 4, 32, scale_bytes=1, skipped_roles=skipped, label="MXFP4 (4-bit values, an 8-bit scale per 32)"
        )
    if method == "compressed-tensors":
        return _compressed_tensors(config, where)
    raise KvbenchError(
        f"unsupported {where}.quant_method {method or None!r}: kvbench reads the weight formats "
        f"{', '.join(QUANT_METHODS)} (and GGUF files)"
    )


def _fp8(config: dict[str, Any], where: str, skipped: frozenset[str]) -> WeightFormat:
    block = config.get("weight_block_size")
    static = config.get("activation_scheme") == "static"
    skipped |= roles_of_modules(config.get("ignored_layers"))
    if block is None:
        return WeightFormat(
            "fp8",
            8,
            scales="tensor",
            scale_bytes=4,
            static_activation_scale=static,
            skipped_roles=skipped,
            label="FP8, a scale per tensor",
        )
    if (
        not isinstance(block, list)
        or len(block) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in block)
    ):
        raise KvbenchError(f"{where}.weight_block_size must be two positive integers such as [128, 128], got {block!r}")
    return WeightFormat(
        "fp8",
        8,
        block=(block[0], block[1]),
        scales="block",
        scale_bytes=4,
        skipped_roles=skipped,
        label=f"FP8, a scale per {block[0]}x{block[1]} block",
    )


def _flag(config: dict[str, Any], name: str) -> bool:
    value = config.get(name, config.get(f"_{name}", False))
    return value is True


def _bitsandbytes(config: dict[str, Any], where: str) -> WeightFormat:
    skipped = roles_of_modules(config.get("llm_int8_skip_modules"))
    if _flag(config, "load_in_4bit"):
        kind = str(config.get("bnb_4bit_quant_type", "fp4")).upper()
        double = config.get("bnb_4bit_use_double_quant") is True
        return WeightFormat(
            "bitsandbytes",
            4,
            64,
            double_quant=double,
            skipped_roles=skipped,
            label=f"bitsandbytes {kind}" + (" (double quantization)" if double else ""),
        )
    if _flag(config, "load_in_8bit"):
        return WeightFormat("bitsandbytes", 8, skipped_roles=skipped, label="bitsandbytes LLM.int8")
    raise KvbenchError(f"{where}: bitsandbytes without load_in_4bit or load_in_8bit")


def _compressed_tensors(config: dict[str, Any], where: str) -> WeightFormat:
    groups = config.get("config_groups")
    if not isinstance(groups, dict) or len(groups) != 1:
        raise KvbenchError(
            f"{where}.config_groups: kvbench reads one quantization group for all linear layers, "
            f"got {len(groups) if isinstance(groups, dict) else groups!r}"
        )
    ((name, spec),) = groups.items()
    weights = spec.get("weights") if isinstance(spec, dict) else None
    if not isinstance(weights, dict):
        raise KvbenchError(f"{where}.config_groups.{name}.weights must be a JSON object")
    inner = f"{where}.config_groups.{name}.weights"
    bits = _int(weights, "num_bits", None, inner)
    if bits not in (2, 3, 4, 8, 16):
        raise KvbenchError(f"{inner}.num_bits must be one of 2, 3, 4, 8, 16, got {bits}")
    strategy = str(weights.get("strategy", "tensor"))
    kind = str(weights.get("type", "int"))
    skipped = roles_of_modules(config.get("ignore"))
    scale_bytes = 1 if (kind == "float" and bits == 4) else 2  # NVFP4's fp8 group scales; else the model's dtype
    label = f"compressed-tensors {kind}{bits}, a scale per {strategy.replace('_', ' ')}"
    zero_points = weights.get("symmetric", True) is False
    common: dict[str, Any] = dict(scale_bytes=scale_bytes, zero_points=zero_points, skipped_roles=skipped, label=label)
    if strategy == "tensor":
        return WeightFormat("compressed-tensors", bits, scales="tensor", **common)
    if strategy == "channel":
        return WeightFormat("compressed-tensors", bits, scales="channel", **common)
    if strategy in ("group", "tensor_group"):
        return WeightFormat("compressed-tensors", bits, _group(weights, inner), **common)
    if strategy == "block":
        block = weights.get("block_structure")
        if not isinstance(block, list) or len(block) != 2 or not all(isinstance(v, int) and v > 0 for v in block):
            raise KvbenchError(f"{inner}.block_structure must be two positive integers, got {block!r}")
        return WeightFormat("compressed-tensors", bits, block=(block[0], block[1]), scales="block", **common)
    raise KvbenchError(f"{inner}.strategy {strategy!r} is not one kvbench reads (tensor, channel, group, block)")
