"""C kernels for the CPU, compiled at first use with the machine's C compiler and called through ctypes.

Why: on a CPU the torch reference's decode attention gathers every request's blocks into one padded copy before
SDPA reads them again; on a 135M-class model that copy was most of the attention's time. The C kernel reads the
block pool in place. The runner's RMSNorm (with its residual add), SiLU-and-multiply and rotary embedding are
each one pass here instead of several torch ops with a temporary each (``cpu_ops.c``). Every kernel takes float32
or bfloat16 tensors (bfloat16 computed in float32, rounded once; the decode attention's q.k on AVX-512 BF16's
``vdpbf16ps`` where the CPU has it). Plain C, no torch headers, single-threaded: the runner uses them when torch runs
on one thread (see :func:`use_for_model_ops`).

The build targets this CPU (``-march=native``); ``KVBENCH_CPU_ISA`` asks for a narrower variant instead
(``avx512bf16``, ``avx512`` without BF16, ``avx2``), so the paths other CPUs take can be run and tested here. The
shared library is cached per source, compiler, flags and CPU in kvbench's private cache folder
(:mod:`kvbench.private_cache`: ``0700``, nothing another user could write is trusted). The builder records the
library's SHA-256 beside it, and a library is loaded only when its bytes match that digest; a file that does not
(planted, damaged, or from an older kvbench) is rebuilt, with a one-line note on stderr.

Where no compiler is found, the build fails, the cache folder is not safe or ``KVBENCH_NATIVE_KERNELS=0`` is set,
:func:`available` is False (and :func:`unavailable_reason` says why): the CPU then runs the torch reference, which
gives the same results.
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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import torch

from kvbench import env_settings, private_cache
from kvbench.errors import KvbenchError

ENV = "KVBENCH_NATIVE_KERNELS"
ISA_ENV = "KVBENCH_CPU_ISA"
SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in ("cpu_ops.c", "cpu_amx.c", "cpu_bf16_weights.c", "cpu_bf16_dot.c", "cpu_peak.c")
)
FLAGS = ("-O3", "-fopenmp-simd", "-fno-math-errno", "-fno-trapping-math", "-fPIC", "-shared", "-Wno-psabi")
# the instruction-set variants: compiler flags, and the CPU flags (/proc/cpuinfo) a variant needs to run
ISA_VARIANTS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "native": (("-march=native",), ()),
    "avx512bf16": (
        ("-march=x86-64-v4", "-mavx512bf16", "-mtune=native"),
        ("avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512_bf16"),
    ),
    "avx512": (("-march=x86-64-v4", "-mtune=native"), ("avx512f", "avx512bw", "avx512dq", "avx512vl")),
    "avx2": (("-march=x86-64-v3", "-mtune=native"), ("avx2", "fma", "bmi2")),
}
ISA_BITS = {1: "AVX2", 2: "AVX-512", 4: "AVX-512 BF16 (vdpbf16ps)", 8: "AMX"}  # kvbench_isa()'s answer
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
_lock = threading.Lock()


class _State(TypedDict, total=False):
    lib: ctypes.CDLL  # the loaded library
    reason: str  # why there is none
    isa: str  # the variant built
    key: str  # the build's key: sources, compiler, flags and CPU
    fds: list[int]  # the in-memory copies loaded, kept open: a unique name each
    kernels: dict[tuple[str, torch.dtype], Any]  # the library's functions, by name and dtype


_state: _State = {}


def _compiler() -> str | None:
    chosen = os.environ.get("CC")
    if chosen:
        return shutil.which(chosen)
    return next((path for name in ("cc", "gcc", "clang") if (path := shutil.which(name))), None)


def _cpu_flags() -> set[str] | None:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return None
    line = next((line for line in text.splitlines() if line.startswith("flags")), None)
    return set(line.split(":", 1)[1].split()) if line else None


def _cpu_signature() -> str:
    """What ``-march=native`` depends on: the CPU's model and feature flags (a copied cache stays correct)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor()
    lines = [line for line in text.splitlines() if line.startswith(("flags", "model name", "Features", "CPU part"))]
    return "\n".join(sorted(set(lines)))


def cpu_signature() -> str:
    """A short fingerprint of this CPU (model and feature flags) for caches of what was measured on it."""
    return hashlib.sha256(f"{platform.machine()}\n{_cpu_signature()}".encode()).hexdigest()[:16]


def _isa_flags() -> tuple[str, tuple[str, ...]]:
    """The variant asked for (``KVBENCH_CPU_ISA``, default native) and its compiler flags; RuntimeError if this
    machine cannot run it."""
    name = env_settings.read(ISA_ENV, "native") or "native"
    if name not in ISA_VARIANTS:  # the user's typo: said, not a silent fall-back to torch
        raise KvbenchError(f"unknown {ISA_ENV}={name!r}; choose {', '.join(ISA_VARIANTS)}")
    flags, needs = ISA_VARIANTS[name]
    if name != "native":
        if platform.machine() not in ("x86_64", "AMD64"):
            raise RuntimeError(f"{ISA_ENV}={name} is an x86-64 variant; this is {platform.machine()}")
        have = _cpu_flags()
        missing = [flag for flag in needs if have is None or flag not in have]
        if missing:
            raise RuntimeError(f"{ISA_ENV}={name} needs {', '.join(missing)}, which this CPU lacks")
    return name, flags


def _key(compiler: str, flags: tuple[str, ...]) -> str:
    sources = [path.read_bytes() for path in SOURCES]
    return hashlib.sha256(
        b"\0".join(
            [
                *sources,
                compiler.encode(),
                " ".join(flags).encode(),
                platform.machine().encode(),
                _cpu_signature().encode(),
            ]
        )
    ).hexdigest()[:16]


def cache_dir() -> Path:
    """kvbench's cache folder (where the built library lives)."""
    return private_cache.cache_dir()


def _build(compiler: str, flags: tuple[str, ...], library: Path, digest: Path) -> None:
    """Compile into a scratch folder beside the cache, record the digest, then rename the library into place."""
    with tempfile.TemporaryDirectory(dir=library.parent, prefix=".build-") as scratch:
        partial = Path(scratch) / library.name
        done = subprocess.run(
            [compiler, *flags, "-o", str(partial), *map(str, SOURCES)], capture_output=True, text=True, timeout=300
        )
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise RuntimeError(f"{Path(compiler).name} failed: {tail[0]}")
        private_cache.write_bytes(digest, (private_cache.sha256_hex(partial.read_bytes()) + "\n").encode())
        os.replace(partial, library)  # atomic; a concurrent build of the same key writes the same bytes


SIGNATURES = {
    "kvbench_isa": (ctypes.c_int, []),
    "kvbench_paged_decode_f32": (
        ctypes.c_int,
        ["p", "i", "i", "p", "p", "p", "i", "p", "p", "i", "i", "i", "i", "i", "f", "i", "i"],
    ),
    "kvbench_paged_decode_bf16": (
        ctypes.c_int,
        ["p", "i", "i", "p", "p", "p", "i", "p", "p", "i", "i", "i", "i", "i", "f", "i", "i"],
    ),
    "kvbench_paged_prefill_f32": (
        ctypes.c_int,
        ["p", "i", "i", "p", "p", "p", "i", "p", "p", "p", "i", "i", "i", "i", "i", "f"],
    ),
    "kvbench_paged_prefill_bf16": (
        ctypes.c_int,
        ["p", "i", "i", "p", "p", "p", "i", "p", "p", "p", "i", "i", "i", "i", "i", "f"],
    ),
    "kvbench_rms_norm_f32": (None, ["p", "p", "p", "p", "i", "i", "f"]),
    "kvbench_rms_norm_bf16": (None, ["p", "p", "p", "p", "i", "i", "f"]),
    "kvbench_silu_and_mul_f32": (None, ["p", "p", "i", "i"]),
    "kvbench_silu_and_mul_bf16": (None, ["p", "p", "i", "i"]),
    "kvbench_rotary_f32": (None, ["p", "i", "p", "p", "i", "i", "i"]),
    "kvbench_rotary_bf16": (None, ["p", "i", "p", "p", "i", "i", "i"]),
    "kvbench_write_kv": (None, ["p", "p", "i", "i", "p", "p", "p", "i", "i"]),
    "kvbench_amx_init": (ctypes.c_int, []),
    "kvbench_all_bf16": (ctypes.c_int, ["p", "i"]),
    "kvbench_split3_bf16": (None, ["p", "i", "i", "i", "p", "i", "i"]),
    "kvbench_amx_linear_f32": (None, ["p", "i", "i", "p", "i", "p", "i", "i", "i", "i", "i"]),
    "kvbench_linear_bf16w_f32": (None, ["p", "i", "i", "i", "p", "i", "i", "i", "p", "i", "i"]),
    "kvbench_linear_bf16dot": (ctypes.c_int, ["p", "i", "i", "i", "p", "i", "i", "i", "p", "p", "i", "i"]),
    "kvbench_peak_vector_bits": (ctypes.c_int, []),
    "kvbench_peak_fma": (ctypes.c_int64, ["i", "p"]),
    "kvbench_peak_dpbf16": (ctypes.c_int64, ["i", "p"]),
    "kvbench_read_sweep": (ctypes.c_int64, ["p", "i", "p"]),
}
_CTYPES = {"p": ctypes.c_void_p, "i": ctypes.c_int64, "f": ctypes.c_float}


def _bind(lib: ctypes.CDLL) -> None:
    """Every entry point's signature (AttributeError when the library lacks one)."""
    for name, (restype, argtypes) in SIGNATURES.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, [_CTYPES[code] for code in argtypes]


def _open(library: Path, data: bytes) -> ctypes.CDLL:
    """Load exactly the verified bytes: from an in-memory copy where Linux offers one (nothing can swap the file
    between the check and the load), else from the checked path."""
    if hasattr(os, "memfd_create"):
        fd = os.memfd_create(f"kvbench-{library.stem}", 0)
        try:
            os.write(fd, data)
            lib = ctypes.CDLL(f"/proc/self/fd/{fd}")
            _state.setdefault("fds", []).append(fd)  # kept open: a unique name
            return lib
        except OSError:
            os.close(fd)  # e.g. executable memfds forbidden: the checked path below
    return ctypes.CDLL(str(library))


def _load_verified(library: Path, digest: Path) -> tuple[ctypes.CDLL | None, str | None]:
    """The cached library if it is safe, matches its recorded digest and loads with every entry point; else None
    and why (None when there is simply no library yet)."""
    try:
        data = private_cache.read_bytes(library)
        if data is None:
            return None, None
        recorded = private_cache.read_bytes(digest)
    except private_cache.UnsafeCache as error:
        return None, str(error)
    if recorded is None:
        return None, f"{library.name} has no digest recorded beside it"
    if private_cache.sha256_hex(data) != recorded.decode("ascii", "replace").strip():
        return None, f"{library.name} does not match the digest recorded when it was built"
    try:
        lib = _open(library, data)
        _bind(lib)
    except (OSError, AttributeError) as error:
        return None, f"{library.name} would not load ({str(error).splitlines()[0][:160]})"
    return lib, None


def _load() -> ctypes.CDLL | None:
    with _lock:
        if "lib" in _state or "reason" in _state:
            return _state.get("lib")
        if not env_settings.switch(ENV, True):
            _state["reason"] = f"turned off by {ENV}=0"
            return None
        try:
            isa, isa_flags = _isa_flags()
        except RuntimeError as error:
            _state["reason"] = str(error)
            return None
        compiler = _compiler()
        if compiler is None:
            _state["reason"] = "no C compiler found (cc, gcc, clang or $CC)"
            return None
        flags = (*FLAGS, *isa_flags)
        try:
            folder = private_cache.private_dir()
            key = _key(compiler, flags)
        except (private_cache.UnsafeCache, OSError) as error:
            _state["reason"] = f"the kernel cache cannot be used: {error}"
            return None
        library, digest = folder / f"cpu_ops-{key}.so", folder / f"cpu_ops-{key}.sha256"
        lib, why_not = _load_verified(library, digest)
        if lib is None:
            if why_not is not None:
                private_cache.note(f"rebuilding the CPU kernels: {why_not}")
            try:
                _build(compiler, flags, library, digest)
            except (OSError, RuntimeError, subprocess.SubprocessError) as error:
                _state["reason"] = f"could not build the CPU kernels: {error}"
                return None
            lib, why_not = _load_verified(library, digest)
            if lib is None:
                _state["reason"] = f"the CPU kernels, just built, would not load: {why_not}"
                return None
        _state["lib"], _state["isa"], _state["key"] = lib, isa, key
        return lib


def available() -> bool:
    """Whether the C kernels are built and loaded (builds them on the first call)."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why :func:`available` is False (None when it is True)."""
    _load()
    return _state.get("reason")


def instruction_sets() -> list[str]:
    """What the loaded build was compiled for (``["AVX2", "AVX-512", ...]``; empty without the kernels)."""
    lib = _load()
    if lib is None:
        return []
    bits = lib.kvbench_isa()
    return [name for bit, name in ISA_BITS.items() if bits & bit]


def build_key() -> str | None:
    """The loaded build's key (it changes with the C sources, the compiler, its flags and the CPU), or None without
    the kernels: what a measurement of the kernels' speed is cached under."""
    return _state.get("key") if _load() is not None else None


def build_description() -> str:
    """One line: the variant and instruction sets of the C kernels, or why there are none."""
    lib = _load()
    if lib is None:
        return f"C kernels unavailable ({unavailable_reason()})"
    sets = instruction_sets()
    return f"C kernels built for {_state.get('isa')}: {', '.join(sets) if sets else 'no vector extensions'}"


def supports(query: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the C decode kernel takes these tensors: float32 or bfloat16 on the CPU (one dtype), a contiguous
    pool."""
    return (
        query.device.type == "cpu"
        and query.dtype in KERNEL_DTYPES
        and k_cache.dtype == query.dtype
        and k_cache.is_contiguous()
    )


@dataclass(frozen=True)
class DecodePrefetch:
    """How the C decode attention prefetches the K/V rows it reads next: ``ahead`` tokens ahead (0: not at all),
    into the ``level`` 1 (L1) or 2 (L2) cache. Which pays depends on the CPU (kvbench.cpu.decode_prefetch
    measures it)."""

    ahead: int
    level: int

    def __post_init__(self) -> None:
        if not 0 <= self.ahead <= MAX_PREFETCH_AHEAD or self.level not in (1, 2):
            raise ValueError(
                f"a decode prefetch is 0 to {MAX_PREFETCH_AHEAD} tokens ahead into L1 or L2, got {self.ahead} "
                f"tokens into level {self.level}"
            )

    def describe(self) -> str:
        return "off" if self.ahead == 0 else f"{self.ahead} tokens ahead into L{self.level}"


MAX_PREFETCH_AHEAD = 1024
DEFAULT_PREFETCH = DecodePrefetch(16, 1)  # where nothing was measured: what the kernel did before it was measured


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
    max_context_len: int | None = None,
    prefetch: DecodePrefetch = DEFAULT_PREFETCH,
) -> torch.Tensor:
    """The contract of ``reference.paged_decode_attention``, computed in place over the pool.

    Every table entry a context reaches must be a block of the pool (the runner's tables are); the table width
    is checked here, since C reads past nothing it is not told about. ``prefetch`` only changes the speed.
    """
    lib = _library()
    if not supports(query, k_cache) or v_cache.dtype != query.dtype or not v_cache.is_contiguous():
        raise ValueError(
            f"the C decode kernel takes float32 or bfloat16 q, K and V of one dtype, got {query.dtype}, "
            f"{k_cache.dtype}, {v_cache.dtype}"
        )
    if query.stride(-1) != 1:
        query = query.contiguous()
    tables = (
        block_tables
        if block_tables.dtype == torch.int32 and block_tables.stride(-1) == 1
        else (block_tables.to(torch.int32).contiguous())
    )
    lens = (
        context_lens
        if context_lens.dtype == torch.int32 and context_lens.is_contiguous()
        else (context_lens.to(torch.int32).contiguous())
    )
    batch, num_heads, head_dim = query.shape
    longest = int(lens.max()) if max_context_len is None and batch else (max_context_len or 0)
    if lens.shape[0] != batch or tables.shape[0] < batch or tables.shape[1] * k_cache.shape[1] < longest:
        raise ValueError(
            f"{batch} queries need {batch} context lengths and block tables covering {longest} "
            f"tokens; got {lens.shape[0]} lengths and tables {tuple(tables.shape)}"
        )
    result = (
        out
        if out is not None and out.is_contiguous() and out.dtype == query.dtype
        else torch.empty((batch, num_heads, head_dim), dtype=query.dtype)
    )
    kernel = lib.kvbench_paged_decode_f32 if query.dtype == torch.float32 else lib.kvbench_paged_decode_bf16
    if batch:
        status = kernel(
            query.data_ptr(),
            query.stride(0),
            query.stride(1),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            tables.data_ptr(),
            tables.stride(0),
            lens.data_ptr(),
            result.data_ptr(),
            batch,
            num_heads,
            k_cache.shape[2],
            head_dim,
            k_cache.shape[1],
            scale,
            prefetch.ahead,
            prefetch.level,
        )
        if status != 0:
            raise MemoryError("the CPU decode kernel could not allocate its scratch memory")
    if out is not None and result is not out:
        out.copy_(result)
        return out
    return result


MAX_PREFILL_HEAD_DIM = 256  # the C prefill keeps a head's output row in 16 vectors


def takes_prefill(k_cache: torch.Tensor) -> bool:
    """Whether the C prefill kernel takes a pool like this: float32 or bfloat16 on the CPU, contiguous, a head_dim
    that is a multiple of 16 up to 256."""
    head_dim = k_cache.shape[-1]
    return (
        k_cache.device.type == "cpu"
        and k_cache.dtype in KERNEL_DTYPES
        and k_cache.is_contiguous()
        and head_dim % 16 == 0
        and head_dim <= MAX_PREFILL_HEAD_DIM
    )


def paged_prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The contract of ``reference.paged_prefill_attention`` (the new tokens of each request attend causally to its
    cached context and themselves, whose K/V are already written), computed over the pool in place."""
    lib = _library()
    if not (takes_prefill(k_cache) and query.dtype == k_cache.dtype == v_cache.dtype and v_cache.is_contiguous()):
        raise ValueError(
            f"the C prefill kernel takes float32 or bfloat16 q, K and V of one dtype and a head_dim that "
            f"is a multiple of 16 up to {MAX_PREFILL_HEAD_DIM}, got {query.dtype} {tuple(k_cache.shape)}"
        )
    if query.stride(-1) != 1:
        query = query.contiguous()
    tables = block_tables.to(torch.int32).contiguous()
    starts = query_start_loc.to(torch.int32).contiguous()
    lens = context_lens.to(torch.int32).contiguous()
    tokens, num_heads, head_dim = query.shape
    batch = lens.shape[0]
    longest = int(lens.max()) if batch else 0
    if (
        starts.shape[0] != batch + 1
        or tables.shape[0] < batch
        or tables.shape[1] * k_cache.shape[1] < longest
        or (batch and int(starts[-1]) != tokens)
    ):
        raise ValueError(
            f"{tokens} new tokens of {batch} requests need {batch + 1} query starts ending at {tokens} and "
            f"tables covering {longest} tokens; got {tuple(starts.shape)} starts, tables "
            f"{tuple(tables.shape)}"
        )
    result = (
        out
        if out is not None and out.is_contiguous() and out.dtype == query.dtype
        else torch.empty((tokens, num_heads, head_dim), dtype=query.dtype)
    )
    kernel = lib.kvbench_paged_prefill_f32 if query.dtype == torch.float32 else lib.kvbench_paged_prefill_bf16
    if batch and tokens:
        status = kernel(
            query.data_ptr(),
            query.stride(0),
            query.stride(1),
            k_cache.data_ptr(),
            v_cache.data_ptr(),
            tables.data_ptr(),
            tables.stride(0),
            starts.data_ptr(),
            lens.data_ptr(),
            result.data_ptr(),
            batch,
            num_heads,
            k_cache.shape[2],
            head_dim,
            k_cache.shape[1],
            scale,
        )
        if status != 0:
            raise MemoryError("the CPU prefill kernel could not allocate its scratch memory")
    if out is not None and result is not out:
        out.copy_(result)
        return out
    return result


def takes_write(key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, slot_mapping: torch.Tensor) -> bool:
    """Whether :func:`write_kv` takes these tensors: one dtype on the CPU, each token's heads contiguous."""
    return (
        key.dtype == value.dtype == k_cache.dtype
        and key.device.type == "cpu"
        and k_cache.is_contiguous()
        and slot_mapping.dtype == torch.int64
        and slot_mapping.is_contiguous()
        and key.stride(-1) == 1
        and key.stride(-2) == key.shape[-1]
        and value.stride(-1) == 1
        and value.stride(-2) == value.shape[-1]
    )


def write_kv(
    key: torch.Tensor, value: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """``reference.write_kv``: ``key``/``value [T, Hkv, D]`` into the pools at ``slot_mapping[T]`` (-1 skipped).

    Slots must lie inside the pool (the runner's do); their count is checked here."""
    tokens = key.shape[0]
    row = k_cache.shape[2] * k_cache.shape[3]
    if slot_mapping.shape[0] != tokens or value.shape != key.shape or key.shape[1] * key.shape[2] != row:
        raise ValueError(
            f"write_kv: {tuple(key.shape)} keys, {tuple(value.shape)} values and "
            f"{tuple(slot_mapping.shape)} slots do not fit a pool of rows of {row}"
        )
    size = key.element_size()
    _library().kvbench_write_kv(
        key.data_ptr(),
        value.data_ptr(),
        key.stride(0) * size,
        value.stride(0) * size,
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        slot_mapping.data_ptr(),
        tokens,
        row * size,
    )


# -- the runner's element-wise ops ---------------------------------------------------------------------------------
MAX_ROTARY_HEAD_DIM = 1024  # the C rotary's per-head scratch


def use_for_model_ops(device: torch.device, dtype: torch.dtype, head_dim: int) -> bool:
    """Whether the runner should use the C norm, SiLU-and-multiply and rotary ops: float32 or bfloat16 on a CPU,
    torch on one thread (the C ops run on one core; with more threads torch's own ops use them all), and the kernels
    built."""
    return (
        device.type == "cpu"
        and dtype in KERNEL_DTYPES
        and head_dim <= MAX_ROTARY_HEAD_DIM
        and torch.get_num_threads() == 1
        and available()
    )


def _library() -> ctypes.CDLL:
    lib = _state.get("lib")  # loaded: no lock (the per-call path of every op)
    if lib is not None:
        return lib
    lib = _load()
    if lib is None:
        raise RuntimeError(unavailable_reason() or "the CPU kernels are not available")
    return lib


def _rows(x: torch.Tensor) -> tuple[int, int]:
    if x.dtype not in KERNEL_DTYPES or x.device.type != "cpu" or not x.is_contiguous():
        raise ValueError(
            f"the CPU kernels take contiguous float32 or bfloat16 CPU tensors, got {x.dtype} {tuple(x.shape)}"
        )
    return x.numel() // x.shape[-1], x.shape[-1]


def _same_dtype(x: torch.Tensor, *others: torch.Tensor) -> None:
    if any(other.dtype != x.dtype for other in others):
        raise ValueError(
            f"the CPU kernels take tensors of one dtype, got {x.dtype} and "
            f"{', '.join(str(other.dtype) for other in others)}"
        )


def _kernel(name: str, x: torch.Tensor):
    """The library's ``kvbench_<name>_f32`` or ``_bf16`` for ``x``'s dtype (looked up once per name and dtype)."""
    lib = _library()
    table = _state.setdefault("kernels", {})
    key = (name, x.dtype)
    if key not in table:
        table[key] = getattr(lib, f"kvbench_{name}_{'f32' if x.dtype == torch.float32 else 'bf16'}")
    return table[key]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``torch.nn.functional.rms_norm`` over the last dimension of a contiguous float32 or bfloat16 ``x``."""
    rows, width = _rows(x)
    _same_dtype(x, weight)
    out = torch.empty_like(x)
    _kernel("rms_norm", x)(x.data_ptr(), None, weight.contiguous().data_ptr(), out.data_ptr(), rows, width, eps)
    return out


def add_rms_norm_(hidden: torch.Tensor, delta: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``hidden += delta`` in place, then the RMSNorm of the new ``hidden`` (a decoder layer's residual step)."""
    rows, width = _rows(hidden)
    if delta.shape != hidden.shape or not delta.is_contiguous():
        raise ValueError(f"delta {tuple(delta.shape)} must match hidden {tuple(hidden.shape)}, contiguous")
    _same_dtype(hidden, delta, weight)
    out = torch.empty_like(hidden)
    _kernel("rms_norm", hidden)(
        hidden.data_ptr(), delta.data_ptr(), weight.contiguous().data_ptr(), out.data_ptr(), rows, width, eps
    )
    return out


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` where ``gate_up [rows, 2 * I]`` holds gate then up, as ``[rows, I]``."""
    rows, width = _rows(gate_up)
    out = torch.empty((*gate_up.shape[:-1], width // 2), dtype=gate_up.dtype)
    _kernel("silu_and_mul", gate_up)(gate_up.data_ptr(), out.data_ptr(), rows, width // 2)
    return out


def rotary_(qkv: torch.Tensor, heads: int, cos: torch.Tensor, signed_sin: torch.Tensor) -> None:
    """Rotate the first ``heads`` heads of ``qkv [T, H, D]`` in place (``apply_rotary``'s formula and tables)."""
    tokens, _, head_dim = qkv.shape
    _rows(qkv)
    if (
        head_dim > MAX_ROTARY_HEAD_DIM
        or head_dim % 2
        or cos.shape != (tokens, head_dim)
        or (signed_sin.shape != cos.shape)
    ):
        raise ValueError(f"rotary tables {tuple(cos.shape)} do not fit q/k/v {tuple(qkv.shape)}")
    cos, signed_sin = cos.to(qkv.dtype).contiguous(), signed_sin.to(qkv.dtype).contiguous()
    _kernel("rotary", qkv)(
        qkv.data_ptr(), qkv.stride(0), cos.data_ptr(), signed_sin.data_ptr(), tokens, heads, head_dim
    )
