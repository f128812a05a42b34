"""Tests for orchestrator.vfs._fileio: branch paths, modes, cheap copies, atomic writes."""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import os
import stat
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import bind_mount

from orchestrator.vfs import _fileio, _mounts
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


def test_modes_drop_setuid_setgid_and_sticky() -> None:
    """The special bits never make it into a normalized mode, of a file or a bare one."""
    assert _fileio.normalize_mode(stat.S_IFREG | 0o6755) == stat.S_IFREG | 0o755
    assert _fileio.normalize_mode(0o1777) == stat.S_IFREG | 0o777


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


LONG_NAMES = [
    pytest.param("a" * 232, id="232-bytes"),
    pytest.param("a" * 233, id="233-bytes"),
    pytest.param("b" * 255, id="255-bytes"),
    pytest.param("\u00e9" * 127 + "c", id="255-bytes-cut-inside-a-character"),
    pytest.param(os.fsdecode(b"\xff" * 255), id="255-bytes-not-utf8"),
]


@pytest.mark.parametrize("name", LONG_NAMES)
def test_write_entry_atomic_writes_a_name_of_any_legal_length(tmp_path: Path, name: str) -> None:
    """Files and symlinks of names up to NAME_MAX bytes are written (at a path and through a
    directory fd), their temporary names fit and are recognised as theirs only."""
    _fileio.write_entry_atomic(str(tmp_path / name), b"one", _fileio.DEFAULT_MODE)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        _fileio.write_entry_atomic(name, b"two", _fileio.DEFAULT_MODE, dir_fd=fd, fsync=True)
    finally:
        os.close(fd)
    assert (tmp_path / name).read_bytes() == b"two"
    (tmp_path / "links").mkdir()
    _fileio.write_entry_atomic(str(tmp_path / "links" / name), b"target", _fileio.SYMLINK_MODE)
    assert os.readlink(tmp_path / "links" / name) == "target"
    assert sorted(os.listdir(tmp_path)) == sorted([name, "links"])
    temp = _fileio.temp_name(name)
    assert len(os.fsencode(temp)) <= _fileio.NAME_MAX
    assert _fileio.is_temp_name(temp, name)
    assert not _fileio.is_temp_name(temp, name[:-1] + "z")
    assert not _fileio.is_temp_name(_fileio.temp_name(name[:-1] + "z"), name)


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


@pytest.mark.parametrize(
    "bad",
    ["x" * 256, "d/" + "é" * 128, "/".join(["p" * 200] * 21), "a/\ud800"],
    ids=["name-over-NAME_MAX", "name-over-NAME_MAX-in-bytes", "path-over-PATH_MAX", "surrogate"],
)
def test_paths_that_can_name_no_file_are_refused(bad: str) -> None:
    """A name over 255 bytes, 4,096 bytes in all, a character no file name can hold: refused."""
    with pytest.raises(PathRefused):
        _fileio.check_path_limits(bad)
    with pytest.raises(PathRefused):
        _fileio.normalize_path(bad)


def test_paths_up_to_the_limits_are_fine() -> None:
    """255-byte names and 4,095-byte paths, nested as deep as that allows, are branch paths."""
    longest = "/".join(["n" * 255] * 15) + "/" + "x" * 255  # 4,095 bytes
    deepest = "/".join(["d"] * 2047) + "x"  # 4,095 bytes too
    for path in ("é" * 127, longest, deepest):
        assert _fileio.normalize_path(path) == path


def chain(root: Path, depth: int, name: str = "d") -> None:
    """``depth`` directories one in another under ``root``, a file at the bottom (made through
    directory fds: the whole path may be too long to name at once)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            deeper = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = deeper
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd))
    finally:
        os.close(fd)


@pytest.fixture
def deep_tmp(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, removed after the test: pytest's own clean-up recurses once per level."""
    yield tmp_path
    _fileio.remove_tree(str(tmp_path))


@pytest.mark.parametrize(("depth", "name"), [(1500, "d"), (25, "p" * 200)], ids=["deep", "long"])
def test_remove_tree_removes_any_depth(deep_tmp: Path, depth: int, name: str) -> None:
    """A chain of 1,500 directories, or one longer than PATH_MAX, is removed whole."""
    top = deep_tmp / "top"
    top.mkdir()
    chain(top, depth, name)
    (top / "wide").mkdir()
    for i in range(50):
        (top / "wide" / str(i)).mkdir()
        (top / "wide" / str(i) / "f").write_text("x")
    _fileio.remove_tree(str(top))
    assert not top.exists()


def test_remove_tree_never_follows_a_symlink(tmp_path: Path) -> None:
    """A link to a directory elsewhere is removed as a link; what it leads to stays."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep").write_text("keep\n")
    top = tmp_path / "top"
    (top / "a").mkdir(parents=True)
    (top / "a" / "link").symlink_to(outside)
    _fileio.remove_tree(str(top))
    _fileio.remove_tree(str(tmp_path / "missing"))  # nothing there: nothing done
    assert not top.exists()
    assert (outside / "keep").read_text() == "keep\n"


TABLE = b"".join(
    line + b"\n"
    for line in [
        rb"22 1 254:0 / / rw,relatime shared:1 - ext4 /dev/vda rw",
        rb"42 22 254:0 /tmp/p /w/b/src/d3 rw,relatime - ext4 /dev/vda rw",
        rb"43 22 0:50 / /w/b/sp\040ace\012nl\134bs rw - tmpfs tmpfs rw",
        rb"44 22 254:0 /tmp/p /w/bc rw - ext4 /dev/vda rw",
        rb"45 22 254:0 /tmp/p /w/b rw - ext4 /dev/vda rw",
        rb"46 22 254:0 /tmp/p /w/a rw - ext4 /dev/vda rw",
    ]
)


def test_mount_points_are_read_with_their_escapes_decoded() -> None:
    """Field 5 of each mountinfo line is the mount point; a space, newline, backslash in it are
    octal escapes."""
    assert _mounts.mount_points(TABLE) == [
        "/",
        "/w/b/src/d3",
        "/w/b/sp ace\nnl\\bs",
        "/w/bc",
        "/w/b",
        "/w/a",
    ]


def test_points_under_a_directory_are_it_and_those_below_it() -> None:
    """A mount point equal to the directory or below it counts; one beside it, a parent, or one
    extending its last name (``/w/bc`` for ``/w/b``) does not."""
    points = _mounts.mount_points(TABLE)
    assert _mounts.points_under(points, "/w/b") == ["/w/b/src/d3", "/w/b/sp ace\nnl\\bs", "/w/b"]
    assert _mounts.points_under(points, "/w/b/src") == ["/w/b/src/d3"]
    assert _mounts.points_under(points, "/w/b/src/d") == []
    assert _mounts.points_under(points, "/w/c") == []
    assert _mounts.points_under(points, "/") == points


def test_mounts_under_finds_the_root_mount_and_none_below_a_fresh_directory(
    tmp_path: Path,
) -> None:
    """Read from /proc/self/mountinfo: / is a mount point, a fresh directory holds none."""
    if not os.path.exists(_mounts.MOUNTINFO):
        pytest.skip("no /proc/self/mountinfo (not Linux)")
    (tmp_path / "d").mkdir()
    assert _mounts.mounts_under(str(tmp_path / "d")) == []
    assert "/" in (_mounts.mounts_under("/") or [])
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        assert isinstance(_mounts.mount_id(fd), int)
    finally:
        os.close(fd)


def _outside(tmp_path: Path) -> Path:
    """A directory outside the tree, with files and a subdirectory, to bind-mount into it."""
    outside = tmp_path / "precious"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep.txt").write_text("keep\n")
    (outside / "sub" / "deep.txt").write_text("deep\n")
    return outside


def _listing(top: Path) -> dict[str, bytes]:
    """The files below ``top`` and their content."""
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


def test_remove_tree_never_enters_a_bind_mount(tmp_path: Path) -> None:
    """A directory elsewhere bind-mounted in the tree (same device) keeps its files; the rest
    of the tree goes, the mount point and the directories holding it excepted."""
    outside = _outside(tmp_path)
    before = _listing(outside)
    top = tmp_path / "top"
    (top / "src" / "d3").mkdir(parents=True)
    (top / "src" / "a.txt").write_text("a\n")
    (top / "other").mkdir()
    (top / "other" / "b.txt").write_text("b\n")
    with bind_mount(outside, top / "src" / "d3"):
        left = _fileio.remove_tree(str(top))
        assert _listing(outside) == before
        assert left == [str(top / "src" / "d3")]
        assert sorted(os.listdir(top)) == ["src"] and os.listdir(top / "src") == ["d3"]
    assert _fileio.remove_tree(str(top)) == []  # unmounted: all of it goes
    assert not top.exists()
    assert _listing(outside) == before


def test_remove_tree_leaves_a_directory_that_is_a_mount_point(tmp_path: Path) -> None:
    """A directory bind-mounted over itself is not entered at all."""
    outside = _outside(tmp_path)
    before = _listing(outside)
    top = tmp_path / "top"
    top.mkdir()
    with bind_mount(outside, top):
        left = _fileio.remove_tree(str(top))
        assert _listing(outside) == before
        assert left == [str(top)]


def test_remove_tree_finds_a_mount_made_while_it_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A bind mount made in the tree after the removal started (by a process still running
    there) is not entered either: each directory's mount is told once it is open."""
    outside = _outside(tmp_path)
    before = _listing(outside)
    top = tmp_path / "top"
    (top / "src" / "d3").mkdir(parents=True)
    (top / "a.txt").write_text("a\n")
    empty_files = _fileio._empty_files
    mounted = contextlib.ExitStack()

    def then_mount(fd: int, name: str) -> tuple[tuple[int, int], str, list[str]]:
        if not name:  # the top directory is open: its subdirectories not entered yet
            mounted.enter_context(bind_mount(outside, top / "src" / "d3"))
        return empty_files(fd, name)

    monkeypatch.setattr(_fileio, "_empty_files", then_mount)
    with mounted:
        left = _fileio.remove_tree(str(top))
        assert _listing(outside) == before
        assert left == [str(top / "src" / "d3")]
    assert _listing(outside) == before


def test_remove_tree_of_a_symlink_removes_the_link_only(tmp_path: Path) -> None:
    """A symlink put in the place of the directory (by the agent working in it) is removed;
    the directory it leads to keeps every file."""
    outside = _outside(tmp_path)
    before = _listing(outside)
    link = tmp_path / "branch"
    link.symlink_to(outside)
    assert _fileio.remove_tree(str(link)) == []
    assert not os.path.lexists(link)
    assert _listing(outside) == before


def test_make_dirs_and_walk_files_at_any_depth(deep_tmp: Path) -> None:
    """make_dirs makes a chain of 1,500 directories (or finds it made); walk_files lists what
    the tree holds, the links among it not followed."""
    tmp_path = deep_tmp
    bottom = os.path.join(tmp_path, *["d"] * 1500)
    _fileio.make_dirs(bottom)
    _fileio.make_dirs(bottom)
    Path(bottom, "f").write_text("x")
    os.symlink(tmp_path, tmp_path / "d" / "loop")
    assert sorted(_fileio.walk_files(str(tmp_path))) == sorted(
        [os.path.join(bottom, "f"), str(tmp_path / "d" / "loop")]
    )
    (tmp_path / "file").write_text("")
    with pytest.raises(FileExistsError):
        _fileio.make_dirs(str(tmp_path / "file" / "sub"))


def test_copy_fd_says_whether_it_reflinked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """copy_fd and copy_fd_digest return True for a reflink, False for copied bytes."""
    src, data = tmp_path / "src", os.urandom(5000)
    src.write_bytes(data)
    with open(src, "rb") as s, open(tmp_path / "a", "xb") as d:
        assert not _fileio.copy_fd(s.fileno(), d.fileno(), len(data), (90, 91))
    with open(src, "rb") as s, open(tmp_path / "b", "xb") as d:
        assert _fileio.copy_fd_digest(s.fileno(), d.fileno(), len(data), (90, 91)) == (
            hashlib.sha256(data).hexdigest(),
            False,
        )

    def clone(dst: int, request: int, src: int) -> int:
        os.pwrite(dst, os.pread(src, 1 << 20, 0), 0)
        return 0

    monkeypatch.setattr(fcntl, "ioctl", clone)
    with open(src, "rb") as s, open(tmp_path / "c", "xb") as d:
        assert _fileio.copy_fd(s.fileno(), d.fileno(), len(data), (92, 93))
    with open(src, "rb") as s, open(tmp_path / "d", "xb") as d:
        assert _fileio.copy_fd_digest(s.fileno(), d.fileno(), len(data), (92, 93))[1]


@pytest.mark.parametrize("code", [errno.EINVAL, errno.EPERM, errno.ETXTBSY])
def test_a_reflink_refused_for_one_file_is_still_tried_for_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    """A clone refused for one file (btrfs: a no-copy-on-write file; an immutable file) copies
    that file and leaves reflinks on for the next ones of the same pair of filesystems."""
    calls: list[int] = []

    def clone(dst: int, request: int, src: int) -> int:
        calls.append(dst)
        if len(calls) == 1:
            raise OSError(code, os.strerror(code))
        os.pwrite(dst, os.pread(src, 1 << 20, 0), 0)
        return 0

    monkeypatch.setattr(fcntl, "ioctl", clone)
    src = tmp_path / "src"
    src.write_bytes(b"y" * 9000)
    with open(src, "rb") as s, open(tmp_path / "a", "xb") as d:
        assert not _fileio.copy_fd(s.fileno(), d.fileno(), 9000, (94, 95))
    assert (94, 95) not in _fileio._no_reflink
    with open(src, "rb") as s, open(tmp_path / "b", "xb") as d:
        assert _fileio.copy_fd(s.fileno(), d.fileno(), 9000, (94, 95))
    assert len(calls) == 2
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes() == b"y" * 9000


def test_copy_tally_sums_what_threads_count() -> None:
    """CopyTally counts files and bytes from many threads at once; CopyStats add up."""
    tally = _fileio.CopyTally()

    def count(reflinked: bool) -> None:
        for _ in range(1000):
            tally.add(3, reflinked=reflinked)

    threads = [threading.Thread(target=count, args=(i % 2 == 0,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stats = tally.stats()
    assert stats == _fileio.CopyStats(2000, 6000, 2000, 6000)
    assert stats + stats == _fileio.CopyStats(4000, 12000, 4000, 12000)
