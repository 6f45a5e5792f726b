"""How a run was made, typed from its ``meta``: the command, date, versions, model and its shape, device, host and
GPU, threads. A field the run did not record (an older run, another tool's file) is None; a value of the wrong
kind is left out as not recorded, never shown as another."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvbench.values import is_number


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
            _number(data.get("memory_bytes")),
            _text(data.get("driver")),
            _text(data.get("cuda")),
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
            _text(data.get("cpu")),
            _number(data.get("cores")),
            _number(data.get("memory_bytes")),
            _text(data.get("machine")),
            GpuFacts.from_json(gpu) if isinstance(gpu, Mapping) and gpu else None,
        )


@dataclass(frozen=True)
class Provenance:
    command: str | None
    created_utc: str | None
    kvbench_version: str | None
    git_revision: str | None
    model_name: Any  # the name as recorded (a preset, a path, a Hugging Face id)
    shape: Mapping[str, Any] | None  # the model's shape as recorded (layers, heads, dtype, KV bytes per token)
    bytes_per_token: int | None  # KV bytes per token, where no shape was recorded
    device: Any
    simulated: bool
    host: HostFacts | None  # None: not recorded
    threads: int | None
    threads_reason: str
    platform: str | None
    versions: dict[str, str]  # python, torch, transformers, triton, then the recorded packages

    @classmethod
    def from_meta(cls, meta: Mapping[str, Any]) -> Provenance:
        model = meta.get("model") if isinstance(meta.get("model"), Mapping) else None
        shape = meta.get("model_shape") if isinstance(meta.get("model_shape"), Mapping) else model
        host = meta.get("host")
        threads: Mapping[str, Any] = meta["threads"] if isinstance(meta.get("threads"), Mapping) else {}
        packages: Mapping[str, Any] = meta["packages"] if isinstance(meta.get("packages"), Mapping) else {}
        versions = {
            "python": meta.get("python_version"),
            "torch": meta.get("torch_version"),
            "transformers": meta.get("transformers_version"),
            "triton": meta.get("triton_version"),
            **packages,
        }
        return cls(
            command=_text(meta.get("command")),
            created_utc=_text(meta.get("created_utc")),
            kvbench_version=_text(meta.get("kvbench_version")),
            git_revision=_text(meta.get("git_revision")),
            model_name=meta.get("model_name") or (model or {}).get("name") or meta.get("model"),
            shape=shape or None,
            bytes_per_token=_number(meta.get("bytes_per_token")),
            device=meta.get("device") or meta.get("gpu"),
            simulated=bool(meta.get("simulated")),
            host=HostFacts.from_json(host) if isinstance(host, Mapping) and host else None,
            threads=_number(threads.get("threads")) or None,
            threads_reason=str(threads.get("reason", "")),
            platform=_text(meta.get("platform")),
            versions={name: str(version) for name, version in versions.items() if version},
        )


def _text(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def _number(value: Any) -> int | None:
    return int(value) if is_number(value, finite=True) else None
