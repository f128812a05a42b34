"""A minimal Linux inotify binding (ctypes) telling a harvest which paths may have changed.

Only an accelerator: the kernel queues an event, synchronously with the system call, for every
create, write, attribute change, delete and rename in a watched directory, so a harvest can
``stat`` just those paths instead of the whole tree. Whenever the queue overflows, a watch cannot
be added, or a directory is renamed, the caller falls back to a full ``stat`` scan. Writes through
a shared ``mmap`` produce no events; ask for a full harvest if an agent's tools write that way.

A watch on a file (:meth:`Inotify.add_files`) is a watch on its inode: it sees a write, a
truncation, a chmod, a new or removed name (the link count) and the last close of a file opened
for writing through *any* name of the file, a hard link outside the watched tree included, where
a directory's watch sees only what is done through the names in it. The last close comes after
the last shared mapping of that open is gone, so even writes through ``mmap`` end in an event
once the process that made them lets go. With every directory and file of a tree watched and
every event since kept (:attr:`Inotify.touched`), a pooled directory is reset by the paths the
events name (see :mod:`orchestrator.vfs.pool`). File watches count against the user's limit
(``fs.inotify.max_user_watches``), which other programs share: this process takes at most a
quarter of it (:func:`file_watch_room`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
import sys
import threading
import weakref
from collections.abc import Container, Iterable

from attrs import define, field

from .._names import name_bytes, name_of

__all__ = ["Event", "Inotify", "file_watch_room"]

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
IN_OPEN = 0x00000020
IN_MOVED_FROM = 0x00000040
IN_MOVED_TO = 0x00000080
IN_CREATE = 0x00000100
IN_DELETE = 0x00000200
IN_DELETE_SELF = 0x00000400
IN_MOVE_SELF = 0x00000800
IN_Q_OVERFLOW = 0x00004000
IN_IGNORED = 0x00008000
IN_ONLYDIR = 0x01000000
IN_DONT_FOLLOW = 0x02000000
IN_EXCL_UNLINK = 0x04000000
IN_MASK_ADD = 0x20000000
IN_ISDIR = 0x40000000
_IN_NONBLOCK = os.O_NONBLOCK
_IN_CLOEXEC = os.O_CLOEXEC

_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_MOVED_FROM
    | IN_MOVED_TO
    | IN_CREATE
    | IN_DELETE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_ONLYDIR
    | IN_DONT_FOLLOW
    | IN_EXCL_UNLINK
)
# what a file's watch reports: anything that can change what it holds or its stat; added to
# what a watch of the same inode already reports (a directory's: the path is one now)
_FILE_MASK = (
    IN_MODIFY
    | IN_ATTRIB
    | IN_CLOSE_WRITE
    | IN_DELETE_SELF
    | IN_MOVE_SELF
    | IN_DONT_FOLLOW
    | IN_MASK_ADD
)
_HEADER = struct.Struct("iIII")

Event = tuple[str, int, str]
"""(watched directory, relative to the watched root; event mask; entry name or "")."""


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.inotify_init1.argtypes = [ctypes.c_int]
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_rm_watch.argtypes = [ctypes.c_int, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


_LIBC = _libc()


def _pylibc() -> ctypes.PyDLL | None:
    """libc called with the GIL held: thousands of watches added in a row, each a short system
    call, would otherwise hand the GIL to the event loop's thread and wait for it back each
    time."""
    if _LIBC is None:
        return None
    try:
        libc = ctypes.PyDLL(None, use_errno=True)
        libc.inotify_add_watch.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_uint32]
        libc.inotify_add_watch.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


_PYLIBC = _pylibc()

_files_lock = threading.Lock()
_files_held = 0  # file watches held by every instance of this process


def _max_user_watches() -> int:
    try:
        with open("/proc/sys/fs/inotify/max_user_watches", "rb") as f:
            return int(f.read().strip() or 0)
    except (OSError, ValueError):
        return 0


_limit: int | None = None  # the user's limit, read once


def file_watch_room() -> int:
    """How many more file watches this process may add (a quarter of the user's limit in all:
    the rest is left to the other programs watching files as the same user)."""
    global _limit
    if _limit is None:
        _limit = _max_user_watches()
    with _files_lock:
        return max(0, _limit // 4 - _files_held)


def _count_files(delta: int) -> None:
    global _files_held
    with _files_lock:
        _files_held += delta


def _release(fd: int, files: dict[int, set[str]]) -> None:
    """Close an instance's descriptor (its watches go with it) and give back the room its file
    watches took: at :meth:`Inotify.close`, or when an instance nobody closed is collected."""
    with contextlib.suppress(OSError):
        os.close(fd)
    if files:
        _count_files(-len(files))
        files.clear()


@define(eq=False)
class Inotify:
    """An inotify instance watching directories below one root (non-blocking)."""

    root: str
    fd: int
    _by_wd: dict[int, str] = field(factory=dict, alias="_by_wd")
    _by_dir: dict[str, int] = field(factory=dict, alias="_by_dir")
    _finalizer: weakref.finalize[[int, dict[int, set[str]]], Inotify] | None = field(
        default=None, alias="_finalizer"
    )
    #: file watches: wd -> the paths watched by it (more than one: hard links), and back
    _files: dict[int, set[str]] = field(factory=dict, alias="_files")
    _file_wd: dict[str, int] = field(factory=dict, alias="_file_wd")
    overflowed: bool = False
    #: every path an event named since :meth:`take_touched` (a directory's own events name
    #: it), with the masks of those events or-ed; kept only once :meth:`take_touched` was called
    touched: dict[str, int] | None = None
    #: every directory and file of the tree was watched when :attr:`touched` began (set by
    #: whoever watched them all; a watch that could not be added clears it)
    complete: bool = False
    #: file watches added from now on report opens too: a file opened for writing and not
    #: yet closed (perhaps mapped) is named before its last close
    opens: bool = False
    #: the device and inode of the root when its watch was added: the directory the events
    #: are of (a directory put in its place since is another)
    root_ident: tuple[int, int] | None = None

    @classmethod
    def open(cls, root: str) -> Inotify | None:
        """A new instance, or None where inotify is unavailable (not Linux, instance limit)."""
        if _LIBC is None:
            return None
        fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        self = cls(root, fd)
        self._finalizer = weakref.finalize(self, _release, fd, self._files)
        return self

    def watches(self, rel_dir: str) -> bool:
        """Whether directory ``rel_dir`` is watched."""
        return rel_dir in self._by_dir

    def add(self, rel_dir: str) -> bool:
        """Watch directory ``rel_dir`` ("" for the root); False when no watch can be added."""
        if rel_dir in self._by_dir or _LIBC is None:
            return True
        path = os.path.join(self.root, rel_dir) if rel_dir else self.root
        wd = _LIBC.inotify_add_watch(self.fd, name_bytes(path), _MASK)
        if wd < 0:
            err = ctypes.get_errno()
            # A directory that vanished (or was replaced) in the meantime needs no watch.
            return err in (errno.ENOENT, errno.ENOTDIR)
        other = self._by_wd.get(wd)
        if other is not None and other != rel_dir:
            # one directory by two paths (a symlink along one): its events name only one
            self.complete = False
            return True
        paths = self._files.pop(wd, None)
        if paths is not None:  # watched as a file before: its events are a directory's now
            for rel in paths:
                if self._file_wd.get(rel) == wd:
                    del self._file_wd[rel]
            _count_files(-1)
        self._by_wd[wd] = rel_dir
        self._by_dir[rel_dir] = wd
        return True

    def add_files(self, rels: Iterable[str]) -> bool:
        """Watch the inode of each file (or symlink) ``rels`` names, replacing the watch kept
        for that path; False (and :attr:`complete` cleared) when one cannot be added, for a
        reason other than the file being gone (then its path is taken as touched), or when
        there is no room left for them (see :func:`file_watch_room`)."""
        libc = _PYLIBC
        todo = list(rels)
        if libc is None or len(todo) > file_watch_room():
            self.complete = False
            return False
        root, fd, files, file_wd = self.root, self.fd, self._files, self._file_wd
        add = libc.inotify_add_watch
        mask = _FILE_MASK | IN_OPEN if self.opens else _FILE_MASK
        added = 0
        try:
            for rel in todo:
                wd = add(fd, name_bytes(f"{root}/{rel}"), mask)
                if wd < 0:
                    if ctypes.get_errno() in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                        self._touch(rel, IN_DELETE_SELF)
                        continue
                    self.complete = False
                    return False
                was = file_wd.pop(rel, None)
                if was is not None and was != wd and was in files:
                    # the path's former inode (replaced): its events no longer name the path
                    others = files[was]
                    others.discard(rel)
                    if not others:
                        del files[was]
                        added -= 1
                        if _LIBC is not None:
                            _LIBC.inotify_rm_watch(fd, was)
                if wd in self._by_wd:  # a directory now, watched as one: its watch tells
                    continue
                if wd not in files:
                    files[wd] = set()
                    added += 1
                # a second name of the same inode (a hard link): its events name both
                files[wd].add(rel)
                file_wd[rel] = wd
        finally:
            _count_files(added)
        return True

    def keep_files(self, rels: Container[str]) -> None:
        """Stop watching files at paths other than ``rels`` (a file the agent made, deleted
        here but kept alive by another name, would hold its watch for good)."""
        files, file_wd = self._files, self._file_wd
        dropped = 0
        for rel in [rel for rel in file_wd if rel not in rels]:
            wd = file_wd.pop(rel)
            paths = files.get(wd)
            if paths is None:
                continue
            paths.discard(rel)
            if not paths:
                del files[wd]
                dropped += 1
                if _LIBC is not None:
                    _LIBC.inotify_rm_watch(self.fd, wd)
        _count_files(-dropped)

    def watches_all(self, dirs: Iterable[str], files: Iterable[str]) -> bool:
        """Whether each of ``dirs`` and ``files`` is watched (and no watch was lost)."""
        by_dir, file_wd = self._by_dir, self._file_wd
        return self.complete and all(d in by_dir for d in dirs) and all(f in file_wd for f in files)

    def _touch(self, rel: str, mask: int) -> None:
        touched = self.touched
        if touched is not None:
            touched[rel] = touched.get(rel, 0) | mask

    def take_touched(self) -> dict[str, int]:
        """The paths touched since the last call (see :attr:`touched`), forgotten here; from
        the first call on, every event read is kept. Reads the queue first."""
        self.read()
        out = self.touched or {}
        self.touched = {}
        return out

    def read(self) -> list[Event]:
        """Every queued event, without waiting. Sets :attr:`overflowed` on queue overflow.

        An event of a file's watch is given as one of its directory's, naming the file by each
        path it was watched at."""
        events: list[Event] = []
        while True:
            try:
                buf = os.read(self.fd, 1 << 16)
            except BlockingIOError:
                return events
            if not buf:
                return events
            offset = 0
            while offset + _HEADER.size <= len(buf):
                wd, mask, _cookie, length = _HEADER.unpack_from(buf, offset)
                offset += _HEADER.size
                name = name_of(buf[offset : offset + length].rstrip(b"\0"))
                offset += length
                if mask & IN_Q_OVERFLOW:
                    self.overflowed = True
                    continue
                rel_dir = self._by_wd.get(wd)
                if rel_dir is None:
                    paths = self._files.get(wd)
                    if paths is None:
                        continue
                    if mask & IN_IGNORED:  # its inode is gone
                        del self._files[wd]
                        for file_rel in paths:
                            if self._file_wd.get(file_rel) == wd:
                                del self._file_wd[file_rel]
                        _count_files(-1)
                        continue
                    for file_rel in paths:
                        self._touch(file_rel, mask)
                        head, _, base = file_rel.rpartition("/")
                        events.append((head, mask, base))
                    continue
                if mask & IN_IGNORED:
                    del self._by_wd[wd]
                    if self._by_dir.get(rel_dir) == wd:
                        del self._by_dir[rel_dir]
                    self._touch(rel_dir, mask)  # a directory's watch lost: not all is told
                    continue
                self._touch(f"{rel_dir}/{name}" if rel_dir and name else rel_dir or name, mask)
                events.append((rel_dir, mask, name))

    def close(self) -> None:
        """Release the instance and all its watches."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._by_wd.clear()
        self._by_dir.clear()
        self._file_wd.clear()
        self.complete = False
