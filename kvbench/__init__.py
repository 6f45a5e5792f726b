"""kvbench: measure where KV-cache memory goes, and what paging buys."""

import os

# Transparent huge pages for torch's large CPU allocations (weights, the KV pool): a decode step streams every
# weight from memory, and with 4 KiB pages the TLB misses cost about a tenth of it (measured on the 1.1B shape's
# decode matmuls, 16 rows, 1 thread: 66-67 GFLOP/s without, 71-77 with). torch reads the variable once, at its
# first allocation, so it is set before anything of kvbench imports torch; a value set by the user is kept.
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")


def __getattr__(name: str) -> str:
    """``__version__``, read on first use: importlib.metadata costs more than the rest of ``kvbench --help``."""
    if name != "__version__":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        value = version("kvbench")  # pyproject.toml's, as installed: the one place the version is written
    except PackageNotFoundError:  # a source tree that was never installed
        value = "0+unknown"
    globals()["__version__"] = value
    return value
