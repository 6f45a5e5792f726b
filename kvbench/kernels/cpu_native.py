"""C kernels for the CPU, compiled at first use with the machine's C compiler and called through ctypes.

Why: on a CPU the torch reference's decode attention gathers every request's blocks into one padded copy before
SDPA reads them again; on a 135M-class model that copy was most of the attention's time. The C kernel reads the
block pool in place. The runner's RMSNorm (with its residual add), SiLU-and-multiply and rotary embedding are
each one pass here instead of several torch ops with a temporary each (``cpu_ops.c``). Plain C, no torch
headers: it builds in well under a second, and the shared library is cached per source, compiler and CPU
(``$KVBENCH_CACHE_DIR``, else ``~/.cache/kvbench``). The kernels are single-threaded: the runner uses them when
torch runs on one thread (see :func:`use_for_model_ops`).

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
SOURCES = (Path(__file__).with_name("cpu_ops.c"), Path(__file__).with_name("cpu_amx.c"))
FLAGS = ("-O3", "-march=native", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared")
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
    sources = [path.read_bytes() for path in SOURCES]
    key = hashlib.sha256(b"\0".join([*sources, compiler.encode(), " ".join(FLAGS).encode(),
                                     platform.machine().encode(), _cpu_signature().encode()])).hexdigest()[:16]
    folder = cache_dir()
    library = folder / f"cpu_ops-{key}.so"
    if library.exists():
        return library
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".build-") as scratch:
        partial = Path(scratch) / library.name
        done = subprocess.run([compiler, *FLAGS, "-o", str(partial), *map(str, SOURCES)], capture_output=True, text=True,
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
        pointer, i64, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float
        signatures = {
            "kvbench_paged_decode_f32": (ctypes.c_int, [pointer, i64, i64, pointer, pointer, pointer, i64, pointer,
                                                        pointer, i64, i64, i64, i64, i64, f32]),
            "kvbench_rms_norm_f32": (None, [pointer, pointer, pointer, pointer, i64, i64, f32]),
            "kvbench_silu_and_mul_f32": (None, [pointer, pointer, i64, i64]),
            "kvbench_rotary_f32": (None, [pointer, i64, pointer, pointer, i64, i64, i64]),
            "kvbench_write_kv_f32": (None, [pointer, pointer, i64, i64, pointer, pointer, pointer, i64, i64]),
            "kvbench_amx_init": (ctypes.c_int, []),
            "kvbench_all_bf16": (ctypes.c_int, [pointer, i64]),
            "kvbench_split3_bf16": (None, [pointer, i64, i64, i64, pointer, i64, i64]),
            "kvbench_amx_linear_f32": (None, [pointer, i64, i64, pointer, i64, pointer, i64, i64, i64, i64, i64]),
        }
        for name, (restype, argtypes) in signatures.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
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


def takes_write(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor) -> bool:
    """Whether :func:`write_kv` takes these tensors: float32 on the CPU, each token's heads contiguous."""
    return (key.dtype == value.dtype == k_cache.dtype == torch.float32 and key.device.type == "cpu"
            and k_cache.is_contiguous() and slot_mapping.dtype == torch.int64 and slot_mapping.is_contiguous()
            and key.stride(-1) == 1 and key.stride(-2) == key.shape[-1]
            and value.stride(-1) == 1 and value.stride(-2) == value.shape[-1])


def write_kv(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """``reference.write_kv``: ``key``/``value [T, Hkv, D]`` into the pools at ``slot_mapping[T]`` (-1 skipped).

    Slots must lie inside the pool (the runner's do); their count is checked here."""
    tokens = key.shape[0]
    row = k_cache.shape[2] * k_cache.shape[3]
    if slot_mapping.shape[0] != tokens or value.shape != key.shape or key.shape[1] * key.shape[2] != row:
        raise ValueError(f"write_kv: {tuple(key.shape)} keys, {tuple(value.shape)} values and "
                         f"{tuple(slot_mapping.shape)} slots do not fit a pool of rows of {row}")
    _library().kvbench_write_kv_f32(key.data_ptr(), value.data_ptr(), key.stride(0), value.stride(0),
                                    k_cache.data_ptr(), v_cache.data_ptr(), slot_mapping.data_ptr(), tokens, row)


# -- the runner's element-wise ops ---------------------------------------------------------------------------------
MAX_ROTARY_HEAD_DIM = 1024  # the C rotary's per-head scratch


def use_for_model_ops(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the runner should use the C norm, SiLU-and-multiply and rotary ops: float32 on a CPU, torch on one
    thread (the C ops run on one core; with more threads torch's own ops use them all), and the kernels built."""
    return (device.type == "cpu" and dtype == torch.float32 and head_dim <= MAX_ROTARY_HEAD_DIM
            and torch.get_num_threads() == 1 and available())


def _library() -> ctypes.CDLL:
    lib = _load()
    if lib is None:
        raise RuntimeError(unavailable_reason() or "the CPU kernels are not available")
    return lib


def _rows(x: torch.Tensor) -> tuple[int, int]:
    if x.dtype != torch.float32 or x.device.type != "cpu" or not x.is_contiguous():
        raise ValueError(f"the CPU kernels take contiguous float32 CPU tensors, got {x.dtype} {tuple(x.shape)}")
    return x.numel() // x.shape[-1], x.shape[-1]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``torch.nn.functional.rms_norm`` over the last dimension of a contiguous float32 ``x``."""
    rows, width = _rows(x)
    out = torch.empty_like(x)
    _library().kvbench_rms_norm_f32(x.data_ptr(), None, weight.contiguous().data_ptr(), out.data_ptr(), rows,
                                    width, eps)
    return out


def add_rms_norm_(hidden: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``hidden += delta`` in place, then the RMSNorm of the new ``hidden`` (a decoder layer's residual step)."""
    rows, width = _rows(hidden)
    if delta.shape != hidden.shape or not delta.is_contiguous() or delta.dtype != torch.float32:
        raise ValueError(f"delta {tuple(delta.shape)} must match hidden {tuple(hidden.shape)}, contiguous float32")
    out = torch.empty_like(hidden)
    _library().kvbench_rms_norm_f32(hidden.data_ptr(), delta.data_ptr(), weight.contiguous().data_ptr(),
                                    out.data_ptr(), rows, width, eps)
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate_up [rows, 2 * I]`` holds gate then up, as ``[rows, I]``."""
    rows, width = _rows(gate_up)
    out = torch.empty((*gate_up.shape[:-1], width // 2), dtype=torch.float32)
    _library().kvbench_silu_and_mul_f32(gate_up.data_ptr(), out.data_ptr(), rows, width // 2)
    return out


def rotary_(qkv: torch.Tensor, heads: int, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
    """Rotate the first ``heads`` heads of ``qkv [T, H, D]`` in place (``apply_rotary``'s formula and tables)."""
    tokens, _, head_dim = qkv.shape
    _rows(qkv)
    if head_dim > MAX_ROTARY_HEAD_DIM or head_dim % 2 or cos.shape != (tokens, head_dim) or (
            signed_sin.shape != cos.shape):
        raise ValueError(f"rotary tables {tuple(cos.shape)} do not fit q/k/v {tuple(qkv.shape)}")
    cos, signed_sin = cos.contiguous(), signed_sin.contiguous()
    _library().kvbench_rotary_f32(qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), signed_sin.data_ptr(), tokens,
                                  heads, head_dim)
