"""The run-directory lock: exclusive, never written through a planted link or into another user's file, and
gone once released (a finished run keeps no stale lock file); a write that fails says which file."""

from __future__ import annotations

import errno
import gc
import os
from pathlib import Path

import pytest

from kvbench.cli import main
from kvbench.errors import KvbenchError
from kvbench.fileio import DirectoryLock, write_atomic

LOCK = DirectoryLock.FILE


def test_a_released_lock_leaves_no_file_and_the_next_taker_gets_it(tmp_path):
    lock = DirectoryLock(tmp_path, "kvbench sweep")
    assert (tmp_path / LOCK).read_text() == f"pid {os.getpid()}"
    with pytest.raises(KvbenchError, match=rf"in use by another kvbench sweep \(pid {os.getpid()}\)"):
        DirectoryLock(tmp_path, "kvbench sweep")
    lock.release()
    lock.release()  # twice is harmless
    assert not (tmp_path / LOCK).exists()
    with DirectoryLock(tmp_path):
        assert (tmp_path / LOCK).exists()
    assert not (tmp_path / LOCK).exists()


def test_a_lock_never_released_is_removed_when_its_object_goes(tmp_path):
    lock = DirectoryLock(tmp_path)  # a command that failed between taking and releasing it
    del lock
    gc.collect()
    assert not (tmp_path / LOCK).exists()


def test_a_stale_lock_file_of_a_crashed_run_is_taken_over(tmp_path):
    (tmp_path / LOCK).write_text("pid 999999999")  # kill -9: the file stays, its lock went with the process
    with DirectoryLock(tmp_path):
        assert (tmp_path / LOCK).read_text() == f"pid {os.getpid()}"


def test_a_lock_file_released_between_open_and_lock_is_not_held_twice(tmp_path, monkeypatch):
    """B opens the lock file, A releases (removes) it, B locks the removed file: B must not think it holds the
    directory while C creates a new file at that name. B retries on the file the name now holds."""
    first = DirectoryLock(tmp_path)
    opened = DirectoryLock._open
    calls = {"n": 0}

    def open_then_release(self) -> int:
        fd = opened(self)
        calls["n"] += 1
        if calls["n"] == 1:
            first.release()
        return fd

    monkeypatch.setattr(DirectoryLock, "_open", open_then_release)
    second = DirectoryLock(tmp_path)
    assert calls["n"] == 2 and (tmp_path / LOCK).read_text() == f"pid {os.getpid()}"
    monkeypatch.setattr(DirectoryLock, "_open", opened)
    with pytest.raises(KvbenchError, match="in use"):
        DirectoryLock(tmp_path)
    second.release()


def _planted(tmp_path, kind: str):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "run" / LOCK
    target.parent.mkdir()
    if kind == "symlink":
        target.symlink_to(victim)
    elif kind == "dangling symlink":
        target.symlink_to(tmp_path / "nowhere")
    elif kind == "hard link":
        os.link(victim, target)
    elif kind == "directory":
        target.mkdir()
    elif kind == "fifo":
        os.mkfifo(target)
    return victim, target


@pytest.mark.parametrize(
    "kind, said",
    [
        ("symlink", "is a symbolic link: kvbench does not follow links for its lock file; remove it"),
        ("dangling symlink", "is a symbolic link"),
        ("hard link", "has other hard links: kvbench will not use it as its lock file; remove it"),
        ("directory", "is not a regular file"),
        ("fifo", "is not a regular file"),
    ],
)
def test_a_planted_lock_file_is_refused_and_nothing_is_written_through_it(kind, said, tmp_path):
    victim, target = _planted(tmp_path, kind)
    with pytest.raises(KvbenchError, match=said):
        DirectoryLock(target.parent)
    assert victim.read_text() == "precious"
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_lock_file_another_user_owns_is_refused(tmp_path):
    (tmp_path / LOCK).write_text("pid 1")
    os.chown(tmp_path / LOCK, 12345, 12345)
    with pytest.raises(KvbenchError, match="belongs to another user"):
        DirectoryLock(tmp_path)


def test_a_symlink_planted_in_out_is_refused_by_the_command(tmp_path, capfd):
    victim, target = _planted(tmp_path, "symlink")
    assert main(["sweep", "--simulate", "--scenario", "ci-smoke", "--out", str(target.parent)]) == 2
    captured = capfd.readouterr()
    assert (
        captured.out == ""
        and captured.err.strip()
        == f"error: {target} is a symbolic link: kvbench does not follow links for its lock file; remove it"
    )
    assert victim.read_text() == "precious"


@pytest.mark.parametrize(
    "args",
    [
        ["sweep", "--simulate", "--scenario", "ci-smoke"],
        ["fleet", "--simulate", "--instances", "2", "--rate", "5", "--requests", "20", "--policies", "round-robin"],
    ],
)
def test_a_finished_run_keeps_no_lock_file(args, tmp_path, capfd):
    out = tmp_path / "run"
    assert main([*args, "--out", str(out)]) == 0
    assert (out / "summary.json").exists() and not (out / LOCK).exists()


def test_a_full_disk_while_writing_names_the_file_and_keeps_what_was_there(tmp_path):
    target = tmp_path / "summary.json"
    target.write_text("the earlier run's summary")

    def full(tmp):
        tmp.write_bytes(b"half")
        raise OSError(errno.ENOSPC, "No space left on device")  # as write() raises it: no file name

    with pytest.raises(KvbenchError) as raised:
        write_atomic(target, full)
    assert str(raised.value) == f"cannot write {target}: No space left on device"
    assert target.read_text() == "the earlier run's summary"
    assert [p.name for p in tmp_path.iterdir()] == ["summary.json"]  # no temporary file left behind


def test_a_full_disk_during_a_run_is_one_line_with_the_path(tmp_path, monkeypatch, capsys):
    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.startswith(".summary.json."):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full)
    assert main(["waste", "--requests", "20", "--out", str(tmp_path / "r")]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"error: cannot write {tmp_path / 'r' / 'summary.json'}: No space left on device"]


def test_a_lock_that_cannot_be_written_on_a_full_disk_is_one_line_and_leaves_no_file(tmp_path, monkeypatch):
    def full(fd, length):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "ftruncate", full)
    with pytest.raises(KvbenchError) as raised:
        DirectoryLock(tmp_path)
    assert str(raised.value) == f"cannot write {tmp_path / LOCK}: No space left on device"
    assert not (tmp_path / LOCK).exists()
