"""Atomic file writes (write to a temporary name in the same folder, then rename), and the two rules on paths that
keep a command to what is its own: an output replaces only a regular file (never a device, a pipe, a link or a
folder), and a file named by a run directory's own files lies inside that directory."""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvbench import json_input
from kvbench.errors import KvbenchError


def replaceable(path: Path) -> str | None:
    """Why ``path`` may not be replaced by a written file (it exists and is not a regular file), or None."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as err:
        return f"cannot be checked ({err.strerror or err})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        return "is a symbolic link"
    if stat.S_ISDIR(mode):
        return "is a directory"
    return "is not a regular file (a device, a pipe or a socket)"


def write_atomic(path: str | os.PathLike, writer: Callable[[Path], object]) -> Path:
    """Call ``writer(tmp_path)`` then rename the temporary file onto ``path``, which must be a new name or a
    regular file."""
    target = Path(path)
    refused = replaceable(target)
    if refused is not None:
        raise KvbenchError(f"will not write {target}: it {refused}; give the path of a regular file")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as err:
        raise KvbenchError(f"cannot write {target}: {err.strerror or err}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        try:
            writer(tmp)
            os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are meant to be shared
            os.replace(tmp, target)
        except OSError as err:  # a full disk, a quota, the target turned into a directory: said with the path
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
    flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, flags, 0o644)  # a link is refused (ELOOP), a FIFO without a reader too (ENXIO)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise KvbenchError(f"will not append to {target}: it is not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "ab+") as handle:
            if handle.tell() > 0:
                handle.seek(-1, os.SEEK_END)
                if handle.read(1) != b"\n":
                    line = "\n" + line
            handle.write(line.encode("utf-8"))
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise KvbenchError(f"will not append to {target}: it is a symbolic link") from None
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

    The lock is held on ``<dir>/.kvbench.lock`` (which names the holder's pid) until ``release``, the end of
    the block, or the end of the process; a second taker gets a one-line error at once instead of waiting.
    Released, the file is removed (a finished run leaves none behind). The file is created exclusively and
    opened without following links: a symbolic link, a hard link, a file another user owns or anything but a
    regular file at that name is refused, so a planted link cannot make kvbench write through it.
    """

    FILE = ".kvbench.lock"
    _ATTEMPTS = 5  # a lock file removed by its releaser between our open and our lock: take the new one

    def __init__(self, directory: Path, what: str = "kvbench") -> None:
        import fcntl
        import weakref

        self.directory = Path(directory)
        self.path = self.directory / self.FILE
        for _ in range(self._ATTEMPTS):
            fd = self._open()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                holder = ascii(os.pread(fd, 80, 0).decode("utf-8", "replace").strip())[1:-1] or "another process"
                os.close(fd)
                raise KvbenchError(
                    f"{directory} is in use by another {what} ({holder}); wait for it "
                    "to finish or choose another run directory"
                ) from None
            if _same_file(fd, self.path):
                break
            os.close(fd)  # released (and removed) by its holder meanwhile: lock the file now at that name
        else:
            raise KvbenchError(f"cannot lock {directory}: its lock file keeps being replaced")
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"pid {os.getpid()}".encode())
        except OSError as err:  # a full disk: nothing of ours is left behind
            _unlock(fd, self.path, os.getpid())
            raise KvbenchError(f"cannot write {self.path}: {err.strerror or err}") from None
        self._fd: int | None = fd
        self._finalizer = weakref.finalize(self, _unlock, fd, self.path, os.getpid())  # also at exit, on errors

    def _open(self) -> int:
        flags = os.O_RDWR | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        try:
            try:
                fd = os.open(self.path, flags | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:  # left by a run that crashed, or held now: check it, then try its lock
                fd = os.open(self.path, flags)
        except OSError as err:
            if err.errno == errno.ELOOP:
                raise KvbenchError(
                    f"{self.path} is a symbolic link: kvbench does not follow links for its lock file; remove it"
                ) from None
            if err.errno == errno.EISDIR:
                raise KvbenchError(
                    f"{self.path} is not a regular file: kvbench will not use it as its lock file; remove it"
                ) from None
            raise KvbenchError(f"cannot lock {self.directory}: {err.strerror or err}") from None
        info = os.fstat(fd)
        problem = (
            "is not a regular file"
            if not stat.S_ISREG(info.st_mode)
            else "belongs to another user"
            if info.st_uid != os.geteuid()
            else "has other hard links"
            if info.st_nlink != 1
            else None
        )
        if problem:
            os.close(fd)
            raise KvbenchError(f"{self.path} {problem}: kvbench will not use it as its lock file; remove it")
        return fd

    def release(self) -> None:
        """Remove the lock file and let the lock go (safe to call twice)."""
        self._finalizer()

    def __enter__(self) -> DirectoryLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _same_file(fd: int, path: Path) -> bool:
    """Whether ``path`` still names the file open at ``fd``."""
    try:
        on_disk = os.stat(path, follow_symlinks=False)
    except OSError:
        return False
    held = os.fstat(fd)
    return (held.st_dev, held.st_ino) == (on_disk.st_dev, on_disk.st_ino)


def _unlock(fd: int, path: Path, owner_pid: int) -> None:
    """Remove the lock file while still holding its lock (a waiter that opened it then finds it gone and
    takes the new one), then close it. Only in the process that took it (a forked child inherits the
    finalizer, not the lock's ownership)."""
    if os.getpid() != owner_pid:
        return
    try:
        if _same_file(fd, path):
            path.unlink()
    except OSError:
        pass  # a read-only folder: the file stays, unlocked, and the next taker reuses it
    finally:
        os.close(fd)


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def run_file(directory: Path, name: object) -> Path:
    """``directory / name`` for a ``name`` found in a run's own files: a plain file name (no folder part), and the
    path, links followed, inside ``directory``. Run directories come from others (CI artifacts): nothing they
    say may make kvbench read elsewhere."""
    if (
        not isinstance(name, str)
        or name in ("", ".", "..")
        or any(c in name for c in "/\\\0")
        or Path(name).name != name
    ):
        raise KvbenchError(f"{directory}: {name!r} is not the name of a file in the run directory")
    return inside(directory, directory / name)


def inside(directory: Path, path: Path) -> Path:
    """``path`` when it resolves (links followed) inside ``directory``; one line refusing it otherwise."""
    try:
        root, resolved = directory.resolve(), path.resolve()
    except (OSError, RuntimeError) as err:
        raise KvbenchError(f"cannot resolve {path}: {err}") from None
    if resolved != root and root not in resolved.parents:
        raise KvbenchError(f"{path} leads outside the run directory {directory} (a link?); refused")
    return path
