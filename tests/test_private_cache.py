"""kvbench's private cache folder: created 0700; a folder or file another user owns or may write is refused."""

from __future__ import annotations

import stat

import pytest

from kvbench import private_cache
from kvbench.private_cache import UnsafeCache


def test_the_folder_is_created_private_and_found_from_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(private_cache.ENV, str(tmp_path / "deep" / "cache"))
    assert private_cache.cache_dir() == tmp_path / "deep" / "cache"
    folder = private_cache.private_dir()
    assert folder.is_dir() and stat.S_IMODE(folder.stat().st_mode) == 0o700
    monkeypatch.delenv(private_cache.ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert private_cache.cache_dir() == tmp_path / "xdg" / "kvbench"


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777])
def test_a_folder_others_may_write_is_refused(tmp_path, mode: int) -> None:
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(mode)
    with pytest.raises(UnsafeCache, match="may be written by other users"):
        private_cache.private_dir(folder)
    folder.chmod(0o755)  # readable by others is not a risk: nothing in it can be changed by them
    assert private_cache.private_dir(folder) == folder


def test_a_folder_or_file_another_user_owns_is_refused(tmp_path, monkeypatch) -> None:
    folder = private_cache.private_dir(tmp_path / "cache")
    (folder / "f").write_bytes(b"x")
    monkeypatch.setattr(private_cache, "current_owner", lambda: 4242)
    with pytest.raises(UnsafeCache, match=r"belongs to user id \d+, not to this user \(4242\)"):
        private_cache.private_dir(folder)
    with pytest.raises(UnsafeCache, match="not to this user"):
        private_cache.read_bytes(folder / "f")


def test_a_folder_that_is_a_file_is_refused(tmp_path) -> None:
    (tmp_path / "cache").write_text("not a folder")
    with pytest.raises(UnsafeCache, match="not a folder"):
        private_cache.private_dir(tmp_path / "cache")


def test_files_are_written_atomically_privately_and_read_back_only_when_safe(tmp_path) -> None:
    folder = private_cache.private_dir(tmp_path / "cache")
    path = folder / "entry.json"
    assert private_cache.read_bytes(path) is None and not private_cache.check_file(path)
    private_cache.write_bytes(path, b"one")
    private_cache.write_bytes(path, b"two")
    assert private_cache.read_bytes(path) == b"two" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in folder.iterdir()] == ["entry.json"]  # no temporary left behind
    path.chmod(0o620)
    with pytest.raises(UnsafeCache, match="may be written by other users"):
        private_cache.read_bytes(path)
    path.chmod(0o600)
    link = folder / "link.json"
    link.symlink_to(path)
    with pytest.raises(UnsafeCache, match="not a regular file"):
        private_cache.read_bytes(link)
    (folder / "sub").mkdir()
    with pytest.raises(UnsafeCache, match="not a regular file"):
        private_cache.check_file(folder / "sub")
    assert private_cache.sha256_hex(b"two") == __import__("hashlib").sha256(b"two").hexdigest()


def test_a_note_about_the_cache_is_said_once_per_process(capsys):
    from kvbench import private_cache

    private_cache.note("measuring without caching: a test note")
    private_cache.note("measuring without caching: a test note")
    assert capsys.readouterr().err.count("a test note") == 1
