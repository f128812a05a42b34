"""A minimal Linux inotify binding (ctypes) telling a harvest which paths may have changed.

Only an accelerator: the kernel queues an event, synchronously with the system call, for every
create, write, attribute change, delete and rename in a watched directory, so a harvest can
``stat`` just those paths instead of the whole tree. Whenever the queue overflows, a watch cannot
be added, or a directory is renamed, the caller falls back to a full ``stat`` scan. Writes through
a shared ``mmap`` produce no events; ask for a full harvest if an agent's tools write that way.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import struct
import sys
import weakref

from attrs import define, field

from .._names import name_bytes, name_of

__all__ = ["Event", "Inotify"]

IN_MODIFY = 0x00000002
IN_ATTRIB = 0x00000004
IN_CLOSE_WRITE = 0x00000008
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


def _close_quietly(fd: int) -> None:
    with contextlib.suppress(OSError):
        os.close(fd)


@define(eq=False)
class Inotify:
    """An inotify instance watching directories below one root (non-blocking)."""

    root: str
    fd: int
    _by_wd: dict[int, str] = field(factory=dict, alias="_by_wd")
    _by_dir: dict[str, int] = field(factory=dict, alias="_by_dir")
    _finalizer: weakref.finalize[[int], Inotify] | None = field(default=None, alias="_finalizer")
    overflowed: bool = False

    @classmethod
    def open(cls, root: str) -> Inotify | None:
        """A new instance, or None where inotify is unavailable (not Linux, instance limit)."""
        if _LIBC is None:
            return None
        fd = _LIBC.inotify_init1(_IN_NONBLOCK | _IN_CLOEXEC)
        if fd < 0:
            return None
        self = cls(root, fd)
        self._finalizer = weakref.finalize(self, _close_quietly, fd)
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
        self._by_wd[wd] = rel_dir
        self._by_dir[rel_dir] = wd
        return True

    def read(self) -> list[Event]:
        """Every queued event, without waiting. Sets :attr:`overflowed` on queue overflow."""
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
                    continue
                if mask & IN_IGNORED:
                    del self._by_wd[wd]
                    if self._by_dir.get(rel_dir) == wd:
                        del self._by_dir[rel_dir]
                    continue
                events.append((rel_dir, mask, name))

    def close(self) -> None:
        """Release the instance and all its watches."""
        if self._finalizer is not None:
            self._finalizer()
            self._finalizer = None
        self._by_wd.clear()
        self._by_dir.clear()
