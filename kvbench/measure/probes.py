"""Memory probes: process RSS, ``torch.cuda.memory_stats`` and NVML, each reporting "unavailable" cleanly.

A ``MemorySampler`` polls them on a background thread during a run and keeps the peaks.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field

import torch


def process_rss_bytes() -> int | None:
    """Resident set size of this process (Linux /proc; None where not readable)."""
    try:
        with open(f"/proc/{os.getpid()}/statm", encoding="ascii") as handle:
            resident_pages = int(handle.read().split()[1])
        return resident_pages * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def torch_cuda_stats(device: torch.device | None = None) -> dict[str, int] | None:
    """Current allocated / reserved / inactive-split bytes of torch's caching allocator, or None off CUDA."""
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    stats = torch.cuda.memory_stats(device)
    return {
        "allocated": int(stats.get("allocated_bytes.all.current", 0)),
        "reserved": int(stats.get("reserved_bytes.all.current", 0)),
        "inactive_split": int(stats.get("inactive_split_bytes.all.current", 0)),
    }


class NvmlProbe:
    """Device and per-process GPU memory from NVML; ``available`` is False (with ``reason``) without NVIDIA."""

    def __init__(self, device_index: int = 0) -> None:
        self.available = False
        self.reason = ""
        self._handle = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
            self.available = True
        except Exception as err:  # library missing, no driver, no device: all mean "unavailable"
            self.reason = f"NVML unavailable: {type(err).__name__}: {err}".strip()

    def device_used_bytes(self) -> int | None:
        if not self.available:
            return None
        try:
            return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used)
        except Exception:
            return None

    def process_used_bytes(self) -> int | None:
        if not self.available:
            return None
        try:
            for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle):
                if proc.pid == os.getpid():
                    return int(proc.usedGpuMemory or 0)
        except Exception:
            return None
        return None


@dataclass
class MemoryPeaks:
    rss_peak_bytes: int | None = None
    torch_allocated_peak_bytes: int | None = None
    torch_reserved_peak_bytes: int | None = None
    torch_inactive_split_peak_bytes: int | None = None
    nvml_used_peak_bytes: int | None = None
    nvml_process_peak_bytes: int | None = None
    notes: list[str] = field(default_factory=list)

    def update(self, name: str, value: int | None) -> None:
        if value is not None:
            current = getattr(self, name)
            setattr(self, name, value if current is None else max(current, value))

    def as_dict(self) -> dict[str, int | None]:
        return {k: v for k, v in self.__dict__.items() if k != "notes"}


class MemorySampler:
    """Samples every probe every ``interval_s`` on a daemon thread between ``start`` and ``stop``."""

    def __init__(self, device: torch.device | None = None, interval_s: float = 0.05) -> None:
        self.device = device
        self.interval_s = interval_s
        self.peaks = MemoryPeaks()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml = NvmlProbe(device.index or 0) if device is not None and device.type == "cuda" else None
        if self._nvml is None:
            self.peaks.notes.append("NVML and torch.cuda unavailable: not a CUDA device")
        elif not self._nvml.available:
            self.peaks.notes.append(self._nvml.reason)

    def sample(self) -> None:
        self.peaks.update("rss_peak_bytes", process_rss_bytes())
        stats = torch_cuda_stats(self.device)
        if stats is not None:
            self.peaks.update("torch_allocated_peak_bytes", stats["allocated"])
            self.peaks.update("torch_reserved_peak_bytes", stats["reserved"])
            self.peaks.update("torch_inactive_split_peak_bytes", stats["inactive_split"])
        if self._nvml is not None and self._nvml.available:
            self.peaks.update("nvml_used_peak_bytes", self._nvml.device_used_bytes())
            self.peaks.update("nvml_process_peak_bytes", self._nvml.process_used_bytes())

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> MemorySampler:
        self.sample()
        self._thread = threading.Thread(target=self._loop, name="kvbench-memory-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=1.0)
        self.sample()
