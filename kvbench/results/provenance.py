"""How a run was made, as its provenance shows it from any kind's ``meta``: what every run records (read through
:class:`RunMeta`), the model and its shape, the device, the threads. A field the run did not record (an older run,
another tool's file) is None; a value of the wrong kind is left out as not recorded, never shown as another."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvbench.results.environment import HostFacts
from kvbench.results.run_meta import RunMeta
from kvbench.values import is_number


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
        run = RunMeta.from_json(meta)  # what every run records; the rest as a reader of any kind's meta shows it
        model = meta.get("model") if isinstance(meta.get("model"), Mapping) else None
        shape = meta.get("model_shape") if isinstance(meta.get("model_shape"), Mapping) else model
        threads: Mapping[str, Any] = meta["threads"] if isinstance(meta.get("threads"), Mapping) else {}
        versions = {
            "python": run.python_version,
            "torch": run.torch_version,
            "transformers": run.transformers_version,
            "triton": run.triton_version,
            **run.packages,
        }
        return cls(
            command=run.command,
            created_utc=run.created_utc,
            kvbench_version=run.kvbench_version,
            git_revision=run.git_revision,
            model_name=meta.get("model_name") or (model or {}).get("name") or meta.get("model"),
            shape=shape or None,
            bytes_per_token=_number(meta.get("bytes_per_token")),
            device=meta.get("device") or meta.get("gpu"),
            simulated=run.simulated,
            host=run.host,
            threads=_number(threads.get("threads")) or None,
            threads_reason=str(threads.get("reason", "")),
            platform=run.platform,
            versions={name: str(version) for name, version in versions.items() if version},
        )


def _number(value: Any) -> int | None:
    return int(value) if is_number(value, finite=True) else None
