"""C kernels for the CPU, compiled at first use with the machine's C compiler and called through ctypes.

Why: on a CPU the torch reference's decode attention gathers every request's blocks into one padded copy before
SDPA reads them again; on a 135M-class model that copy was most of the attention's time. The C kernel reads the
block pool in place (``cpu_decode.c``). Plain C, no torch headers: it builds in well under a second, and the
shared library is cached per source, compiler and CPU (``$KVBENCH_CACHE_DIR``, else ``~/.cache/kvbench``).

Where no compiler is found, the build fails or ``KVBENCH_NATIVE_KERNELS=0`` is set, :func:`available` is False
(and :func:`unavailable_reason` says why): the CPU then runs the torch reference, which gives the same results.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

ENV = "KVBENCH_NATIVE_KERNELS"
SOURCE = Path(__file__).with_name("cpu_decode.c")
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fPIC", "-shared")
_lock = threading.Lock()
_state: dict[str, object] = {}  # "lib": the loaded library, or "reason": why there is none


def _compiler() -> str | None:
    chosen = os.environ.get("CC")
    if chosen:
        return shutil.which(chosen)
    return next((path for name in ("cc", "gcc", "clang") if (path := shutil.which(name))), None)


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the CPU's model and feature flags (a copied cache stays correct)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [line for line in text.splitlines() if line.startswith(("flags", "model name", "Features", "CPU part"))]
    return "\n".join(sorted(set(lines)))


def cache_dir() -> Path:
    base = os.environ.get("KVBENCH_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kvbench")
    return Path(base)


def _build(compiler: str) -> Path:
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, compiler.encode(), " ".join(FLAGS).encode(),
                                     platform.machine().encode(), _cpu_signature().encode()])).hexdigest()[:16]
    folder = cache_dir()
    library = folder / f"cpu_decode-{key}.so"
    if library.exists():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as scratch:
        partial = Path(scratch) / library.name
        done = subprocess.run([compiler, *FLAGS, "-o", str(partial), str(SOURCE)], capture_output=True, text=True,
                              timeout=120)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"{Path(compiler).name} failed: {tail[0]}")
        os.replace(partial, library)  # atomic: a concurrent build of the same key writes the same bytes
    return library


def _load() -> ctypes.CDLL | None:
    with _lock:
        if "lib" in _state or "reason" in _state:
            return _state.get("lib")  # type: ignore[return-value]
        if os.environ.get(ENV, "1") == "0":
            _state["reason"] = f"turned off by {ENV}=0"
            return None
        compiler = _compiler()
        if compiler is None:
            _state["reason"] = "no C compiler found (cc, gcc, clang or $CC)"
            return None
        try:
            lib = ctypes.CDLL(str(_build(compiler)))
        except (OSError, RuntimeError, subprocess.SubprocessError) as error:
            _state["reason"] = f"could not build the CPU kernels: {error}"
            return None
        fn = lib.kvbench_paged_decode_f32
        fn.restype = ctypes.c_int
        pointer, i64 = ctypes.c_void_p, ctypes.c_int64
        fn.argtypes = [pointer, i64, i64, pointer, pointer, pointer, i64, pointer, pointer,
                       i64, i64, i64, i64, i64, ctypes.c_float]
        _state["lib"] = lib
        return lib


def available() -> bool:
    """Whether the C kernels are built and loaded (builds them on the first call)."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True)."""
    _load()
    return _state.get("reason")  # type: ignore[return-value]


def supports(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the C decode kernel takes these tensors: float32 on the CPU, a contiguous pool."""
    return (query.device.type == "cpu" and query.dtype == torch.float32 and k_cache.dtype == torch.float32
            and k_cache.is_contiguous())


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    max_context_len: int | None = None,
) -> torch.Tensor:
    """The contract of ``reference.paged_decode_attention``, computed in place over the pool.

    Every table entry a context reaches must be a block of the pool (the runner's tables are); the table width
    is checked here, since C reads past nothing it is not told about.
    """
    lib = _load()
    if lib is None:
        raise RuntimeError(unavailable_reason() or "the CPU kernels are not available")
    if query.stride(-1) != 1:
        query = query.contiguous()
    tables = block_tables if block_tables.dtype == torch.int32 and block_tables.stride(-1) == 1 else (
        block_tables.to(torch.int32).contiguous())
    lens = context_lens if context_lens.dtype == torch.int32 and context_lens.is_contiguous() else (
        context_lens.to(torch.int32).contiguous())
    batch, num_heads, head_dim = query.shape
    longest = int(lens.max()) if max_context_len is None and batch else (max_context_len or 0)
    if lens.shape[0] != batch or tables.shape[0] < batch or tables.shape[1] * k_cache.shape[1] < longest:
        raise ValueError(f"{batch} queries need {batch} context lengths and block tables covering {longest} "
                         f"tokens; got {lens.shape[0]} lengths and tables {tuple(tables.shape)}")
    result = out if out is not None and out.is_contiguous() else torch.empty(
        (batch, num_heads, head_dim), dtype=torch.float32)
    if batch:
        status = lib.kvbench_paged_decode_f32(
            query.data_ptr(), query.stride(0), query.stride(1), k_cache.data_ptr(), v_cache.data_ptr(),
            tables.data_ptr(), tables.stride(0), lens.data_ptr(), result.data_ptr(),
            batch, num_heads, k_cache.shape[2], head_dim, k_cache.shape[1], scale)
        if status != 0:
            raise MemoryError("the CPU decode kernel could not allocate its scratch memory")
    if out is not None and result is not out:
        out.copy_(result)
        return out
    return result
