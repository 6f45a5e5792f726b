"""Atomic file writes: write to a temporary name in the same folder, then rename."""

from __future__ import annotations

import json
import math
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvbench import json_input
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


def content_sha256(path: str | os.PathLike) -> str:
    """The SHA-256 of a file's bytes: pins what a run was made from, whatever the file is called."""
    import hashlib

    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except OSError as err:
        raise KvbenchError(f"cannot read {path}: {err.strerror or err}") from None


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
    """Append one JSON line and fsync, so a crash keeps every finished line.

    A file whose last line lacks its newline (a crash between the write and the newline) gets one first,
    so the new record never glues onto it.
    """
    target = Path(path)
    line = json_text(record, indent=None) + "\n"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "ab+") as handle:
            if handle.tell() > 0:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":
                    line = "\n" + line
            handle.write(line.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        raise KvbenchError(f"cannot write {target}: {err.strerror or err}") from None


def set_aside_torn_tail(path: Path) -> str | None:
    """Move a torn last line (not valid JSON: a write cut short) out of a JSON-lines file.

    The line is appended to ``<name>.torn`` and the file is cut back to its last complete line. Returns
    the torn text, or None when the last line is whole. Lines before the last are never touched.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as err:
        raise KvbenchError(f"cannot read {path}: {err.strerror or err}") from None
    body = data.rstrip(b"\n")
    if not body:
        return None
    start = body.rfind(b"\n") + 1
    tail = body[start:]
    try:
        json_input.loads(tail.decode("utf-8"))
        return None
    except (UnicodeDecodeError, json.JSONDecodeError):
        pass
    torn = tail.decode("utf-8", errors="replace")
    try:
        with open(path.with_name(path.name + ".torn"), "a", encoding="utf-8") as aside:
            aside.write(torn + "\n")
        write_atomic(path, lambda tmp: tmp.write_bytes(data[:start]))
    except OSError as err:
        raise KvbenchError(f"cannot set aside the torn last line of {path}: {err.strerror or err}") from None
    return torn


class DirectoryLock:
    """An exclusive advisory lock on a run directory, so two commands never write into it at once.

    The lock is held on ``<dir>/.kvbench.lock`` (which names the holder's pid) until ``release`` or the
    end of the process; a second taker gets a one-line error at once instead of waiting.
    """

    FILE = ".kvbench.lock"

    def __init__(self, directory: Path, what: str = "kvbench") -> None:
        import fcntl

        self.path = directory / self.FILE
        try:
            self._handle = open(self.path, "a+", encoding="utf-8")  # noqa: SIM115 - held until release()
        except OSError as err:
            raise KvbenchError(f"cannot lock {directory}: {err.strerror or err}") from None
        try:
            fcntl.flock(self._handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            self._handle.seek(0)
            holder = self._handle.read().strip() or "another process"
            self._handle.close()
            raise KvbenchError(f"{directory} is in use by another {what} ({holder}); wait for it to finish or "
                               "choose another run directory") from None
        self._handle.seek(0)
        self._handle.truncate()
        self._handle.write(f"pid {os.getpid()}")
        self._handle.flush()

    def release(self) -> None:
        if not self._handle.closed:
            self._handle.close()

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
