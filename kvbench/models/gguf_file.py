"""GGUF files (llama.cpp, Ollama): the header read without loading weights, and the model shape it describes.

A GGUF file is a header (metadata key/values, then one record per tensor: name, dims, type, offset) followed
by the tensor data. kvbench reads only the header, with its own small parser, so ``waste``, ``capacity`` and
the pre-flight checks see a GGUF model's shape in milliseconds and without the optional ``gguf`` package;
the weights are loaded (and dequantized) through ``transformers`` only when a model runs.
"""

from __future__ import annotations

import hashlib
import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError
from kvbench.models.quantization import GgufStorage
from kvbench.models.shapes import ModelShape, MoeSpec

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
SHORT_ARRAY = 64  # arrays up to this length keep their values; longer ones (vocabularies, merges) only a count
# metadata value types of the GGUF format: scalars by struct code; 8 is a string, 9 an array
_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9
# llama.cpp architecture names whose shape kvbench reads (the tensor engine runs the dense Llama ones)
GGUF_ARCHITECTURES = {"llama": "llama", "mistral": "mistral", "qwen2": "qwen2"}
# `general.file_type` values with unquantized weights
_FILE_TYPES = {0: "fp32", 1: "fp16", 32: "bf16"}
# ggml tensor types: id -> (name, elements per block, bytes per block), as ggml defines its block layouts
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
}
# llama.cpp tensor names -> weight roles (kvbench.models.weights): the last name part before ".weight"/".bias"
_GGUF_ROLES = {
    "token_embd": "embed",
    "output": "lm_head",
    "attn_q": "attn_q",
    "attn_k": "attn_kv",
    "attn_v": "attn_kv",
    "attn_qkv": "attn_q",
    "attn_output": "attn_o",
    "ffn_gate": "mlp",
    "ffn_up": "mlp",
    "ffn_down": "mlp",
    "ffn_gate_exps": "expert",
    "ffn_up_exps": "expert",
    "ffn_down_exps": "expert",
    "ffn_gate_inp": "router",
    "ffn_gate_shexp": "shared_expert",
    "ffn_up_shexp": "shared_expert",
    "ffn_down_shexp": "shared_expert",
}


@dataclass(frozen=True)
class ArrayInfo:
    """A long metadata array: its element type and length (the values are not kept)."""

    item_type: int
    count: int


@dataclass(frozen=True)
class GgufTensor:
    name: str
    dims: tuple[int, ...]  # GGUF order: the fastest-varying dimension first
    ggml_type: int
    offset: int  # from the start of the data section


@dataclass
class GgufHeader:
    path: Path
    version: int
    metadata: dict[str, Any]
    tensors: list[GgufTensor]
    data_start: int
    file_size: int
    header_sha256: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    def tensor(self, name: str) -> GgufTensor | None:
        return next((t for t in self.tensors if t.name == name), None)


def is_gguf(path: Path) -> bool:
    """Whether ``path`` is a file that starts with the GGUF magic (or is named ``*.gguf``)."""
    if not path.is_file():
        return False
    if path.suffix.lower() == ".gguf":
        return True
    try:
        with path.open("rb") as handle:
            return handle.read(4) == MAGIC
    except OSError:
        return False


class _Cursor:
    """Sequential little-endian reads over a buffer; running past its end is a truncated file."""

    def __init__(self, buffer, path: Path) -> None:
        self.buffer = buffer
        self.size = len(buffer)
        self.pos = 0
        self.path = path

    def _need(self, count: int) -> None:
        if count < 0 or self.pos + count > self.size:
            raise KvbenchError(
                f"truncated GGUF file {self.path}: its header runs past the end of the file "
                f"({self.size:,} bytes); download it again"
            )

    def scalar(self, code: str) -> Any:
        width = struct.calcsize(code)
        self._need(width)
        value = struct.unpack_from(code, self.buffer, self.pos)[0]
        self.pos += width
        return value

    def string(self) -> str:
        length = self.scalar("<Q")
        self._need(length)
        raw = bytes(self.buffer[self.pos : self.pos + length])
        self.pos += length
        return raw.decode("utf-8", errors="replace")

    def skip_string(self) -> None:
        length = self.scalar("<Q")
        self._need(length)
        self.pos += length

    def value(self, kind: int, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            if depth >= MAX_ARRAY_DEPTH:
                raise KvbenchError(
                    f"malformed GGUF file {self.path}: metadata arrays nested deeper than {MAX_ARRAY_DEPTH} levels"
                )
            item_type, count = self.scalar("<I"), self.scalar("<Q")
            if count <= SHORT_ARRAY:
                return [self.value(item_type, depth + 1) for _ in range(count)]
            if item_type in _SCALARS:
                width = struct.calcsize(_SCALARS[item_type])
                self._need(width * count)
                self.pos += width * count
            elif item_type == _STRING:
                for _ in range(count):
                    self.skip_string()
            else:
                for _ in range(count):
                    self.value(item_type, depth + 1)
            return ArrayInfo(item_type, count)
        raise KvbenchError(f"malformed GGUF file {self.path}: unknown metadata value type {kind}")


MAX_ARRAY_DEPTH = 8  # llama.cpp writes flat arrays; nesting deeper than this is no model's metadata


def read_gguf_header(path: str | Path) -> GgufHeader:
    """The metadata and tensor records of a GGUF file, checked against its size (a cut-short file is refused)."""
    path = Path(path)
    if not path.is_file():
        raise KvbenchError(f"GGUF file not found: {path}")
    try:
        with path.open("rb") as handle:
            size = path.stat().st_size
            if size < 24:
                raise KvbenchError(f"truncated GGUF file {path}: {size} bytes, too short for a GGUF header")
            with mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as buffer:
                return _parse(buffer, path, size)
    except OSError as err:
        raise KvbenchError(f"cannot read GGUF file {path}: {err.strerror or err}") from None


def _parse(buffer, path: Path, size: int) -> GgufHeader:
    cursor = _Cursor(buffer, path)
    if bytes(buffer[:4]) != MAGIC:
        raise KvbenchError(f"{path} is not a GGUF file (it does not start with the GGUF magic bytes)")
    cursor.pos = 4
    version = cursor.scalar("<I")
    if version not in (2, 3):
        raise KvbenchError(f"unsupported GGUF version {version} in {path}: kvbench reads versions 2 and 3")
    tensor_count, kv_count = cursor.scalar("<Q"), cursor.scalar("<Q")
    if tensor_count > size or kv_count > size:  # each entry takes bytes: a larger count is a damaged header
        raise KvbenchError(
            f"malformed GGUF file {path}: {tensor_count:,} tensors and {kv_count:,} metadata entries "
            f"cannot fit in {size:,} bytes"
        )
    metadata: dict[str, Any] = {}
    for _ in range(kv_count):
        key = cursor.string()
        metadata[key] = cursor.value(cursor.scalar("<I"))
    tensors = []
    for _ in range(tensor_count):
        name = cursor.string()
        n_dims = cursor.scalar("<I")
        if n_dims > 8:
            raise KvbenchError(f"malformed GGUF file {path}: tensor {name!r} has {n_dims} dimensions")
        dims = tuple(cursor.scalar("<Q") for _ in range(n_dims))
        tensors.append(GgufTensor(name, dims, cursor.scalar("<I"), cursor.scalar("<Q")))
    alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(alignment, int) or alignment < 1:
        raise KvbenchError(f"malformed GGUF file {path}: general.alignment must be a positive integer")
    data_start = -(-cursor.pos // alignment) * alignment
    header = GgufHeader(
        path, version, metadata, tensors, data_start, size, hashlib.sha256(bytes(buffer[: cursor.pos])).hexdigest()
    )
    _check_data_fits(header)
    return header


def tensor_numel(tensor: GgufTensor) -> int:
    elements = 1
    for dim in tensor.dims:
        elements *= dim
    return elements


def tensor_nbytes(tensor: GgufTensor) -> int | None:
    """Bytes of a tensor's data from its ggml type's block layout; None for a type kvbench does not know."""
    known = GGML_TYPES.get(tensor.ggml_type)
    if known is None:
        return None
    _, block, block_bytes = known
    return -(-tensor_numel(tensor) // block) * block_bytes


def gguf_storage(header: GgufHeader) -> GgufStorage:
    """The bytes each weight role takes in the file, from every tensor's own type (K-quant mixes included)."""
    role_bytes: dict[str, int] = {}
    role_numel: dict[str, int] = {}
    type_bytes: dict[str, int] = {}
    for tensor in header.tensors:
        nbytes = tensor_nbytes(tensor)
        if nbytes is None:
            raise KvbenchError(
                f"GGUF file {header.path}: tensor {tensor.name!r} has ggml type {tensor.ggml_type}, "
                "which kvbench cannot size"
            )
        parts = tensor.name.split(".")
        base = parts[-2] if len(parts) >= 2 and parts[-1] in ("weight", "bias") else parts[-1]
        role = _GGUF_ROLES.get(base, "norm" if "norm" in base else "bias")
        role_bytes[role] = role_bytes.get(role, 0) + nbytes
        role_numel[role] = role_numel.get(role, 0) + tensor_numel(tensor)
        name = GGML_TYPES[tensor.ggml_type][0]
        type_bytes[name] = type_bytes.get(name, 0) + nbytes
    return GgufStorage(tuple(role_bytes.items()), tuple(role_numel.items()), tuple(type_bytes.items()))


def _check_data_fits(header: GgufHeader) -> None:
    """Every tensor's data lies inside the file (its whole extent when the type's size is known)."""
    end = header.data_start
    for tensor in header.tensors:
        nbytes = tensor_nbytes(tensor)
        end = max(end, header.data_start + tensor.offset + (nbytes if nbytes is not None else 1))
    if end > header.file_size:
        raise KvbenchError(
            f"truncated GGUF file {header.path}: its tensors need {end:,} bytes but the file has "
            f"{header.file_size:,}; download it again"
        )


# ---------------------------------------------------------------------------------------------- the shape


def _positive(header: GgufHeader, key: str, default: Any = None) -> int:
    value = header.metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        problem = "missing" if value is None else f"must be a positive integer, got {value!r}"
        raise KvbenchError(f"malformed GGUF file {header.path}: metadata {key} {problem}")
    return value


def _number(header: GgufHeader, key: str, default: float) -> float:
    value = header.metadata.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise KvbenchError(
            f"malformed GGUF file {header.path}: metadata {key} must be a positive number, got {value!r}"
        )
    return float(value)


def _rope_scaling(header: GgufHeader, arch: str) -> dict[str, Any] | None:
    kind = header.metadata.get(f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    factor = _number(header, f"{arch}.rope.scaling.factor", 1.0)
    if kind == "linear":
        return {"rope_type": "linear", "factor": factor}
    if kind == "yarn":
        original = _positive(header, f"{arch}.rope.scaling.original_context_length")
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original}
    raise KvbenchError(f"unsupported rope scaling {kind!r} in {header.path}: kvbench reads linear and yarn")


def _vocab_size(header: GgufHeader, arch: str) -> int:
    if f"{arch}.vocab_size" in header.metadata:
        return _positive(header, f"{arch}.vocab_size")
    embedding = header.tensor("token_embd.weight")
    if embedding is not None and len(embedding.dims) == 2:
        return embedding.dims[1]
    tokens = header.metadata.get("tokenizer.ggml.tokens")
    count = tokens.count if isinstance(tokens, ArrayInfo) else len(tokens or [])
    if count < 1:
        raise KvbenchError(
            f"malformed GGUF file {header.path}: no vocabulary size (no {arch}.vocab_size, "
            "token_embd.weight or tokenizer tokens)"
        )
    return count


def shape_from_gguf_header(header: GgufHeader) -> ModelShape:
    """The model shape a GGUF header describes; an architecture kvbench does not read is refused by name."""
    raw = header.architecture
    model_type = GGUF_ARCHITECTURES.get(raw)
    if model_type is None:
        raise KvbenchError(
            f"unsupported architecture {raw or 'unknown'!r} in GGUF file {header.path}: kvbench "
            f"reads the GGUF architectures {', '.join(GGUF_ARCHITECTURES)}"
        )
    arch = raw
    hidden = _positive(header, f"{arch}.embedding_length")
    heads = _positive(header, f"{arch}.attention.head_count")
    kv_heads = _positive(header, f"{arch}.attention.head_count_kv", heads)
    head_dim = header.metadata.get(f"{arch}.attention.key_length") or hidden // heads
    experts = header.metadata.get(f"{arch}.expert_count") or 0
    layers = _positive(header, f"{arch}.block_count")
    intermediate = _positive(header, f"{arch}.feed_forward_length")
    moe = None
    if experts:
        moe = MoeSpec(
            num_experts=experts,
            experts_per_token=_positive(header, f"{arch}.expert_used_count"),
            expert_intermediate_size=intermediate,
            num_moe_layers=layers,
        )
    eos = header.metadata.get("tokenizer.ggml.eos_token_id")
    try:
        return ModelShape(
            name=header.path.stem,  # the file name users know (general.name is often a training-run label)
            num_layers=layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            intermediate_size=intermediate,
            vocab_size=_vocab_size(header, arch),
            max_position_embeddings=_positive(header, f"{arch}.context_length", 2048),
            head_dim=head_dim,
            rope_theta=_number(header, f"{arch}.rope.freq_base", 10000.0),
            rope_scaling=_rope_scaling(header, arch),
            rms_norm_eps=_number(header, f"{arch}.attention.layer_norm_rms_epsilon", 1e-5),
            tie_word_embeddings=header.tensor("output.weight") is None,
            dtype=_FILE_TYPES.get(header.metadata.get("general.file_type", -1), "fp16"),
            eos_token_id=eos if isinstance(eos, int) and not isinstance(eos, bool) else None,
            moe=moe,
            qkv_bias=model_type == "qwen2",
            weight_format=gguf_storage(header) if header.tensors else None,
            extra={"model_type": model_type, "gguf": True},
        )
    except KvbenchError as err:
        raise KvbenchError(f"malformed GGUF file {header.path}: {err}") from None


def shape_from_gguf(path: str | Path) -> ModelShape:
    return shape_from_gguf_header(read_gguf_header(path))


def gguf_fingerprint(path: str | Path) -> str:
    """A content hash of the header (metadata and tensor table) and the file size: cheap for multi-GB files."""
    header = read_gguf_header(path)
    return f"{header.header_sha256}:{header.file_size}"
