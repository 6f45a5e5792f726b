"""bfloat16 linear layers on AVX-512 BF16's ``vdpbf16ps`` (the method: ``cpu_bf16_dot.c``), for bfloat16 runs on
CPUs without AMX.

Why: a bfloat16 decode step reads every weight once for a few dozen rows. On a Zen 4 core oneDNN's bfloat16 kernel
read the weight at 35-85% of the memory's rate at one row and ran at 0.4-0.9x this kernel's rate at 16 rows; at
prefill sizes the two were level. The kernel sums exact products of bfloat16 pairs in float32 and rounds each
output to bfloat16 once, after the bias, as oneDNN does: the outputs agree with oneDNN's within bfloat16's rounding
(the order of the float32 sums differs). Which path each row count takes is measured on the machine
(:mod:`kvbench.cpu.cpu_choices`).

Used where the C kernels were built with AVX-512 BF16, the weight is a bfloat16 CPU matrix, and
``KVBENCH_BF16_DOT`` is not ``0``. With torch on several threads, the output columns are shared among them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kvbench import env_settings
from kvbench.kernels import cpu_bf16_weights, cpu_native

ENV = "KVBENCH_BF16_DOT"
STRIP = 32  # output columns per packed strip
MIN_WEIGHT_ELEMENTS = 1 << 16  # smaller weights: the fixed costs outweigh the gain
_INSTRUCTION_SET = cpu_native.ISA_BITS[4]


def unavailable_reason() -> str | None:
    """Why the kernel cannot run here, or None."""
    if not env_settings.switch(ENV, True):
        return f"turned off by {ENV}=0"
    if cpu_native._load() is None:
        return cpu_native.unavailable_reason()
    if _INSTRUCTION_SET not in cpu_native.instruction_sets():
        return f"the C kernels were built without {_INSTRUCTION_SET}"
    return None


def available() -> bool:
    return unavailable_reason() is None


def takes(weight: torch.Tensor) -> bool:
    """Whether :func:`pack` should take this weight: available, a large bfloat16 CPU matrix."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and weight.dim() == 2
        and weight.numel() >= MIN_WEIGHT_ELEMENTS
        and available()
    )


@dataclass(frozen=True)
class DotWeight:
    """A bfloat16 linear weight ``[out, in]`` and its copy in the kernel's pair layout (use it through
    :func:`linear`)."""

    plain: torch.Tensor
    packed: torch.Tensor  # [n_pad / 32, k_pad / 2, 32, 2] bfloat16
    stream: bool = False  # the tiles of a block share the prefetch of the weight's next chunk (cpu_bf16_dot.c)

    @property
    def shape(self) -> torch.Size:
        return self.plain.shape


def pack(weight: torch.Tensor, stream: bool = False) -> DotWeight:
    """``weight`` laid out as the kernel reads it: for each 32 output columns, their values in pairs of adjacent
    inputs (``[k/2][32][2]``), zero past the last column and, for an odd k, beside the last input. ``stream``: its
    products are streamed (the kernel's two ways of reading the weight; which is faster at which row count is
    measured, :mod:`kvbench.cpu.cpu_choices`)."""
    n, k = weight.shape
    n_pad, k_pad = -(-n // STRIP) * STRIP, k + (k & 1)
    padded = torch.zeros((n_pad, k_pad), dtype=torch.bfloat16)
    padded[:n, :k] = weight
    packed = padded.view(n_pad // STRIP, STRIP, k_pad // 2, 2).permute(0, 2, 1, 3).contiguous()
    return DotWeight(weight, packed, stream)


def packed_bytes(weight: torch.Tensor) -> int:
    """Bytes :func:`pack` adds for a weight of this shape."""
    n, k = weight.shape
    return -(-n // STRIP) * STRIP * (k + (k & 1)) * 2


def linear(x: torch.Tensor, weight: DotWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight.plain, bias)`` for a bfloat16 ``x [rows, in]``: a bfloat16 result."""
    if x.dtype != torch.bfloat16 or x.dim() != 2 or x.shape[1] != weight.shape[1]:
        raise ValueError(
            f"the vdpbf16ps linear takes bfloat16 [rows, {weight.shape[1]}], got {x.dtype} {tuple(x.shape)}"
        )
    lib = cpu_native._library()
    if x.stride(1) != 1:
        x = x.contiguous()
    if bias is not None:
        bias = bias.to(torch.bfloat16).contiguous()
    (m, k), n = x.shape, weight.shape[0]
    out = torch.empty((m, n), dtype=torch.bfloat16)
    bias_address = bias.data_ptr() if bias is not None else None

    def run(first: int, last: int) -> None:
        if lib.kvbench_linear_bf16dot(
            x.data_ptr(),
            m,
            k,
            x.stride(0),
            weight.packed.data_ptr(),
            first,
            last,
            n,
            bias_address,
            out.data_ptr(),
            n,
            int(weight.stream),
        ):
            raise RuntimeError(f"the C kernels were built without {_INSTRUCTION_SET}")

    cpu_bf16_weights.over_strips(run, weight.packed.shape[0], m)
    return out
