"""The deployment a model-free study sizes (``capacity``, ``waste``, ``reuse``), declared once: the model, the GPU
and its memory, the dtypes and the parallelism. ``@DEPLOYMENT.add()`` hands a command one parsed
:class:`Deployment` as its ``deployment`` argument."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

import typer

from kvbench.commands._flags import DTYPE, GPU, GPU_MEMORY_UTILIZATION, KV_MEMORY, MODEL
from kvbench.commands._option_group import OptionGroup, SharedOption
from kvbench.commands._options import choice, parse_size
from kvbench.studies.capacity import KV_CACHE_DTYPES

PANEL = "Deployment"


@dataclass(frozen=True)
class Deployment:
    model: str
    gpu: str | None  # a preset; None where the command picks one
    gpu_memory: int | None  # bytes of one GPU, where given
    utilization: float
    kv_cache_memory: int | None  # bytes of KV cache per GPU, where set directly
    dtype: str
    kv_cache_dtype: str
    tensor_parallel: int
    pipeline_parallel: int


DEPLOYMENT_OPTIONS: tuple[SharedOption, ...] = (
    SharedOption(
        "model",
        str,
        "llama-2-13b",
        MODEL.annotated(panel=PANEL),
    ),
    SharedOption("gpu", str | None, None, GPU.annotated(panel=PANEL)),
    SharedOption(
        "gpu_memory",
        str | None,
        None,
        typer.Option(
            "--gpu-memory",
            rich_help_panel=PANEL,
            help="Memory of one GPU, e.g. 141GiB: a GPU not listed, or what nvidia-smi shows for --gpu (the "
            "preset's bandwidth stays).",
        ),
    ),
    SharedOption(
        "utilization",
        float,
        0.9,
        GPU_MEMORY_UTILIZATION.annotated(panel=PANEL),
    ),
    SharedOption(
        "kv_cache_memory",
        str | None,
        None,
        KV_MEMORY.annotated(
            "KV cache per GPU set directly (vLLM's --kv-cache-memory-bytes, VLLM_CPU_KVCACHE_SPACE), e.g. 8GiB.", PANEL
        ),
    ),
    SharedOption(
        "dtype",
        str,
        "auto",
        DTYPE.annotated("The model's dtype (auto: the checkpoint's).", PANEL),
    ),
    SharedOption(
        "kv_cache_dtype",
        str,
        "auto",
        typer.Option(
            "--kv-cache-dtype",
            rich_help_panel=PANEL,
            help="The KV cache's dtype (auto: the model's).",
            **choice(KV_CACHE_DTYPES),
        ),
    ),
    SharedOption(
        "tensor_parallel",
        int,
        1,
        typer.Option(
            "--tensor-parallel-size",
            "-tp",
            min=1,
            rich_help_panel=PANEL,
            help="GPUs each layer is split across (the pool is one GPU's).",
        ),
    ),
    SharedOption(
        "pipeline_parallel",
        int,
        1,
        typer.Option(
            "--pipeline-parallel-size",
            "-pp",
            min=1,
            rich_help_panel=PANEL,
            help="Pipeline stages, runs of layers (the pool is the tightest stage's).",
        ),
    ),
)


def parse_deployment(values: dict[str, Any]) -> Deployment:
    """The options as typed and parsed (sizes in bytes; one-line errors naming the flag)."""
    sizes = {"gpu_memory": "--gpu-memory", "kv_cache_memory": "--kv-memory"}
    parsed = {
        name: parse_size(values[name], flag) if values[name] is not None else None for name, flag in sizes.items()
    }
    return Deployment(**{**values, **parsed, "dtype": values["dtype"].lower()})


DEPLOYMENT = OptionGroup(DEPLOYMENT_OPTIONS, "deployment", lambda values, _: parse_deployment(values))


def deployment_fields(deployment: Deployment, settings: type) -> dict[str, Any]:
    """The deployment's values that the study's ``settings`` dataclass has fields for."""
    names = {f.name for f in fields(settings)}
    return {k: v for k, v in asdict(deployment).items() if k in names}
