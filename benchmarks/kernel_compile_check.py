"""Compile the Triton KV kernels for a GPU without having one, and report registers, spills and shared memory.

Catches compile errors of the real (non-interpreted) path on a CPU-only machine and shows whether loads are
pipelined (``cp.async``) and registers spill. Uses Triton's bundled ``ptxas``. Pointers and strides get the
divisible-by-16 hints the JIT would give them for real cache shapes.

    python benchmarks/kernel_compile_check.py [--arch 90] [--dtype fp16]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)  # compile for real

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from kvbench.kernels import triton_ops  # noqa: E402

# Arguments that are multiples of 16 for real shapes (head_dim 64/128, block sizes 16/32, contiguous caches).
ALIGNED = {
    "q_ptr", "k_cache_ptr", "v_cache_ptr", "tables_ptr", "lens_ptr", "starts_ptr", "out_ptr", "lse_ptr",
    "partial_ptr", "key_ptr", "value_ptr", "slot_ptr", "cache_ptrs", "src_ptr", "dst_ptr",
    "stride_qb", "stride_qh", "stride_qt", "stride_kb", "stride_ks", "stride_kh", "stride_vb", "stride_vs",
    "stride_vh", "stride_ob", "stride_oh", "stride_ot", "stride_pb", "stride_ph", "stride_ps", "head_dim",
}  # fmt: skip
UNIT_STRIDES = ("stride_qd", "stride_kd", "stride_vd", "stride_od", "stride_pd", "stride_cd", "stride_ud")


def _ptxas(arch: int) -> str:
    """The ptxas Triton itself uses for ``arch`` (its bundled one)."""
    try:
        from triton.backends.nvidia.compiler import get_ptxas

        return get_ptxas(arch).path
    except (ImportError, AttributeError, TypeError):
        return os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


def compile_kernel(fn, pointers: dict[str, str], constants: dict, arch: int, **options) -> dict:
    """Compile ``fn`` to a cubin; 32-bit ints unless named in ``pointers``; returns ptxas's figures."""
    constants = {**{name: 1 for name in UNIT_STRIDES if name in fn.arg_names}, **constants}
    signature = {
        name: "constexpr" if name in constants else pointers.get(name, "fp32" if name == "qk_scale" else "i32")
        for name in fn.arg_names
    }
    attrs = {(fn.arg_names.index(name),): [["tt.divisibility", 16]] for name in ALIGNED if name in fn.arg_names}
    kernel = triton.compile(
        ASTSource(fn, signature, constexprs=constants, attrs=attrs), target=GPUTarget("cuda", arch, 32),
        options=options,
    )  # fmt: skip
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as ptx:
        ptx.write(kernel.asm["ptx"])
    ptxas = _ptxas(arch)
    report = subprocess.run(
        [ptxas, f"-arch=sm_{arch}a", "-v", ptx.name, "-o", os.devnull], capture_output=True, text=True
    )
    os.unlink(ptx.name)
    details = " ".join(
        line.split("info    :")[-1].strip() for line in report.stderr.splitlines() if "Used" in line or "spill" in line
    )
    return {
        "kernel": fn.__name__, "shared": kernel.metadata.shared,
        "cp.async": kernel.asm["ttgir"].count("async_copy_global_to_local"),
        "ptxas": details or report.stderr.strip()[-200:],
    }  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 80 or 90")
    parser.add_argument("--dtype", default="fp16", choices=("fp16", "bf16", "fp32"))
    opts = parser.parse_args()
    cache = f"*{opts.dtype}"
    precision = "ieee" if opts.dtype == "fp32" else "tf32"
    attention = {"q_ptr": cache, "k_cache_ptr": cache, "v_cache_ptr": cache, "tables_ptr": "*i32", "lens_ptr": "*i32"}
    jobs = []
    for group in (1, 4, 8):
        for split in (False, True):
            outputs = {"out_ptr": "*fp32", "lse_ptr": "*fp32"} if split else {"out_ptr": cache, "lse_ptr": cache}
            constants = dict(GROUP=group, GROUP_PAD=max(16, group), DIM=128, BLOCK_N=triton_ops.DECODE_BLOCK_N,
                             SPLIT=split, PRECISION=precision)  # fmt: skip
            jobs.append(
                (f"decode group={group} split={split}", triton_ops._decode_kernel, {**attention, **outputs}, constants)
            )
        constants = dict(GROUP=group, DIM=128, BLOCK_M=triton_ops.PREFILL_BLOCK_M, BLOCK_N=triton_ops.PREFILL_BLOCK_N,
                         PRECISION=precision)  # fmt: skip
        jobs.append(
            (
                f"prefill group={group}",
                triton_ops._prefill_kernel,
                {**attention, "starts_ptr": "*i32", "out_ptr": cache},
                constants,
            )
        )
    jobs.append(
        (
            "combine",
            triton_ops._combine_splits_kernel,
            {"partial_ptr": "*fp32", "lse_ptr": "*fp32", "out_ptr": cache},
            dict(SPLITS=8, DIM=128),
        )
    )
    jobs.append(
        (
            "write_kv",
            triton_ops._write_kv_kernel,
            {"key_ptr": cache, "value_ptr": cache, "k_cache_ptr": cache, "v_cache_ptr": cache, "slot_ptr": "*i64"},
            dict(HEADS=triton_ops.WRITE_KV_ELEMENTS // 128, DIM=128),
        )
    )
    jobs.append(
        (
            "copy_blocks",
            triton_ops._copy_blocks_kernel,
            {"cache_ptrs": "*i64", "src_ptr": "*i64", "dst_ptr": "*i64"},
            dict(ELEMENT_BYTES=2, CHUNK=triton_ops.COPY_CHUNK),
        )
    )
    failed = 0
    for label, fn, pointers, constants in jobs:
        try:
            row = compile_kernel(fn, pointers, constants, opts.arch, num_warps=4)
            print(f"{label:28s} shared={row['shared']:6d} cp.async={row['cp.async']}  {row['ptxas']}", flush=True)
        except Exception as err:  # report every kernel, then fail
            failed += 1
            print(f"{label:28s} FAILED: {err!r}"[:400], flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
