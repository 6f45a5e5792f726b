"""From what a user types after ``--model`` to a :class:`ModelShape`: a preset, a checkpoint directory or its
``config.json``, a GGUF file, or a Hugging Face Hub id.

This module sits above the readers (``hf_config``, ``gguf_file``, ``hub``), which build on ``shapes``; keeping
the dispatch out of ``shapes`` keeps ``kvbench.models`` free of import circles.
"""

from __future__ import annotations

from pathlib import Path

from kvbench.errors import KvbenchError
from kvbench.models.gguf_file import is_gguf, shape_from_gguf
from kvbench.models.hf_config import shape_from_config
from kvbench.models.hub import hub_config_path, looks_like_hub_id
from kvbench.models.shapes import MODEL_PRESETS, ModelShape


def resolve_model(spec: str, dtype: str | None = None) -> ModelShape:
    """A preset name, a path to a checkpoint directory, a ``config.json`` or a GGUF file, or a Hub id.

    ``dtype`` (fp32, fp16 or bf16) replaces the checkpoint's own; None or ``auto`` keeps it.
    """
    if spec in MODEL_PRESETS:
        shape = MODEL_PRESETS[spec]
    else:
        path = Path(spec).expanduser()
        if path.exists():
            shape = shape_from_gguf(path) if is_gguf(path) else shape_from_config(path)
        elif looks_like_hub_id(spec):
            shape = shape_from_config(hub_config_path(spec), name=spec)
        else:
            raise KvbenchError(
                f"unknown model {spec!r}: not a preset ({', '.join(MODEL_PRESETS)}), no such path, and not a "
                "Hugging Face model id (owner/name)"
            )
    return shape.with_dtype(dtype) if dtype and dtype != "auto" else shape


def is_hub_only(spec: str) -> bool:
    """A Hub id with no preset or local path of that name: it gives a shape, but no weights to run."""
    return spec not in MODEL_PRESETS and not Path(spec).expanduser().exists() and looks_like_hub_id(spec)
