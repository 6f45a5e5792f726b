"""A checkpoint's tokenizer (a Hugging Face directory's files, or the one a GGUF file carries) and its stop tokens.

Presets have random weights and no tokenizer: their runs count lengths, not text.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError
from kvbench.models.gguf_file import is_gguf
from kvbench.models.shapes import MODEL_PRESETS

_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")


def has_tokenizer(spec: str) -> bool:
    """Whether ``spec`` names a checkpoint that brings a tokenizer (a GGUF file, or a directory with its files)."""
    if spec in MODEL_PRESETS:
        return False
    path = Path(spec)
    if is_gguf(path):
        return True
    return path.is_dir() and any((path / name).is_file() for name in _TOKENIZER_FILES)


def load_tokenizer(spec: str) -> Any | None:
    """The tokenizer of a GGUF file or a checkpoint directory; None for presets and directories without one."""
    if not has_tokenizer(spec):
        return None
    from transformers import AutoTokenizer

    from kvbench.models.hf_model import first_line, quiet_transformers, require_gguf_support  # noqa: I001 (torch)

    path = Path(spec)
    gguf = is_gguf(path)
    if gguf:
        require_gguf_support("reading the tokenizer of a GGUF file")
    try:
        with quiet_transformers():
            if gguf:
                return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
            return AutoTokenizer.from_pretrained(path, local_files_only=True)
    except Exception as err:  # noqa: BLE001 - any loader failure becomes one line for the user
        raise KvbenchError(f"cannot load the tokenizer of {path}: {first_line(err)}") from None


def _ids(value: Any) -> list[int]:
    values = value if isinstance(value, (list, tuple)) else [value]
    return [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]


def stop_token_ids(model: Any, tokenizer: Any | None, extra: Iterable[int] = ()) -> tuple[int, ...]:
    """Every token that ends a request: the config's and generation config's EOS ids and the tokenizer's EOS."""
    found: list[int] = list(extra)
    config = getattr(model, "config", None)
    found += _ids(getattr(config, "eos_token_id", None))
    found += _ids(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    if tokenizer is not None:
        found += _ids(getattr(tokenizer, "eos_token_id", None))
    return tuple(dict.fromkeys(found))
