"""Linear layers on a CPU: each weight multiplied by the path this machine runs fastest at the step's row count.

The paths: the plain weight through ``F.linear`` (torch's BLAS), a copy packed once in oneDNN's layout (a plain
``F.linear`` re-lays out its weight at every call, a large part of a small decode matmul; vLLM's CPU engine packs
its weights the same way), and for a float32 weight that holds only bfloat16 values (a published checkpoint's) a
bfloat16 copy, half the bytes, multiplied at float32 accuracy: by AVX-512/AVX2 multiply-adds that widen it as they
read it (:mod:`kvbench.kernels.cpu_bf16_weights`) or, on a CPU with AMX, on the tiles (:mod:`kvbench.kernels.cpu_amx`);
for a bfloat16 weight (a bfloat16 run), on a CPU with AVX-512 BF16, a copy in pairs for ``vdpbf16ps``
(:mod:`kvbench.kernels.cpu_bf16_dot`).

Which is fastest depends on the CPU and the row count, by a lot (docs/CPU_RESULTS.md, "Why the CPU choices are
measured"), so no threshold is built in: :mod:`kvbench.cpu.cpu_choices` times the paths on the model's own weights
at start-up and each weight carries its routes, the path each row count takes (:class:`RoutedWeight`). The packed
copies a weight's routes use are kept beside the model's own weights (the ``transformers`` model keeps working for
reference runs), once per model, shared by every runner over it; a weight whose plain path won at every row count
gets none. ``KVBENCH_PACKED_WEIGHTS=0`` turns packing off.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.nn.functional as F

from kvbench import env_settings
from kvbench.kernels import cpu_amx, cpu_bf16_dot, cpu_bf16_weights

ENV = "KVBENCH_PACKED_WEIGHTS"
BATCH_HINT = 16  # the batch size the packed layout is tuned for; any batch size works
PLAIN, ONEDNN, BF16W, AMX, BF16DOT = "plain", "oneDNN-packed", "bf16-weights", "AMX", "bf16-dot"
BF16DOT_STREAM = "bf16-dot-stream"  # the vdpbf16ps kernel over the same copy, streaming the weight (cpu_bf16_dot.c)
BF16W_STREAM = "bf16-weights-stream"  # the bfloat16-weight kernel over the same copy, streaming (cpu_bf16_weights.c)
_STREAMED = {BF16DOT_STREAM: BF16DOT, BF16W_STREAM: BF16W}  # a streamed path -> the copy it shares
_CACHE_ATTR = "_kvbench_packed_weights"  # on the model: packed copies by (data_ptr, shape, path), routed weights


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing on this device and dtype, unless turned off by ``KVBENCH_PACKED_WEIGHTS=0``. oneDNN packs
    bfloat16 only where the CPU has AVX-512 (BW, VL, DQ) or AVX-NE-CONVERT; elsewhere it raises."""
    if not env_settings.switch(ENV, True):
        return False
    return (
        device.type == "cpu"
        and dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
        and (dtype != torch.bfloat16 or _onednn_bf16())
    )


def _onednn_bf16() -> bool:
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(probe()) if probe is not None else False


def candidate_paths(weight: torch.Tensor) -> tuple[str, ...]:
    """The paths ``weight`` can take on this machine: plain always; oneDNN where packing is available; for a float32
    weight holding only bfloat16 values, the bfloat16-weight kernel and, where the CPU has it, AMX; for a bfloat16
    weight, where the CPU has AVX-512 BF16, the vdpbf16ps kernel."""
    if not packing_available(weight.device, weight.dtype):
        return (PLAIN,)
    paths = [PLAIN, ONEDNN]
    if cpu_bf16_weights.takes(weight):
        paths += [BF16W, BF16W_STREAM]
    if cpu_amx.takes(weight):
        paths.append(AMX)
    if cpu_bf16_dot.takes(weight):
        paths += [BF16DOT, BF16DOT_STREAM]
    return tuple(paths)


def copy_kind(path: str) -> str:
    """The packed copy ``path`` multiplies (each kernel's two ways of reading its weight, streamed or not, share
    one)."""
    return _STREAMED.get(path, path)


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

    @property
    def shape(self) -> torch.Size:
        return self.plain.shape


PackedCopy = PackedWeight | cpu_amx.AmxWeight | cpu_bf16_weights.Bf16Weight | cpu_bf16_dot.DotWeight
Routes = tuple[tuple[int, int, str], ...]  # (lo, hi, path): steps of lo <= rows < hi take that path


@dataclass(frozen=True)
class RoutedWeight:
    """A linear weight as the runner multiplies it: the packed copies it keeps and which path each row count takes
    (measured on this machine: :mod:`kvbench.cpu.cpu_choices`)."""

    plain: torch.Tensor
    copies: dict[str, PackedCopy]  # path -> copy
    routes: Routes  # cover every row count; a path is PLAIN or one of ``copies``

    @property
    def shape(self) -> torch.Size:
        return self.plain.shape

    def path_at(self, rows: int) -> str:
        return next(path for low, high, path in self.routes if low <= rows < high)


CpuWeight = torch.Tensor | PackedCopy | RoutedWeight


def pack(weight: torch.Tensor) -> PackedWeight:
    """``weight`` and its copy packed for oneDNN."""
    return PackedWeight(weight, torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), BATCH_HINT))


def packed_copy(weight: torch.Tensor, path: str) -> PackedCopy:
    """``weight`` with its packed copy for ``path`` (:data:`ONEDNN`, :data:`AMX`, or either way of reading of
    :data:`BF16W` or :data:`BF16DOT`)."""
    if copy_kind(path) == BF16DOT:
        return cpu_bf16_dot.pack(weight, stream=path in _STREAMED)
    if path == AMX:
        return cpu_amx.pack(weight)
    if copy_kind(path) == BF16W:
        return cpu_bf16_weights.pack(weight, stream=path in _STREAMED)
    if path == ONEDNN:
        return pack(weight)
    raise ValueError(f"no packed copy for the {path!r} path")


def pack_for(model: Any, weight: torch.Tensor, routes: Routes) -> CpuWeight:
    """``weight`` of ``model`` as the runner multiplies it, by ``routes`` (which path each row count takes): the
    plain weight itself when every route is plain, else a :class:`RoutedWeight` with the packed copies its routes
    name. Each copy is made once per model: a second runner over the same model reuses it."""
    fixed = []
    for low, high, path in routes:  # these kernels take only bfloat16 values: a weight holding others goes to oneDNN
        if (
            (path == AMX and not cpu_amx.takes(weight))
            or (copy_kind(path) == BF16W and not cpu_bf16_weights.takes(weight))
            or (copy_kind(path) == BF16DOT and not cpu_bf16_dot.takes(weight))
        ):
            path = ONEDNN if packing_available(weight.device, weight.dtype) else PLAIN
        fixed.append((low, high, path))
    if all(path == PLAIN for _, _, path in fixed):
        return weight
    cache = getattr(model, _CACHE_ATTR, None)
    if cache is None:
        cache = {}
        setattr(model, _CACHE_ATTR, cache)
    key = (weight.data_ptr(), tuple(weight.shape), tuple(fixed))
    if key not in cache:
        copies = {}
        for path in dict.fromkeys(path for _, _, path in fixed if path != PLAIN):
            kind = copy_kind(path)
            copy_key = (weight.data_ptr(), tuple(weight.shape), kind)
            if copy_key not in cache:
                cache[copy_key] = packed_copy(weight, kind)
            copy = cache[copy_key]
            copies[path] = replace(copy, stream=True) if path in _STREAMED else copy  # the copy itself: unstreamed
        cache[key] = RoutedWeight(weight, copies, tuple(fixed))
    return cache[key]


def packed_copy_bytes(model: Any, copies: list[tuple[tuple[int, int], str, int]] | None = None) -> int:
    """Bytes a first runner's packing will add (0 if the model is packed already). ``copies`` lists the measured
    plan's copies as (shape, path, how many weights); without it, each linear weight of the model is counted with
    the copy it would get before anything is measured."""
    if getattr(model, _CACHE_ATTR, None):
        return 0
    if copies is None:
        weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
        copies = [((w.shape[0], w.shape[1]), default_path(w), 1) for w in weights.values()]
    element = next(model.parameters()).element_size()
    total = 0
    for (rows, columns), path, count in copies:
        if path == AMX:
            total += count * cpu_amx.packed_bytes(torch.empty(rows, columns, device="meta"))
        elif copy_kind(path) == BF16W:
            total += count * cpu_bf16_weights.packed_bytes(torch.empty(rows, columns, device="meta"))
        elif copy_kind(path) == BF16DOT:
            total += count * cpu_bf16_dot.packed_bytes(torch.empty(rows, columns, device="meta"))
        elif path == ONEDNN:
            total += count * rows * columns * element
    return total


def _multiply(x: torch.Tensor, copy: PackedCopy, bias: torch.Tensor | None) -> torch.Tensor:
    if isinstance(copy, PackedWeight):
        return torch.ops.mkldnn._linear_pointwise(x, copy.packed, bias, "none", [], "")
    if isinstance(copy, cpu_bf16_weights.Bf16Weight):
        return cpu_bf16_weights.linear(x, copy, bias)
    if isinstance(copy, cpu_bf16_dot.DotWeight):
        return cpu_bf16_dot.linear(x, copy, bias)
    return cpu_amx.linear(x, copy, bias)


def path_at(weight: CpuWeight, rows: int) -> str:
    """The path a step of ``rows`` rows multiplies ``weight`` by."""
    if isinstance(weight, torch.Tensor):
        return PLAIN
    if isinstance(weight, RoutedWeight):
        return next(path for low, high, path in weight.routes if low <= rows < high)
    if isinstance(weight, PackedWeight):
        return ONEDNN
    if isinstance(weight, cpu_bf16_dot.DotWeight):
        return BF16DOT_STREAM if weight.stream else BF16DOT
    if isinstance(weight, cpu_bf16_weights.Bf16Weight):
        return BF16W_STREAM if weight.stream else BF16W
    return AMX


def linear(x: torch.Tensor, weight: CpuWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for a plain, packed or routed weight (``x`` is ``[rows, in]``), on the path chosen for its
    row count."""
    if isinstance(weight, torch.Tensor):
        return F.linear(x, weight, bias)
    if isinstance(weight, RoutedWeight):
        rows = x.shape[0]
        for low, high, path in weight.routes:
            if low <= rows < high:
                return F.linear(x, weight.plain, bias) if path == PLAIN else _multiply(x, weight.copies[path], bias)
        raise ValueError(f"no route for {rows} rows")
    return _multiply(x, weight, bias)


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
