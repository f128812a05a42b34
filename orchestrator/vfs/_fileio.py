"""Low-level file helpers: paths, modes, hashing, cheap copies, atomic writes, fsync.

Everything here is synchronous and thread-safe; callers run it in worker threads when they are
async.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import secrets
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress

from attrs import define, field, frozen

from .._names import name_bytes, name_of
from ._mounts import mount_id
from .errors import PathRefused

__all__ = [
    "DEFAULT_MODE",
    "LARGE_FILE_SIZE",
    "NAME_MAX",
    "PATH_MAX",
    "SYMLINK_MODE",
    "TEMP_SUFFIX",
    "CopyStats",
    "CopyTally",
    "check_path_limits",
    "copy_fd",
    "copy_fd_digest",
    "copy_fd_hashed",
    "digest",
    "digest_fd",
    "fsync_dir",
    "git_mode",
    "is_binary",
    "is_symlink",
    "is_temp_name",
    "make_dirs",
    "normalize_mode",
    "normalize_path",
    "read_entry",
    "remove_tree",
    "temp_name",
    "temp_stem",
    "walk_files",
    "write_entry_atomic",
]

#: mode of a new regular file (``0o100644``)
DEFAULT_MODE = stat.S_IFREG | 0o644
#: mode of a symbolic link (its content is the link target)
SYMLINK_MODE = stat.S_IFLNK | 0o777
#: bytes in one file name (Linux's ``NAME_MAX``)
NAME_MAX = 255
#: bytes in a path, its terminating NUL included (Linux's ``PATH_MAX``): longer ones can never
#: be looked up at once
PATH_MAX = 4096
#: a file larger than this (8 MiB) is not diffed line by line: diffs give its sizes, patches
#: leave it out, and a snapshot does not keep its content for them
LARGE_FILE_SIZE = 8 * 2**20

# The Linux ioctl that shares extents between two files (btrfs, XFS, bcachefs, ...).
_FICLONE = 0x40049409
# Errors meaning "this copy method is not available here", not "the copy failed".
_UNSUPPORTED = frozenset(
    {errno.EXDEV, errno.EOPNOTSUPP, errno.ENOTTY, errno.EINVAL, errno.ENOSYS, errno.EPERM}
)
# Of those, what FICLONE answers for every file of a pair of filesystems (not the same one, or
# no reflinks there). The others speak of one file: btrfs refuses to clone a nodatacow file
# (``chattr +C``) into a datacow one with EINVAL, an append-only or immutable file gives EPERM,
# a swap file ETXTBSY; that file is copied, the next ones are still cloned.
_NO_REFLINK_HERE = frozenset({errno.EXDEV, errno.EOPNOTSUPP, errno.ENOTTY, errno.ENOSYS})
_NOT_THIS_FILE = frozenset({errno.EINVAL, errno.EPERM, errno.ETXTBSY})
# Device pairs for which a method failed as unsupported; set.add is atomic under the GIL.
_no_reflink: set[tuple[int, int]] = set()
_no_copy_range: set[tuple[int, int]] = set()


def check_path_limits(path: str) -> None:
    """Raise :class:`PathRefused` if ``path`` can name no file: a NUL byte in it, a character
    the filesystem encoding cannot hold, a name longer than :data:`NAME_MAX` bytes, or
    :data:`PATH_MAX` bytes or more in all."""
    if "\0" in path:
        raise PathRefused(path, "NUL byte in path")
    # a character is at most 4 bytes: shorter strings need no encoding to be within the limits
    if len(path) >= PATH_MAX // 4 or not path.isascii():
        try:
            size = len(os.fsencode(path))
        except UnicodeEncodeError as e:
            raise PathRefused(path, f"character {path[e.start]!r} cannot be in a file name") from e
        if size >= PATH_MAX:
            raise PathRefused(path, f"a path of {size} bytes (the limit is {PATH_MAX - 1})")
    if len(path) > NAME_MAX // 4:
        for name in path.split("/"):
            if len(name) > NAME_MAX // 4 and (size := len(os.fsencode(name))) > NAME_MAX:
                raise PathRefused(path, f"a name of {size} bytes (the limit is {NAME_MAX})")


def normalize_path(path: str) -> str:
    """A branch path in canonical form: relative, ``/``-separated, no ``.``/``..``/empty parts.

    Raises :class:`PathRefused` for absolute paths, ``..`` components, an empty path, or one that
    can name no file (see :func:`check_path_limits`).
    """
    if "\0" in path or len(path) > NAME_MAX // 4 or not path.isascii():
        check_path_limits(path)  # short ASCII paths (most) are within the limits
    if path.startswith("/"):
        raise PathRefused(path, "absolute path where a branch-relative one is needed")
    parts = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            raise PathRefused(path, "'..' is not allowed in a branch path")
        parts.append(part)
    if not parts:
        raise PathRefused(path, "empty path")
    return "/".join(parts)


def normalize_mode(mode: int) -> int:
    """File type and permission bits of ``mode``; a bare permission (``0o755``) means a file.

    The setuid, setgid and sticky bits are dropped: a branch never records them, so a run
    never shows or writes them (an agent's ``chmod 4755`` must not plant a setuid file in the
    user's project, and git keeps only the executable bit anyway).
    """
    kind = stat.S_IFMT(mode) or stat.S_IFREG
    if kind == stat.S_IFLNK:
        return SYMLINK_MODE
    return kind | (stat.S_IMODE(mode) & 0o777)


def is_symlink(mode: int) -> bool:
    """True when ``mode`` is a symbolic link's."""
    return stat.S_ISLNK(mode)


def git_mode(mode: int) -> str:
    """The git tree mode for ``mode``: ``120000``, ``100755`` or ``100644``."""
    if stat.S_ISLNK(mode):
        return "120000"
    return "100755" if mode & 0o111 else "100644"


def digest(data: bytes) -> str:
    """The content hash used throughout the VFS (SHA-256, hex)."""
    return hashlib.sha256(data).hexdigest()


def digest_fd(fd: int) -> str:
    """:func:`digest` of what an open file holds from its current offset on, read in pieces
    (a file of any size is hashed in constant memory). The fd stays open."""
    with open(fd, "rb", closefd=False) as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def is_binary(data: bytes) -> bool:
    """git's heuristic: a NUL byte in the first 8000 bytes means binary."""
    return b"\0" in data[:8000]


#: how every temporary name ends (recovery finds the leftovers of a crash by it)
TEMP_SUFFIX = ".orch-tmp"
# bytes of a temporary name besides its stem: "." before it, "." + 12 hex digits + TEMP_SUFFIX after
_TEMP_EXTRA = 1 + 1 + 12 + len(TEMP_SUFFIX)
# bytes of a long name kept in the stem, which then ends in "~" and 12 hex digits of its digest
_TEMP_KEPT = NAME_MAX - _TEMP_EXTRA - 13


def temp_stem(name: str) -> str:
    """What every temporary name :func:`temp_name` gives for ``name`` starts with, ``.``
    included and followed by ``.``: ``.NAME`` when that leaves the temporary name within
    :data:`NAME_MAX` bytes, else a prefix of ``NAME`` and a digest of all of it (a name of up
    to 255 bytes has a temporary name of at most 255 too)."""
    raw = name_bytes(name)
    if len(raw) + _TEMP_EXTRA <= NAME_MAX:
        return f".{name}"
    # a prefix cut inside a character decodes to escaped bytes: still exactly raw[:_TEMP_KEPT]
    return f".{name_of(raw[:_TEMP_KEPT])}~{hashlib.sha256(raw).hexdigest()[:12]}"


def temp_name(name: str) -> str:
    """A hidden temporary name next to ``name`` (same directory, so ``os.replace`` is atomic),
    unique and at most :data:`NAME_MAX` bytes whatever the length of ``name``; it starts with
    :func:`temp_stem` and ``.``, and ends with :data:`TEMP_SUFFIX`."""
    return f"{temp_stem(name)}.{secrets.token_hex(6)}{TEMP_SUFFIX}"


def is_temp_name(found: str, name: str) -> bool:
    """True when ``found`` is a name :func:`temp_name` may have given for ``name``."""
    return found.startswith(f"{temp_stem(name)}.") and found.endswith(TEMP_SUFFIX)


def read_entry(path: str) -> tuple[bytes, int, os.stat_result]:
    """Content, normalized mode and ``lstat`` of a file or symlink (a link's: its target)."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return name_bytes(os.readlink(path)), SYMLINK_MODE, st
    if not stat.S_ISREG(st.st_mode):
        raise IsADirectoryError(errno.EISDIR, "not a regular file", path)
    with open(path, "rb") as f:
        data = f.read()
    return data, normalize_mode(st.st_mode), st


def _copy_range(src: int, dst: int, size: int, done: int) -> int:
    while done < size:
        n = os.copy_file_range(src, dst, size - done, done, done)
        if n == 0:
            break
        done += n
    return done


def _copy_plain(src: int, dst: int, done: int) -> None:
    while True:
        chunk = os.pread(src, 1 << 20, done)
        if not chunk:
            return
        view = memoryview(chunk)
        while view:
            n = os.pwrite(dst, view, done)
            view = view[n:]
            done += n


def _reflink(src: int, dst: int, devices: tuple[int, int]) -> bool:
    """Clone ``src`` into ``dst`` (``FICLONE``); False where the pair of devices cannot, or
    cannot for this file."""
    if devices in _no_reflink:
        return False
    try:
        fcntl.ioctl(dst, _FICLONE, src)
    except OSError as e:
        if e.errno in _NO_REFLINK_HERE:
            _no_reflink.add(devices)
            return False
        if e.errno in _NOT_THIS_FILE:
            return False
        raise
    return True


def copy_fd(src: int, dst: int, size: int, devices: tuple[int, int]) -> bool:
    """Copy ``size`` bytes from ``src`` to the empty file ``dst`` as cheaply as the system allows;
    True when reflinked (``dst`` shares ``src``'s blocks), False when the bytes were copied.

    Reflink (``FICLONE``) first, then ``copy_file_range`` (in-kernel copy, itself a reflink on
    some filesystems), then ``pread``/``pwrite``. A method that fails as unsupported is not tried
    again for the same pair of devices (a reflink refused for one file only still is). Never a
    hard link.
    """
    if _reflink(src, dst, devices):
        return True
    done = 0
    if devices not in _no_copy_range:
        try:
            done = _copy_range(src, dst, size, 0)
        except OSError as e:
            if e.errno not in _UNSUPPORTED:
                raise
            _no_copy_range.add(devices)
        else:
            if done >= size:
                # Exactly the measured size is copied; callers re-check the source's stat to
                # catch a file that changed meanwhile.
                return False
    _copy_plain(src, dst, done)
    return False


def copy_fd_hashed(src: int, dst: int, size: int, devices: tuple[int, int]) -> str:
    """:func:`copy_fd`, and the digest of the ``size`` bytes copied (see :func:`copy_fd_digest`)."""
    return copy_fd_digest(src, dst, size, devices)[0]


def copy_fd_digest(src: int, dst: int, size: int, devices: tuple[int, int]) -> tuple[str, bool]:
    """:func:`copy_fd`: the digest of the ``size`` bytes copied, and True when reflinked.

    The bytes are read once: reflinked, they are read back from ``src`` to be hashed; else
    they go through here (``pread``, hash, ``pwrite``) instead of an in-kernel copy, which
    would leave them to be read a second time.
    """
    if _reflink(src, dst, devices):
        hasher = hashlib.sha256()
        done = 0
        while done < size and (chunk := os.pread(src, min(size - done, 1 << 20), done)):
            hasher.update(chunk)
            done += len(chunk)
        return hasher.hexdigest(), True
    if size <= 1 << 20:
        # one read and one write: most files of a source tree
        data = os.pread(src, size, 0)
        view = memoryview(data)
        done = 0
        while view:
            n = os.pwrite(dst, view, done)
            view = view[n:]
            done += n
        return digest(data), False
    hasher = hashlib.sha256()
    done = 0
    while done < size and (chunk := os.pread(src, min(size - done, 1 << 20), done)):
        hasher.update(chunk)
        view = memoryview(chunk)
        while view:
            n = os.pwrite(dst, view, done)
            view = view[n:]
            done += n
    return hasher.hexdigest(), False


@frozen
class CopyStats:
    """How a branch directory's files were made: ``reflinked`` files share their blocks with
    the workspace's (``FICLONE``: btrfs, XFS; no data written), ``copied`` ones had their bytes
    written (an in-kernel or plain copy, or content the branch holds). ``*_bytes``: their
    sizes. Symlinks and directories are not counted."""

    reflinked: int = 0
    reflinked_bytes: int = 0
    copied: int = 0
    copied_bytes: int = 0

    def __add__(self, other: CopyStats) -> CopyStats:
        return CopyStats(
            self.reflinked + other.reflinked,
            self.reflinked_bytes + other.reflinked_bytes,
            self.copied + other.copied,
            self.copied_bytes + other.copied_bytes,
        )


@define
class CopyTally:
    """:class:`CopyStats` being counted, by any number of threads at once."""

    _lock: threading.Lock = field(factory=threading.Lock, init=False)
    _counts: list[int] = field(factory=lambda: [0, 0, 0, 0], init=False)

    def add(self, size: int, *, reflinked: bool) -> None:
        """Count one file of ``size`` bytes, reflinked or copied."""
        at = 0 if reflinked else 2
        with self._lock:
            self._counts[at] += 1
            self._counts[at + 1] += size

    def stats(self) -> CopyStats:
        """What was counted so far."""
        with self._lock:
            return CopyStats(*self._counts)


@contextmanager
def _cleanup_on_error(path: str, dir_fd: int | None) -> Iterator[None]:
    try:
        yield
    except BaseException:
        with suppress(FileNotFoundError):
            os.unlink(path, dir_fd=dir_fd)
        raise


def write_entry_atomic(
    path: str,
    data: bytes,
    mode: int,
    *,
    fsync: bool = False,
    dir_fd: int | None = None,
    times_ns: tuple[int, int] | None = None,
) -> None:
    """Write a file (or symlink, by ``mode``) through a temporary name and ``os.replace``.

    ``path`` is relative to ``dir_fd`` when given (its last component only is used then). Readers
    see either the old or the new content, never a partial one.
    """
    head, name = os.path.split(path)
    tmp = os.path.join(head, temp_name(name))
    if stat.S_ISLNK(mode):
        os.symlink(name_of(data), tmp, dir_fd=dir_fd)
        with _cleanup_on_error(tmp, dir_fd):
            os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        return
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    with _cleanup_on_error(tmp, dir_fd):
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, stat.S_IMODE(mode))
            if times_ns is not None:
                os.utime(fd, ns=times_ns)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def fsync_dir(path: str) -> None:
    """fsync a directory so the names created, replaced or removed in it are durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# Trees of any depth: the standard library's os.makedirs, os.walk and shutil.rmtree recurse once
# per directory level (before Python 3.12/3.13) and a chain of a thousand directories, which
# an agent can make, exhausts the interpreter's stack.

_DIR_NOFOLLOW = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def make_dirs(path: str) -> None:
    """Create directory ``path`` and its missing parents (an existing one is fine), at any
    depth; ``FileExistsError`` if ``path`` or a parent is something else."""
    missing: list[str] = []
    current = os.path.normpath(path)
    while not os.path.isdir(current):
        missing.append(current)
        parent = os.path.dirname(current)
        if parent == current:
            break
        current = parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory)
        except FileExistsError:
            if not os.path.isdir(directory):  # made by someone else meanwhile: fine
                raise


def walk_files(top: str) -> Iterator[str]:
    """The paths of everything under directory ``top`` that is not a directory, at any depth
    (symlinks are listed, never followed; unreadable directories are skipped)."""
    stack = [top]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as it:
                entries = list(it)
        except OSError:
            continue
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                stack.append(entry.path)
            else:
                yield entry.path


def _empty_files(fd: int, name: str) -> tuple[tuple[int, int], str, list[str]]:
    """Unlink what directory ``fd`` holds but subdirectories; its identity, ``name`` and the
    names of those subdirectories."""
    st = os.fstat(fd)
    subdirs: list[str] = []
    with suppress(OSError), os.scandir(fd) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False):
                subdirs.append(entry.name)
            else:
                with suppress(OSError):
                    os.unlink(entry.name, dir_fd=fd)
    return (st.st_dev, st.st_ino), name, subdirs


def remove_tree(path: str) -> list[str]:
    """Remove directory ``path`` and everything in it, at any depth; errors are ignored (what
    cannot be removed stays), as with ``shutil.rmtree(path, ignore_errors=True)``. A symlink
    or a file at ``path`` is removed itself (a link's target never touched).

    One directory is open at a time, entered without following symlinks and left through
    ``..`` only if that is still the directory it was entered from (else the removal stops): a
    tree rearranged meanwhile, by a process still running in it, never leads it elsewhere.

    A mount point at or below ``path`` is never entered: what it shows (a directory
    elsewhere, bind-mounted by a process running as root, has the same device) stays as it
    is, and so do the directories holding it, as with ``rm -rf --one-file-system``. Each
    directory is entered only once opened and found on the mount ``path`` is on (its mount's
    id, see :mod:`~orchestrator.vfs._mounts`): a mount made meanwhile, before or during the
    removal, is found alike. Returns the paths of the directories not entered for that,
    ``path`` itself if it is a mount point (none without ``/proc``: not Linux, where every
    directory is entered).
    """
    try:
        fd = os.open(path, _DIR_NOFOLLOW)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENOTDIR):  # a symlink (or a file) put in its place
            with suppress(OSError):
                os.unlink(path)
        return []
    left: list[str] = []
    try:
        top_mount = mount_id(fd)  # None without /proc: every directory is entered
        if top_mount is not None and top_mount != _parent_mount(path):
            return [path]  # a mount point itself: nothing in it is ours
        # the directories entered, outermost first: identity, name, subdirectories left
        stack = [_empty_files(fd, "")]
        while True:
            _, name, pending = stack[-1]
            if pending:
                child = pending.pop()
                try:
                    child_fd = os.open(child, _DIR_NOFOLLOW, dir_fd=fd)
                except OSError:
                    continue
                # told once open: what the descriptor is on cannot change after
                if top_mount is not None and mount_id(child_fd) != top_mount:
                    os.close(child_fd)
                    left.append(os.path.join(path, *(entered[1] for entered in stack), child))
                    continue
                os.close(fd)
                fd = child_fd
                stack.append(_empty_files(fd, child))
                continue
            stack.pop()
            if not stack:
                break
            up = os.open("..", _DIR_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = up
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != stack[-1][0]:
                return left  # moved meanwhile: what is left there is not ours to find
            with suppress(OSError):
                os.rmdir(name, dir_fd=fd)
        with suppress(OSError):
            os.rmdir(path)
    except OSError:
        return left
    finally:
        os.close(fd)
    return left


def _parent_mount(path: str) -> int | None:
    """The id of the mount the directory holding ``path`` is on (None if not told)."""
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)), _DIR_NOFOLLOW & ~os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        return mount_id(fd)
    finally:
        os.close(fd)
