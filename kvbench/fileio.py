"""Atomic file writes: write to a temporary name in the same folder, then rename."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvbench.errors import KvbenchError


def write_atomic(path: str | os.PathLike, writer: Callable[[Path], None]) -> Path:
    """Call ``writer(tmp_path)`` then rename the temporary file onto ``path``."""
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as err:
        raise KvbenchError(f"cannot write {target}: {err.strerror or err}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer(tmp)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are meant to be shared
        try:
            os.replace(tmp, target)
        except OSError as err:  # e.g. the target is a directory
            raise KvbenchError(f"cannot write {target}: {err.strerror or err}") from None
    finally:
        if tmp.exists():
            tmp.unlink()
    return target


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_text_atomic(path: str | os.PathLike, text: str) -> Path:
    return write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def json_text(data: Any, indent: int | None = 2) -> str:
    """Strict JSON (what jq and JavaScript accept): NaN and infinities become null."""
    return json.dumps(_finite(data), indent=indent, default=_json_default, allow_nan=False)


def _finite(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(item) for item in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars
        return _finite(value.item())
    return value


def write_json_atomic(path: str | os.PathLike, data: Any) -> Path:
    return write_text_atomic(path, json_text(data) + "\n")


def append_jsonl(path: str | os.PathLike, record: Any) -> None:
    """Append one JSON line and fsync, so a crash keeps every finished line."""
    target = Path(path)
    line = json_text(record, indent=None) + "\n"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise KvbenchError(f"cannot write {target}: {err.strerror or err}") from None
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(line)
        handle.flush()
        os.fsync(handle.fileno())


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
