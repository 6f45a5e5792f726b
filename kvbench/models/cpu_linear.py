"""Linear layers on a CPU with their weights packed once for oneDNN, instead of repacked at every call.

A plain ``F.linear`` re-lays out (packs) its weight on every call. For the small batches of decode steps (16 or
50 rows against a [1728 x 576] matrix) that packing is a large share of the call: measured on this project's
2-core VM, a pre-packed weight ran the 135M shape's decode matmuls 1.3-2x faster, and vLLM's CPU engine packs
its weights the same way. The packed copy is kept beside the model's own weights (the ``transformers`` model
keeps working for reference runs), so a CPU run holds its linear weights twice (one packed copy per model, shared
by every runner over it); ``KVBENCH_PACKED_WEIGHTS=0`` turns packing off.

The packing pays off for the few rows of decode steps; for the thousands of rows of a prefill step oneDNN's own
choice on the plain weight was as fast or faster (measured, 1 thread: equal at 512 rows, 3-8% faster at 1,024
and 5-17% at 2,048 on the 135M and 1.1B shapes). Since both copies are kept anyway, a step of
:data:`PLAIN_FROM_ROWS` rows or more multiplies by the plain weight.

A weight that holds only bfloat16 values (a published checkpoint's, loaded as float32) on a CPU with AMX gets a
bfloat16 copy for :mod:`kvbench.kernels.cpu_amx` instead, a float32-accurate product that is faster at every row
count; the model's float32 weight stays as it is.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from kvbench.kernels import cpu_amx

ENV = "KVBENCH_PACKED_WEIGHTS"
BATCH_HINT = 16  # the batch size the packed layout is tuned for; any batch size works
PLAIN_FROM_ROWS = 1024  # steps of at least this many rows use the plain weight (see the module's docstring)
_CACHE_ATTR = "_kvbench_packed_weights"  # on the model: {(data_ptr, shape): packed tensor}


def packing_available(device: torch.device, dtype: torch.dtype) -> bool:
    """oneDNN packing on this device and dtype, unless turned off by ``KVBENCH_PACKED_WEIGHTS=0``."""
    if os.environ.get(ENV, "1") == "0":
        return False
    return (device.type == "cpu" and dtype in (torch.float32, torch.bfloat16)
            and torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"))


@dataclass(frozen=True)
class PackedWeight:
    """A linear weight ``[out, in]`` with its copy in oneDNN's layout (opaque: use it only through :func:`linear`)."""

    plain: torch.Tensor
    packed: torch.Tensor

    @property
    def shape(self) -> torch.Size:
        return self.plain.shape


def pack(weight: torch.Tensor) -> PackedWeight:
    """``weight`` and its copy packed for oneDNN."""
    return PackedWeight(weight, torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), BATCH_HINT))


def pack_for(model: Any, weight: torch.Tensor) -> PackedWeight | cpu_amx.AmxWeight:
    """``weight`` of ``model`` packed (for AMX where it takes the weight, else for oneDNN), once per model: a second
    runner over the same model reuses the copy."""
    cache = getattr(model, _CACHE_ATTR, None)
    if cache is None:
        cache = {}
        setattr(model, _CACHE_ATTR, cache)
    key = (weight.data_ptr(), tuple(weight.shape))
    if key not in cache:
        cache[key] = cpu_amx.pack(weight) if cpu_amx.takes(weight) else pack(weight)
    return cache[key]


def probe_linear(weight: torch.Tensor) -> tuple[Callable[[torch.Tensor], torch.Tensor], str]:
    """``weight`` multiplied as a runner would (AMX, oneDNN-packed or plain), through a throwaway copy, and the
    name of that path: what the thread choice times."""
    if not packing_available(weight.device, weight.dtype):
        return (lambda x: F.linear(x, weight)), "plain"
    if cpu_amx.takes(weight):
        amx_copy = cpu_amx.pack(weight)
        return (lambda x: cpu_amx.linear(x, amx_copy)), "AMX"
    onednn_copy = pack(weight)
    return (lambda x: linear(x, onednn_copy)), "oneDNN-packed"


def packed_copy_bytes(model: Any) -> int:
    """Bytes a first runner's packing will add: every linear weight once (0 if the model is packed already)."""
    if getattr(model, _CACHE_ATTR, None):
        return 0
    weights = {id(m.weight): m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)}
    return sum(cpu_amx.packed_bytes(w) if cpu_amx.takes(w) else w.numel() * w.element_size()
               for w in weights.values())


def linear(x: torch.Tensor, weight: torch.Tensor | PackedWeight | cpu_amx.AmxWeight,
           bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` for a plain or a packed weight (``x`` is ``[rows, in]``)."""
    if isinstance(weight, cpu_amx.AmxWeight):
        return cpu_amx.linear(x, weight, bias)
    if isinstance(weight, PackedWeight):
        if x.shape[0] < PLAIN_FROM_ROWS:
            return torch.ops.mkldnn._linear_pointwise(x, weight.packed, bias, "none", [], "")
        weight = weight.plain
    return F.linear(x, weight, bias)
