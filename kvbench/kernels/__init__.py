"""KV ops (installed as ``kvbench.kernels``): Triton on CUDA, the torch reference elsewhere.

Every op takes an optional ``backend`` ("torch" | "triton"); without it the tensors' device decides, and the
environment variable ``KVBENCH_KERNEL_BACKEND`` overrides that for tests and benchmarks.
"""

from kvbench.kernels.dispatch import (
    copy_blocks,
    decode_padding_is_small,
    decode_plan_fits,
    kept_decode_plan,
    paged_decode_attention,
    paged_prefill_attention,
    plan_decode,
    plan_prefill,
    resolve_backend,
    write_kv,
)

__all__ = [
    "copy_blocks",
    "decode_padding_is_small",
    "decode_plan_fits",
    "kept_decode_plan",
    "paged_decode_attention",
    "paged_prefill_attention",
    "plan_decode",
    "plan_prefill",
    "resolve_backend",
    "write_kv",
]
