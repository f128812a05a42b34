"""Branch directories share blocks where the filesystem can: checkouts on loop-mounted images.

Each filesystem is a sparse image in a temporary directory, made with its ``mkfs`` and
loop-mounted for the tests of this module; it is unmounted and its loop device detached
whatever happens (a failure, Ctrl-C). XFS and btrfs reflink (``FICLONE``): a branch copy's
extents are the workspace file's (FIEMAP's shared flag) and the filesystem's used space hardly
grows. ext4 does not: every file is copied, and counted so. Where a piece is missing (the mkfs
tool, root, a free loop device, a mount the kernel accepts) the tests are skipped saying which.
"""

from __future__ import annotations

import array
import ctypes
import fcntl
import os
import shutil
import struct
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator.vfs import Branch, CopyStats, Workdir, Workspace, materialize

# FS_IOC_FIEMAP = _IOWR('f', 11, struct fiemap): the extents of a file
_FIEMAP = 0xC020660B
_FIEMAP_FLAG_SYNC = 0x1
_EXTENT_LAST = 0x1
_EXTENT_SHARED = 0x2000
_FIEMAP_HEAD = struct.Struct("=QQIIII")  # start, length, flags, mapped, count, reserved
_FIEMAP_EXTENT = struct.Struct("=QQQQQIIII")  # logical, physical, length, 2 reserved, flags, 3
# FS_IOC_GETFLAGS / FS_IOC_SETFLAGS and btrfs's "no copy-on-write" flag (``chattr +C``)
_GETFLAGS, _SETFLAGS, _NOCOW = 0x80086601, 0x40086602, 0x00800000

# XFS refuses filesystems under 300 MB; the image is sparse, only what is written takes space
_IMAGE_SIZE = 320 << 20
_MKFS = {
    "xfs": ["mkfs.xfs", "-q", "-m", "reflink=1"],
    "btrfs": ["mkfs.btrfs", "-q"],
    "ext4": ["mkfs.ext4", "-q", "-F"],
}
_PACKAGE = {"xfs": "xfsprogs", "btrfs": "btrfs-progs", "ext4": "e2fsprogs"}

#: the workspace's files: 16 of 512 KiB (8 MiB) and a few small ones
_BIG = {f"data/blob{i:02}.bin": 512 << 10 for i in range(16)}
_SMALL = {"README.md": 120, "src/main.py": 2_000, "src/util.py": 9_000}
_FILES = {**_BIG, **_SMALL}
_DATA_BYTES = sum(_FILES.values())


# mkfs, losetup and mount live in sbin, which a PATH may leave out
_SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"])


def _run(tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [shutil.which(tool, path=_SEARCH) or tool, *args],
        capture_output=True,
        text=True,
        check=False,
    )


def _detail(done: subprocess.CompletedProcess[str]) -> str:
    """The first line a failed command printed, or its exit status."""
    lines = (done.stderr or done.stdout).strip().splitlines()
    return lines[0] if lines else f"exit status {done.returncode}"


def _mounted(point: Path) -> bool:
    with open("/proc/self/mounts", encoding="utf-8") as f:
        return any(line.split()[1] == str(point) for line in f)


@pytest.fixture(scope="module", params=["xfs", "btrfs", "ext4"])
def mounted(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Path]]:
    """A fresh filesystem of the parameter's kind, loop-mounted: its kind and mount point."""
    kind: str = request.param
    mkfs = _MKFS[kind]
    if shutil.which(mkfs[0], path=_SEARCH) is None:
        pytest.skip(f"{mkfs[0]} not found (install {_PACKAGE[kind]}): no {kind} image to mount")
    if os.geteuid() != 0:
        pytest.skip(f"not root (uid {os.geteuid()}): loop-mounting a {kind} image needs root")
    for tool in ("losetup", "mount", "umount"):
        if shutil.which(tool, path=_SEARCH) is None:
            pytest.skip(f"{tool} not found: cannot loop-mount a {kind} image")
    base = tmp_path_factory.mktemp(f"reflink-{kind}")
    image, point = base / f"{kind}.img", base / "mnt"
    point.mkdir()
    with open(image, "wb") as f:
        f.truncate(_IMAGE_SIZE)
    made = _run(*mkfs, str(image))
    if made.returncode != 0:
        pytest.skip(f"{mkfs[0]} failed on a {_IMAGE_SIZE >> 20} MiB image: {_detail(made)}")
    device = ""
    try:
        attached = _run("losetup", "--find", "--show", str(image))
        if attached.returncode != 0:
            pytest.skip(f"no free loop device for the {kind} image: {_detail(attached)}")
        device = attached.stdout.strip()
        mount = _run("mount", "-t", kind, device, str(point))
        if mount.returncode != 0:
            pytest.skip(f"mount refused the {kind} image on {device}: {_detail(mount)}")
        yield kind, point
    finally:
        # whatever ended the tests (a failure, a skip, Ctrl-C): no mount or loop device left
        if _mounted(point) and _run("umount", str(point)).returncode != 0:
            _run("umount", "--lazy", str(point))
        if device:
            _run("losetup", "--detach", device)
        image.unlink(missing_ok=True)
    assert not _mounted(point), f"{point} is still mounted"
    assert not _run("losetup", "--associated", str(image)).stdout.strip()


@pytest.fixture
def place(mounted: tuple[str, Path], request: pytest.FixtureRequest) -> Iterator[Path]:
    """A directory of its own for one test on the mounted filesystem, emptied after it."""
    _, point = mounted
    directory = point / request.node.name.replace("/", "_")
    directory.mkdir()
    yield directory
    shutil.rmtree(directory)


def _make_workspace(root: Path, files: dict[str, int]) -> dict[str, bytes]:
    """Write ``files`` (path -> size) of random bytes under ``root``, last modified an hour
    ago (so the snapshot copies them by stat, none racily clean); their contents."""
    old = time.time() - 3600
    contents = {}
    for rel, size in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        contents[rel] = os.urandom(size)
        path.write_bytes(contents[rel])
        os.utime(path, (old, old))
    return contents


def _syncfs(path: Path) -> None:
    """Flush the filesystem holding ``path``, so its free space counts what was written."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        if libc.syncfs(fd) != 0:
            code = ctypes.get_errno()
            raise OSError(code, os.strerror(code), str(path))
    finally:
        os.close(fd)


def _used(path: Path) -> int:
    _syncfs(path)
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize


def _extents(path: Path) -> list[tuple[int, int, int]]:
    """``path``'s extents as FIEMAP gives them: (logical offset, length, flags)."""
    count = 256
    buf = bytearray(_FIEMAP_HEAD.size + count * _FIEMAP_EXTENT.size)
    _FIEMAP_HEAD.pack_into(buf, 0, 0, 2**64 - 1, _FIEMAP_FLAG_SYNC, 0, count, 0)
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.ioctl(fd, _FIEMAP, buf, True)
    finally:
        os.close(fd)
    mapped = _FIEMAP_HEAD.unpack_from(buf, 0)[3]
    out = []
    for i in range(mapped):
        logical, _, length, _, _, flags, *_ = _FIEMAP_EXTENT.unpack_from(
            buf, _FIEMAP_HEAD.size + i * _FIEMAP_EXTENT.size
        )
        out.append((logical, length, flags))
    assert out and out[-1][2] & _EXTENT_LAST, f"{path}: more than {count} extents"
    return out


def _shared(path: Path) -> bool:
    """Whether every extent of ``path`` is shared with another file."""
    return all(flags & _EXTENT_SHARED for _, _, flags in _extents(path))


def _filefrag_shared(path: Path) -> bool:
    """Whether ``filefrag -v`` shows every extent of ``path`` shared."""
    shown = _run("filefrag", "-v", str(path))
    assert shown.returncode == 0, shown.stderr
    # the rows after the "ext: logical_offset: ..." heading, flags last
    rows = shown.stdout.split(" ext:", 1)[1].splitlines()[1:-1]
    assert rows, shown.stdout
    return all("shared" in row.split()[-1].split(",") for row in rows)


def _checkout(place: Path, files: dict[str, int]) -> tuple[dict[str, bytes], Workdir, int]:
    """A workspace of ``files`` under ``place``, and a branch of it materialized in a state
    directory beside it (same filesystem); its contents, the workdir, and the bytes the
    filesystem's used space grew by while materializing."""
    contents = _make_workspace(place / "ws", files)
    snapshot = Workspace.open(place / "ws").snapshot()
    (place / "state").mkdir()
    before = _used(place)
    workdir = materialize(Branch.from_tree(snapshot, "edit"), place / "state" / "edit-1")
    return contents, workdir, _used(place) - before


def test_a_branch_shares_the_workspace_blocks_where_the_filesystem_reflinks(
    mounted: tuple[str, Path], place: Path
) -> None:
    """On XFS and btrfs every copied file is a reflink (shared extents, the used space hardly
    grows, all counted as reflinked); on ext4 every one is copied (and counted so)."""
    kind, _ = mounted
    contents, workdir, grown = _checkout(place, _FILES)
    with workdir:
        for rel, data in contents.items():
            assert Path(workdir.root, rel).read_bytes() == data
        if kind == "ext4":
            assert workdir.copies == CopyStats(copied=len(_FILES), copied_bytes=_DATA_BYTES)
            assert not any(_shared(Path(workdir.root, rel)) for rel in _FILES)
            assert grown >= _DATA_BYTES, "the copy takes the space of the data"
        else:
            assert workdir.copies == CopyStats(reflinked=len(_FILES), reflinked_bytes=_DATA_BYTES)
            # (btrfs keeps files of up to 2 KiB inline in its metadata: a clone copies those)
            for rel in (rel for rel, size in _FILES.items() if size > 4096):
                assert _shared(Path(workdir.root, rel)), f"{rel}: its extents are not shared"
                assert _shared(place / "ws" / rel)
            assert grown < _DATA_BYTES // 8, f"{grown} bytes used for {_DATA_BYTES} of data"


def test_writing_a_reflinked_copy_leaves_the_workspace_file_as_it_was(
    mounted: tuple[str, Path], place: Path
) -> None:
    """Copy-on-write: bytes written into a branch copy (in place, mid-file) change the copy
    only; the workspace file reads back as before from the disk, and the harvest sees it."""
    contents, workdir, _ = _checkout(place, _BIG)
    rel = "data/blob03.bin"
    patch = b"\xa5" * 8192
    with workdir:
        fd = os.open(Path(workdir.root, rel), os.O_WRONLY)
        try:
            os.pwrite(fd, patch, 100_000)
            os.fsync(fd)
        finally:
            os.close(fd)
        source = os.open(place / "ws" / rel, os.O_RDONLY)
        try:
            # read it from the disk, not from what the page cache may still hold
            os.posix_fadvise(source, 0, 0, os.POSIX_FADV_DONTNEED)
            assert os.pread(source, len(contents[rel]) + 1, 0) == contents[rel]
        finally:
            os.close(source)
        expected = contents[rel][:100_000] + patch + contents[rel][100_000 + len(patch) :]
        assert Path(workdir.root, rel).read_bytes() == expected
        assert workdir.harvest().modified == (rel,)
        assert workdir.branch.read(rel) == expected
        for other in _BIG:
            if other != rel:
                assert (place / "ws" / other).read_bytes() == contents[other]


@pytest.mark.parametrize("mounted", ["btrfs"], indirect=True)
def test_a_file_btrfs_will_not_clone_is_copied_and_the_rest_still_reflinked(
    mounted: tuple[str, Path], place: Path
) -> None:
    """btrfs refuses to clone a no-copy-on-write file (``chattr +C``) into the branch: that one
    file is copied, and the files after it are still reflinked."""
    nocow = place / "ws" / "a"
    nocow.mkdir(parents=True)
    fd = os.open(nocow, os.O_RDONLY | os.O_DIRECTORY)
    try:
        flags = array.array("i", [0])
        fcntl.ioctl(fd, _GETFLAGS, flags, True)
        flags[0] |= _NOCOW
        fcntl.ioctl(fd, _SETFLAGS, flags)  # files made in it inherit the flag
    finally:
        os.close(fd)
    files = {"a/first.bin": 64 << 10, **_BIG}  # first in name order: copied before the others
    _, workdir, _ = _checkout(place, files)
    with workdir:
        assert workdir.copies == CopyStats(
            reflinked=len(_BIG),
            reflinked_bytes=sum(_BIG.values()),
            copied=1,
            copied_bytes=64 << 10,
        )
        assert not _shared(Path(workdir.root, "a/first.bin"))
        assert all(_shared(Path(workdir.root, rel)) for rel in _BIG)


def test_no_reflink_across_filesystems_counts_every_file_as_copied(
    mounted: tuple[str, Path], place: Path, tmp_path: Path
) -> None:
    """A state directory on another filesystem than the workspace gets copies (``FICLONE``
    cannot cross filesystems), whatever either filesystem can do."""
    _make_workspace(place / "ws", _SMALL)
    snapshot = Workspace.open(place / "ws").snapshot()
    assert os.stat(tmp_path).st_dev != os.stat(place).st_dev
    workdir = materialize(Branch.from_tree(snapshot, "edit"), tmp_path / "edit-1")
    with workdir:
        assert workdir.copies == CopyStats(copied=len(_SMALL), copied_bytes=sum(_SMALL.values()))


def test_fiemap_reads_shared_extents_as_filefrag_does(
    mounted: tuple[str, Path], place: Path
) -> None:
    """The FIEMAP reading these tests rely on agrees with ``filefrag -v`` (shared or not)."""
    kind, _ = mounted
    if shutil.which("filefrag", path=_SEARCH) is None:
        pytest.skip("filefrag not found (install e2fsprogs): nothing to compare with")
    _, workdir, _ = _checkout(place, {"one.bin": 256 << 10})
    with workdir:
        path = Path(workdir.root, "one.bin")
        assert _filefrag_shared(path) == _shared(path) == (kind != "ext4")
