"""How a run was made, as its provenance shows it from any kind's ``meta``: what every run records (read through
:class:`RunMeta`), the model and its shape, the device, the threads. A field the run did not record (an older run,
another tool's file) is None; a value of the wrong kind is left out as not recorded, never shown as another."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kvbench.results.environment import HostFacts
from kvbench.results.model_shape_facts import ModelShapeFacts
from kvbench.results.run_meta import RunMeta
from kvbench.values import int_or_none


@dataclass(frozen=True)
class Provenance:
    command: str | None
    created_utc: str | None
    kvbench_version: str | None
    git_revision: str | None
    model_name: Any  # the name as recorded (a preset, a path, a Hugging Face id)
    shape: ModelShapeFacts | None  # the model's shape as recorded (layers, heads, dtype, KV bytes per token)
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
        # Shown as a page states them, unlike RunMeta's titles: the model falls back to the shape's name on an empty
        # model_name and to a dataset's tokenizer (``model`` as text); the device to the preset a study records
        # as ``gpu``, a null device counting as none; threads only with the reason a CPU run records beside them.
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
            shape=ModelShapeFacts.from_json(shape) if shape else None,
            bytes_per_token=int_or_none(meta.get("bytes_per_token")),
            device=meta.get("device") or meta.get("gpu"),
            simulated=run.simulated,
            host=run.host,
            threads=(int(run.threads) or None) if threads and run.threads is not None else None,
            threads_reason=str(threads.get("reason", "")),
            platform=run.platform,
            versions={name: str(version) for name, version in versions.items() if version},
        )
