"""Where a run ran, for its provenance: the host's CPU, cores and memory, the GPU and its driver, and the
versions of the packages its figures depend on. Each probe is cheap and never fails a run: what cannot be
read is left out. :class:`HostFacts` reads the host's record back."""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvbench.values import int_or_none, text_or_none

# The packages whose versions decide a figure (kernels, numerics, plots, the report), and optional engines.
PACKAGES = (
    "torch",
    "transformers",
    "triton",
    "numpy",
    "scipy",
    "pandas",
    "matplotlib",
    "jinja2",
    "safetensors",
    "gguf",
    "accelerate",
    "ray",
    "vllm",
    "nvidia-ml-py",
    "prometheus-client",
    "typer",
    "rich",
)


def package_versions() -> dict[str, str]:
    """Installed versions of :data:`PACKAGES` (those not installed are left out)."""
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in PACKAGES:
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            continue
        except Exception:  # a broken distribution's metadata must not stop a run
            continue
    return found


def cpu_model() -> str | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        pass
    return platform.processor() or None


def memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return None


def usable_cores() -> int | None:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count()


def gpu_info() -> dict[str, Any] | None:
    """The CUDA device of a process that already uses torch (a simulation or a CPU run imports no CUDA for
    this): its name, memory, the CUDA version torch was built with and the driver's version (NVML)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        index = torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        info: dict[str, Any] = {
            "name": props.name,
            "memory_bytes": int(props.total_memory),
            "count": torch.cuda.device_count(),
            "cuda": torch.version.cuda,
        }
    except Exception:
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        driver = pynvml.nvmlSystemGetDriverVersion()
        info["driver"] = driver.decode() if isinstance(driver, bytes) else str(driver)
    except Exception:
        info["driver"] = None
    return info


def host_info() -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cores": usable_cores(),
        "memory_bytes": memory_bytes(),
        "machine": platform.machine(),
        "gpu": gpu_info(),
    }


@dataclass(frozen=True)
class GpuFacts:
    name: Any  # as recorded (shown as text)
    count: int
    memory_bytes: int | None
    driver: str | None
    cuda: str | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> GpuFacts:
        count = data.get("count")
        return cls(
            data.get("name"),
            count if isinstance(count, int) and not isinstance(count, bool) else 1,
            int_or_none(data.get("memory_bytes")),
            text_or_none(data.get("driver")),
            text_or_none(data.get("cuda")),
        )


@dataclass(frozen=True)
class HostFacts:
    cpu: str | None
    cores: int | None
    memory_bytes: int | None
    machine: str | None
    gpu: GpuFacts | None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> HostFacts:
        gpu = data.get("gpu")
        return cls(
            text_or_none(data.get("cpu")),
            int_or_none(data.get("cores")),
            int_or_none(data.get("memory_bytes")),
            text_or_none(data.get("machine")),
            GpuFacts.from_json(gpu) if isinstance(gpu, Mapping) and gpu else None,
        )
