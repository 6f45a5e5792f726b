"""What ``kvbench kernels`` measures, typed: paged decode attention against contiguous SDPA of the same shapes at
each (batch, context), and the run's settings; ``to_json`` is the command's JSON output."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

BENCHMARK = "paged_decode_attention"  # the one benchmark the command runs


@dataclass(frozen=True)
class DecodePoint:
    """One benchmark row; times in milliseconds, bandwidth in GB/s (1e9 bytes)."""

    batch: int
    context: int
    status: str  # ok | skipped: <why>
    paged_ms: float | None = None
    contiguous_ms: float | None = None
    paged_over_contiguous: float | None = None
    paged_gbps: float | None = None
    contiguous_gbps: float | None = None
    pct_of_copy_bandwidth: float | None = None  # CUDA: of the measured copy bandwidth
    reference_gbps: float | None = None  # CPU: torch reading the point's bytes
    pct_of_read_bandwidth: float | None = None  # CPU: paged GB/s as a share of reference_gbps
    num_splits: int | None = None  # Triton's split-KV partitions (None: another backend)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict[str, Any]:
        return {
            "batch": self.batch,
            "context": self.context,
            "status": self.status,
            "paged_ms": self.paged_ms,
            "contiguous_ms": self.contiguous_ms,
            "paged_over_contiguous": self.paged_over_contiguous,
            "paged_gbps": self.paged_gbps,
            "contiguous_gbps": self.contiguous_gbps,
            "pct_of_copy_bandwidth": self.pct_of_copy_bandwidth,
            "reference_gbps": self.reference_gbps,
            "pct_of_read_bandwidth": self.pct_of_read_bandwidth,
            "num_splits": self.num_splits,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DecodePoint:
        return cls(
            batch=data["batch"],
            context=data["context"],
            status=data["status"],
            paged_ms=data.get("paged_ms"),
            contiguous_ms=data.get("contiguous_ms"),
            paged_over_contiguous=data.get("paged_over_contiguous"),
            paged_gbps=data.get("paged_gbps"),
            contiguous_gbps=data.get("contiguous_gbps"),
            pct_of_copy_bandwidth=data.get("pct_of_copy_bandwidth"),
            reference_gbps=data.get("reference_gbps"),
            pct_of_read_bandwidth=data.get("pct_of_read_bandwidth"),
            num_splits=data.get("num_splits"),
        )


@dataclass(frozen=True)
class DecodeBenchmark:
    """A ``kvbench kernels`` run: where and how it ran, and its points."""

    device: str  # cpu | cuda
    device_name: str  # the GPU's name, or cpu
    backend: str  # the paged kernel: torch | triton | native
    dtype: str  # fp32 | fp16 | bf16
    model: str  # the preset whose head shapes were used, or custom
    num_heads: int
    num_kv_heads: int
    head_dim: int
    block_size: int
    copy_bandwidth_gbps: float | None  # CUDA: the measured copy bandwidth; None on a CPU (each point has its own)
    native_build: str | None  # the C kernel's build (the native backend)
    torch_version: str
    points: list[DecodePoint] = field(default_factory=list)
    benchmark: str = BENCHMARK

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    def to_json(self) -> dict[str, Any]:
        return {
            "benchmark": self.benchmark,
            "device": self.device,
            "device_name": self.device_name,
            "backend": self.backend,
            "dtype": self.dtype,
            "model": self.model,
            "num_heads": self.num_heads,
            "num_kv_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "block_size": self.block_size,
            "copy_bandwidth_gbps": self.copy_bandwidth_gbps,
            "native_build": self.native_build,
            "torch_version": self.torch_version,
            "points": [point.to_json() for point in self.points],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> DecodeBenchmark:
        return cls(
            device=data["device"],
            device_name=data["device_name"],
            backend=data["backend"],
            dtype=data["dtype"],
            model=data["model"],
            num_heads=data["num_heads"],
            num_kv_heads=data["num_kv_heads"],
            head_dim=data["head_dim"],
            block_size=data["block_size"],
            copy_bandwidth_gbps=data.get("copy_bandwidth_gbps"),
            native_build=data.get("native_build"),
            torch_version=data.get("torch_version", ""),
            points=[DecodePoint.from_json(point) for point in data.get("points", [])],
            benchmark=data.get("benchmark", BENCHMARK),
        )
