"""The stat of every entry of a tree, taken by another process.

A walk that stats every entry of a 10,000-file tree in a worker thread gives up the GIL at each
``stat``; while the event loop's thread runs Python code, each call then waits for it to give
the GIL back (up to the switch interval): measured, a walk of 60 ms alone took over 2 s next to
a busy thread. GNU ``find`` takes the same stats in its own process, on another CPU, and writes
one line per entry; the caller holds the GIL for a few calls only (start, wait, one read) and
compares the lines as bytes with the lines it expects, without a Python step per entry.

The lines are compared, never parsed, for the entries found as expected: a line holds every
field the comparison needs, so equal lines are equal stats. Only ``find``'s time format is
taken on trust, and it is checked once per process on a file of known times
(:func:`find_command`); where ``find`` is not GNU's, or prints times otherwise, there is none,
and callers walk the tree themselves.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
import threading
from collections.abc import Iterable

__all__ = [
    "DIR_PATH_FORMAT",
    "FIND_MIN_ENTRIES",
    "ListingFailed",
    "dir_line",
    "file_line",
    "find_command",
    "split_dir",
    "split_file",
    "walk",
]

# Fields: type, device, inode, links, size, mtime, ctime, permission bits, path (last: it may
# hold spaces). A directory's: device, permission bits, owner, group, path.
_FILE_FORMAT = r"%y %D %i %n %s %T@ %C@ %m %P\0"
_DIR_FORMAT = r"d %D %m %U %G %P\0"

_TYPES = {
    stat.S_IFREG: b"f",
    stat.S_IFLNK: b"l",
    stat.S_IFDIR: b"d",
    stat.S_IFIFO: b"p",
    stat.S_IFSOCK: b"s",
    stat.S_IFCHR: b"c",
    stat.S_IFBLK: b"b",
}


class ListingFailed(OSError):
    """``find`` could not list every entry (an unreadable directory, one gone meanwhile, no
    room for its output): nothing is known from it."""


#: trees of fewer entries are walked here: starting ``find`` costs more than their stats
FIND_MIN_ENTRIES = 2000

_lock = threading.Lock()
_checked: list[str | None] = []


def _time(ns: int) -> bytes:
    """A time in nanoseconds as ``find`` prints ``%T@`` (seconds, nine digits and a 0)."""
    seconds, fraction = divmod(ns, 1_000_000_000)
    return b"%d.%09d0" % (seconds, fraction)


def file_line(rel: bytes, key: tuple[int, int, int, int, int], device: int) -> bytes:
    """The line ``find`` prints for a non-directory ``rel`` of ``device`` whose stat is
    ``key`` (size, mtime, inode, mode, ctime, as the harvest records it) and that has no
    second name. A time before 1970 gets a line no entry matches."""
    size, mtime, ino, mode, ctime = key
    kind = _TYPES.get(stat.S_IFMT(mode), b"?")
    if mtime < 0 or ctime < 0:
        kind = b"?"
    return b"%s %d %d 1 %d %s %s %o %s" % (
        kind,
        device,
        ino,
        size,
        _time(mtime),
        _time(ctime),
        stat.S_IMODE(mode),
        rel,
    )


def dir_line(rel: bytes, device: int, mode: int, owner: tuple[int, int]) -> bytes:
    """The line ``find`` prints for a directory ``rel`` of ``device`` with permission bits
    ``mode`` and ``owner`` (uid, gid)."""
    return b"d %d %o %d %d %s" % (device, mode, owner[0], owner[1], rel)


def split_file(line: bytes) -> tuple[bytes, int, int, int, bytes]:
    """A non-directory's line: (type, device, links, size, path)."""
    kind, device, _ino, links, size, _m, _c, _perm, rel = line.split(b" ", 8)
    return kind, int(device), int(links), int(size), rel


def split_dir(line: bytes) -> tuple[int, int, tuple[int, int], bytes]:
    """A directory's line: (device, permission bits, (uid, gid), path)."""
    _d, device, perm, uid, gid, rel = line.split(b" ", 5)
    return int(device), int(perm, 8), (int(uid), int(gid)), rel


#: the line of a directory when only its device and path matter (:func:`walk` with
#: ``paths_of_dirs``)
DIR_PATH_FORMAT = r"d %D %P\0"


def _glob(text: str) -> str:
    """``text`` as a ``find`` pattern matching only itself."""
    return "".join(f"\\{c}" if c in "\\*?[]" else c for c in text)


def _pruned(top: str, names: Iterable[str], dirs: Iterable[str]) -> list[str]:
    """The ``find`` expression (followed by ``-o``) that leaves out every entry named as one
    of ``names`` (in any case) and the directories ``dirs`` (relative to ``top``), with what
    they hold."""
    # in any case, as the version-control names are judged (``.GIT`` is ``.git`` on a
    # case-insensitive file system)
    tests: list[list[str]] = [["-iname", _glob(name)] for name in sorted(names)]
    by_name: dict[str, list[str]] = {}
    for rel in sorted(dirs):
        by_name.setdefault(rel.rpartition("/")[2], []).append(rel)
    for name, rels in by_name.items():
        # the name first: the path is compared only for an entry of that name
        paths: list[str] = []
        for i, rel in enumerate(rels):
            paths += (["-o"] if i else []) + ["-path", _glob(f"{top}/{rel}")]
        tests.append(["-type", "d", "-name", _glob(name), "(", *paths, ")"])
    if not tests:
        return []
    out = ["("]
    for i, test in enumerate(tests):
        out += (["-o"] if i else []) + ["(", *test, ")"]
    return [*out, ")", "-prune", "-o"]


def _run(
    find: str,
    top: str,
    *,
    dir_format: str,
    prune: Iterable[str],
    prune_dirs: Iterable[str],
) -> bytes:
    """What ``find`` prints for every entry of the directory ``top`` (absolute). Raises
    :class:`ListingFailed` if it could not list everything."""
    args = [find, "-P", top, "-xdev"]
    args += _pruned(top, prune, prune_dirs)
    args += ["(", "-type", "d", "-printf", dir_format, ")", "-o", "-printf", _FILE_FORMAT]
    # written to a file and read in one call: a pipe would be read in many, each a GIL hand-off
    try:
        with tempfile.TemporaryFile() as out:
            done = subprocess.run(
                args,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.DEVNULL,
                env={"LC_ALL": "C", "PATH": os.defpath},
                check=False,
            )
            size = os.fstat(out.fileno()).st_size
            data = os.pread(out.fileno(), size, 0) if size else b""
    except OSError as e:  # no room for the output, no process started
        raise ListingFailed(f"find could not list {top}: {e}") from None
    if done.returncode != 0:
        raise ListingFailed(f"find could not list every entry of {top} ({done.returncode})")
    return data


def walk(
    find: str,
    top: str,
    *,
    paths_of_dirs: bool = False,
    prune: Iterable[str] = (),
    prune_dirs: Iterable[str] = (),
) -> list[bytes]:
    """The lines of every entry of the directory ``top`` (absolute), each directory before
    what it holds (``top`` first, with the path ``b""``): staying on its filesystem (a mount
    point below is listed, not entered); without any entry named as one of ``prune`` (in any
    case), nor the directories ``prune_dirs`` (paths relative to ``top``), nor what they hold;
    a directory's line only ``d DEVICE PATH`` with
    ``paths_of_dirs``. Raises :class:`ListingFailed` (an OSError) if it could not list
    them all."""
    dir_format = DIR_PATH_FORMAT if paths_of_dirs else _DIR_FORMAT
    data = _run(find, top, dir_format=dir_format, prune=prune, prune_dirs=prune_dirs)
    if not data.endswith(b"\0"):
        raise ListingFailed(f"find printed a cut-short listing of {top}")
    return data[:-1].split(b"\0")


def _calibrate(find: str) -> bool:
    """Whether ``find`` prints, for a file and a directory of known stat, the lines expected."""
    with tempfile.TemporaryDirectory() as top:
        path = os.path.join(top, "a b")
        with open(path, "wb") as f:
            f.write(b"x")
        os.utime(path, ns=(1_000_000_007, 1_700_000_000_123_456_789))
        os.chmod(path, 0o4751)
        st, dst = os.lstat(path), os.lstat(top)
        key = (st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode, st.st_ctime_ns)
        expected = [
            dir_line(b"", dst.st_dev, stat.S_IMODE(dst.st_mode), (dst.st_uid, dst.st_gid)),
            file_line(b"a b", key, st.st_dev),
        ]
        try:
            return walk(find, top) == expected
        except (OSError, ValueError):
            return False


def find_command() -> str | None:
    """The ``find`` whose lines :func:`file_line` and :func:`dir_line` foretell (checked once
    per process), or None: none on the ``PATH``, or not GNU's."""
    with _lock:
        if not _checked:
            found = shutil.which("find")
            try:
                ok = found is not None and _calibrate(found)
            except OSError:
                ok = False
            _checked.append(found if ok else None)
        return _checked[0]
