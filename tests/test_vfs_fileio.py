"""Tests for orchestrator.vfs._fileio: branch paths, modes, cheap copies, atomic writes."""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
from pathlib import Path

import pytest

from orchestrator.vfs import _fileio
from orchestrator.vfs.errors import PathRefused


@pytest.mark.parametrize(
    ("raw", "normal"), [("a/b", "a/b"), ("./a//b/", "a/b"), ("a/./b", "a/b"), ("x", "x")]
)
def test_normalize_path(raw: str, normal: str) -> None:
    """Branch paths are canonicalized to relative, slash-separated form."""
    assert _fileio.normalize_path(raw) == normal


@pytest.mark.parametrize("bad", ["/etc/passwd", "../x", "a/../../b", "", ".", "a\0b"])
def test_normalize_path_refuses(bad: str) -> None:
    """Absolute paths, '..', NUL and empty paths are refused."""
    with pytest.raises(PathRefused):
        _fileio.normalize_path(bad)


def test_modes() -> None:
    """Bare permissions mean regular files; git modes follow the executable bit."""
    assert _fileio.normalize_mode(0o755) == stat.S_IFREG | 0o755
    assert _fileio.git_mode(stat.S_IFREG | 0o750) == "100755"
    assert _fileio.git_mode(_fileio.DEFAULT_MODE) == "100644"
    assert _fileio.git_mode(_fileio.SYMLINK_MODE) == "120000"
    assert _fileio.is_binary(b"a\0b") and not _fileio.is_binary(b"text")


def test_copy_fd_copies_and_is_no_hard_link(tmp_path: Path) -> None:
    """copy_fd produces an independent file with the same bytes."""
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(os.urandom(300_000))
    with open(src, "rb") as s, open(dst, "xb") as d:
        _fileio.copy_fd(s.fileno(), d.fileno(), src.stat().st_size, (1, 2))
    assert dst.read_bytes() == src.read_bytes()
    assert dst.stat().st_ino != src.stat().st_ino
    assert src.stat().st_nlink == 1


def test_copy_fd_falls_back_when_methods_are_unsupported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without reflink and copy_file_range, the plain copy still produces the bytes."""

    def unsupported(*args: object) -> int:
        raise OSError(errno.EXDEV, "cross-device")

    monkeypatch.setattr(fcntl, "ioctl", unsupported)
    monkeypatch.setattr(os, "copy_file_range", unsupported)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(b"x" * 70_000)
    with open(src, "rb") as s, open(dst, "xb") as d:
        _fileio.copy_fd(s.fileno(), d.fileno(), 70_000, (98, 99))
    assert dst.read_bytes() == b"x" * 70_000
    assert (98, 99) in _fileio._no_reflink and (98, 99) in _fileio._no_copy_range


@pytest.mark.parametrize("size", [0, 9, 3 << 20])
def test_copy_fd_hashed_copies_and_hashes_the_bytes(tmp_path: Path, size: int) -> None:
    """copy_fd_hashed gives the same bytes and their SHA-256, for empty, small and large files."""
    data = os.urandom(size)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(data)
    with open(src, "rb") as s, open(dst, "xb") as d:
        got = _fileio.copy_fd_hashed(s.fileno(), d.fileno(), size, (1, 2))
    assert got == hashlib.sha256(data).hexdigest()
    assert dst.read_bytes() == data


def test_copy_fd_hashed_reads_a_reflinked_file_back_to_hash_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A reflink shares the bytes without reading them: they are read back for the hash."""

    def clone(dst: int, request: int, src: int) -> int:
        assert request == _fileio._FICLONE
        os.pwrite(dst, os.pread(src, 1 << 22, 0), 0)
        return 0

    monkeypatch.setattr(fcntl, "ioctl", clone)
    data = os.urandom(1_500_000)
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.write_bytes(data)
    with open(src, "rb") as s, open(dst, "xb") as d:
        got = _fileio.copy_fd_hashed(s.fileno(), d.fileno(), len(data), (96, 97))
    assert got == hashlib.sha256(data).hexdigest()
    assert dst.read_bytes() == data


def test_write_entry_atomic_file_and_symlink(tmp_path: Path) -> None:
    """Atomic writes set the mode, replace the old file, leave no temp file, and do symlinks."""
    target = tmp_path / "f"
    target.write_text("old")
    _fileio.write_entry_atomic(str(target), b"new", stat.S_IFREG | 0o751, fsync=True)
    assert target.read_bytes() == b"new"
    assert stat.S_IMODE(target.stat().st_mode) == 0o751
    _fileio.write_entry_atomic(str(tmp_path / "l"), b"f", _fileio.SYMLINK_MODE)
    assert os.readlink(tmp_path / "l") == "f"
    assert sorted(os.listdir(tmp_path)) == ["f", "l"]


def test_write_entry_atomic_cleans_up_on_failure(tmp_path: Path) -> None:
    """A failed replace (onto a directory) removes the temporary file."""
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x").write_text("keep")
    with pytest.raises(IsADirectoryError):
        _fileio.write_entry_atomic(str(tmp_path / "d"), b"data", _fileio.DEFAULT_MODE)
    assert sorted(os.listdir(tmp_path)) == ["d"]


def test_read_entry(tmp_path: Path) -> None:
    """read_entry gives content and mode of files and symlinks."""
    (tmp_path / "f").write_bytes(b"abc")
    os.symlink("f", tmp_path / "l")
    assert _fileio.read_entry(str(tmp_path / "f"))[:2] == (b"abc", _fileio.DEFAULT_MODE)
    assert _fileio.read_entry(str(tmp_path / "l"))[:2] == (b"f", _fileio.SYMLINK_MODE)
