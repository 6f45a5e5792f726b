"""Linear layers on a CPU: each weight multiplied by the path this machine runs fastest at the step's row count.

The paths: the plain weight through ``F.linear`` (torch's BLAS), a copy packed once in oneDNN's layout (a plain
``F.linear`` re-lays out its weight at every call, a large part of a small decode matmul; vLLM's CPU engine packs
its weights the same way), and for a float32 weight that holds only bfloat16 values (a published checkpoint's) a
bfloat16 copy, half the bytes, multiplied at float32 accuracy: by AVX-512/AVX2 multiply-adds that widen it as they
read it (:mod:`kvbench.kernels.cpu_bf16_weights`) or, on a CPU with AMX, on the tiles (:mod:`kvbench.kernels.cpu_amx`).

Which is fastest depends on the CPU and the row count, by a lot: on a Sapphire Rapids the plain weight was 3-17%
faster than the packed one from 1,024 rows on; on a Zen 5 (where torch's BLAS takes a slow path) the packed one was
2.2-2.5x faster at every row count. So no threshold is built in: :mod:`kvbench.models.cpu_choices` times the paths
on the model's own weights at start-up and each weight carries its choice, the row ranges at which its plain
weight wins (``plain_for``). The packed copy is kept beside the model's own weights (the ``transformers`` model
keeps working for reference runs), one per model, shared by every runner over it; a weight whose plain path won at
every row count gets no copy. ``KVBENCH_PACKED_WEIGHTS=0`` turns packing off.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kvbench.kernels import cpu_amx, cpu_bf16_weights

ENV = "KVBENCH_PACKED_WEIGHTS"
BATCH_HINT = 16  # the batch size the packed layout is tuned for; any batch size works
PLAIN, ONEDNN, BF16W, AMX = "plain", "oneDNN-packed", "bf16-weights", "AMX"
RowRanges = tuple[tuple[int, int], ...]  # half-open [lo, hi) ranges of row counts
_CACHE_ATTR = "_kvbench_packed_weights"  # on the model: {(data_ptr, shape, path, plain_for): packed weight}


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing on this device and dtype, unless turned off by ``KVBENCH_PACKED_WEIGHTS=0``."""
    if os.environ.get(ENV, "1") == "0":
        return False
    return (device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


def candidate_paths(weight: torch.Tensor) -> tuple[str, ...]:
    """The paths ``weight`` can take on this machine: plain always; oneDNN where packing is available; for a float32
    weight holding only bfloat16 values, the bfloat16-weight kernel and, where the CPU has it, AMX."""
    if not packing_available(weight.device, weight.dtype):
        return (PLAIN,)
    paths = [PLAIN, ONEDNN]
    if cpu_bf16_weights.takes(weight):
        paths.append(BF16W)
    if cpu_amx.takes(weight):
        paths.append(AMX)
    return tuple(paths)


def default_path(weight: torch.Tensor) -> str:
    """The path a weight takes when nothing was measured: AMX where it takes the weight, else oneDNN's packed copy
    (plain without packing)."""
    paths = candidate_paths(weight)
    return AMX if AMX in paths else ONEDNN if ONEDNN in paths else PLAIN


@dataclass(frozen=True)
class PackedWeight:
    """A linear weight ``[out, in]`` with its copy in oneDNN's layout (opaque: use it only through :func:`linear`)."""

    plain: torch.Tensor
    packed: torch.Tensor
    plain_for: RowRanges = ()  # the row counts at which the plain weight is faster (measured)

    @property
    def shape(self) -> torch.Size:
        return self.plain.shape


CpuWeight = torch.Tensor | PackedWeight | cpu_amx.AmxWeight | cpu_bf16_weights.Bf16Weight
PackedCopy = PackedWeight | cpu_amx.AmxWeight | cpu_bf16_weights.Bf16Weight


def pack(weight: torch.Tensor) -> PackedWeight:
    """``weight`` and its copy packed for oneDNN."""
    return PackedWeight(weight, torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), BATCH_HINT))


def packed_copy(weight: torch.Tensor, path: str) -> PackedCopy:
    """``weight`` with its packed copy for ``path`` (:data:`ONEDNN`, :data:`BF16W` or :data:`AMX`)."""
    if path == AMX:
        return cpu_amx.pack(weight)
    if path == BF16W:
        return cpu_bf16_weights.pack(weight)
    if path == ONEDNN:
        return pack(weight)
    raise ValueError(f"no packed copy for the {path!r} path")


def pack_for(model: Any, weight: torch.Tensor, path: str | None, plain_for: RowRanges = ()) -> CpuWeight:
    """``weight`` of ``model`` as the runner multiplies it: with its packed copy for ``path`` (None: the plain
    weight alone) and the row ranges that use the plain weight instead. Once per model: a second runner over the
    same model reuses the copy."""
    if path is None or path == PLAIN:
        return weight
    if (path == AMX and not cpu_amx.takes(weight)) or (path == BF16W and not cpu_bf16_weights.takes(weight)):
        path = ONEDNN  # these kernels are exact only for bfloat16 values: this layer's weight holds others
    cache = getattr(model, _CACHE_ATTR, None)
    if cache is None:
        cache = {}
        setattr(model, _CACHE_ATTR, cache)
    key = (weight.data_ptr(), tuple(weight.shape), path, plain_for)
    if key not in cache:
        bare = next((copy for (ptr, shape, kind, _), copy in cache.items()
                     if (ptr, shape, kind) == key[:3]), None) or packed_copy(weight, path)
        cache[key] = dataclasses.replace(bare, plain_for=plain_for)
    return cache[key]


def packed_copy_bytes(model: Any, copies: list[tuple[tuple[int, int], str | None, int]] | None = None) -> int:
    """Bytes a first runner's packing will add (0 if the model is packed already). ``copies`` lists the measured
    plan's copies as (shape, path or None for no copy, how many weights); without it, each linear weight of the
    model is counted with the largest copy it could get."""
    if getattr(model, _CACHE_ATTR, None):
        return 0
    if copies is None:
        weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
        copies = [(tuple(w.shape), default_path(w), 1) for w in weights.values()]
    element = next(model.parameters()).element_size()
    total = 0
    for (rows, columns), path, count in copies:
        if path == AMX:
            total += count * cpu_amx.packed_bytes(torch.empty(rows, columns, device="meta"))
        elif path == BF16W:
            total += count * cpu_bf16_weights.packed_bytes(torch.empty(rows, columns, device="meta"))
        elif path == ONEDNN:
            total += count * rows * columns * element
    return total


def linear(x: torch.Tensor, weight: CpuWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for a plain or a packed weight (``x`` is ``[rows, in]``), on the path chosen for its rows."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    rows = x.shape[0]
    for low, high in weight.plain_for:
        if low <= rows < high:
            return F.linear(x, weight.plain, bias)
    if isinstance(weight, cpu_amx.AmxWeight):
        return cpu_amx.linear(x, weight, bias)
    if isinstance(weight, cpu_bf16_weights.Bf16Weight):
        return cpu_bf16_weights.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, weight.packed, bias, "none", [], "")


def path_function(weight: torch.Tensor, path: str):
    """``x -> weight x`` on one path, through a throwaway copy: what the start-up measurements time."""
    if path == PLAIN:
        return lambda x: F.linear(x, weight)
    copy = packed_copy(weight, path)
    return lambda x: linear(x, copy)


def probe_linear(weight: torch.Tensor):
    """``weight`` multiplied through a throwaway copy on the path it would take before anything else is measured
    (:func:`default_path`), and that path's name: what the thread choice times."""
    path = default_path(weight)
    return path_function(weight, path), path
