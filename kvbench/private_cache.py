"""kvbench's per-user cache folder, refusing anything another user could have planted there.

What the cache holds is trusted as kvbench's own: the C kernels' shared library, loaded into the process, and
the CPU choices measured on this machine. So the folder is created ``0700``; a folder or file that another user
owns, or that the group or others may write, is refused (:class:`UnsafeCache`); a file is replaced only by an
atomic rename inside the folder; and :func:`sha256_hex` lets a loader check a file's bytes against the digest its
writer recorded beside it.

The folder is ``$KVBENCH_CACHE_DIR``, else ``$XDG_CACHE_HOME/kvbench``, else ``~/.cache/kvbench``.
"""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

from kvbench import env_settings
from kvbench.errors import KvbenchError

ENV = "KVBENCH_CACHE_DIR"
WRITABLE_BY_OTHERS = stat.S_IWGRP | stat.S_IWOTH


class UnsafeCache(KvbenchError):
    """A cache folder or file that someone other than this user owns or may write."""


def cache_dir() -> Path:
    """Where kvbench keeps its cache (not created here: see :func:`private_dir`)."""
    base = env_settings.read(ENV) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "kvbench"
    )
    return Path(base)


def current_owner() -> int:
    """The user id files in the cache must belong to (a seam: the tests pretend to be someone else)."""
    return os.geteuid()


def _check(path: Path, info: os.stat_result, what: str) -> None:
    if info.st_uid != current_owner():
        raise UnsafeCache(
            f"{what} {path} belongs to user id {info.st_uid}, not to this user ({current_owner()}); "
            "kvbench will not trust it"
        )
    if info.st_mode & WRITABLE_BY_OTHERS:
        raise UnsafeCache(
            f"{what} {path} may be written by other users (mode {stat.filemode(info.st_mode)}); "
            f"kvbench will not trust it (chmod go-w {path}, or remove it)"
        )


def private_dir(path: Path | None = None) -> Path:
    """The cache folder, created ``0700`` if missing; :class:`UnsafeCache` if it is not this user's alone."""
    folder = path or cache_dir()
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass
        info = folder.stat()  # a symlinked cache folder is judged by what it points to
    except OSError as err:
        raise UnsafeCache(f"cannot use the cache folder {folder}: {err.strerror or err}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafeCache(f"the cache folder {folder} is not a folder")
    _check(folder, info, "the cache folder")
    return folder


def check_file(path: Path) -> bool:
    """Whether ``path`` exists (False if not); :class:`UnsafeCache` if it is not a regular file of this user's
    that only this user may write (a symlink counts as planted)."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        return False
    except OSError as err:
        raise UnsafeCache(f"cannot read {path}: {err.strerror or err}") from None
    if not stat.S_ISREG(info.st_mode):
        raise UnsafeCache(f"{path} is not a regular file (a link or something else); kvbench will not trust it")
    _check(path, info, "the cache file")
    return True


def read_bytes(path: Path) -> bytes | None:
    """The bytes of a cache file, or None when there is none; :class:`UnsafeCache` when it is not safe."""
    if not check_file(path):
        return None
    try:
        return path.read_bytes()
    except OSError as err:
        raise UnsafeCache(f"cannot read {path}: {err.strerror or err}") from None


def write_bytes(path: Path, data: bytes) -> None:
    """``data`` into ``path`` (``0600``) by an atomic rename inside the folder: a reader sees the old file or the
    new one, never part of one."""
    fd, partial = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.unlink(partial)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_NOTED: set[str] = set()


def note(text: str) -> None:
    """One line on stderr for something the user should know about the cache that stops nothing (once per
    process: each measurement that cannot be cached would say the same)."""
    import sys

    if text in _NOTED:
        return
    _NOTED.add(text)
    print(f"kvbench: note: {text}", file=sys.stderr, flush=True)
