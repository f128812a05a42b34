"""The workspace (the user's directory) and lazy snapshots of it.

A :class:`Snapshot` walks the workspace once and records, per file, only what ``lstat`` says
(size, mtime in ns, mode, inode): no file is read up front, so snapshotting a large tree costs one
``stat`` per file. Content hashes are computed on demand (:meth:`Snapshot.digest`,
:meth:`Snapshot.read`), and every read re-checks the stat so that content read later is provably
the content the snapshot saw; when it is not, :class:`~orchestrator.vfs.errors.WorkspaceChanged`
says so. Files modified within :data:`RACY_WINDOW_NS` of the snapshot (their mtime cannot tell a
later change made in the same clock tick) are hashed at snapshot time instead, and are always
compared by content afterwards.

What the run learns of a file while the workspace still holds it stays known when the workspace
file changes later: a checkout that copies a file records the hash of the bytes it copied
(:meth:`Snapshot.record_digest`), and the content of a file a branch writes is kept
(:meth:`Snapshot.keep`: read from the workspace, or from a branch's untouched copy), so diffs and
patches show the change against it. What is kept is of the size of what the run writes, and
never a file over :data:`~orchestrator.vfs._fileio.LARGE_FILE_SIZE` (diffs and patches do not
show such a file's lines). A hash is taken as the file streams by: a file of any size is hashed
without being held.

Nothing here writes to the workspace: the only writer is :func:`orchestrator.vfs.apply_changes`.
"""

from __future__ import annotations

import errno
import os
import stat
import time
from collections.abc import Iterable, Iterator, Set
from pathlib import Path

from attrs import define, field, frozen

from .._log import get_logger
from .._names import name_bytes
from ._fileio import LARGE_FILE_SIZE, PATH_MAX, SYMLINK_MODE, digest, digest_fd, normalize_mode
from .changes import FileState
from .errors import PathNotFound, PathRefused, WorkspaceChanged
from .ignore import IgnoreMatcher, IgnoreRules

__all__ = ["RACY_WINDOW_NS", "Snapshot", "StatInfo", "Workspace", "walk"]

log = get_logger(__name__)

#: a file whose mtime is this close to the moment its stat was recorded is compared by content
RACY_WINDOW_NS = 1_000_000_000


@frozen
class StatInfo:
    """What a snapshot records about a file: enough to tell, cheaply, that it has not changed."""

    #: size in bytes
    size: int
    #: modification time, ns since the epoch
    mtime_ns: int
    #: type and permission bits (``0o100644``, ``0o100755``, ``0o120777``)
    mode: int
    #: inode number (a file replaced by another has a new one)
    ino: int

    @classmethod
    def from_stat(cls, st: os.stat_result) -> StatInfo:
        """The record for an ``lstat``/``fstat`` result."""
        return cls(st.st_size, st.st_mtime_ns, normalize_mode(st.st_mode), st.st_ino)


def walk(
    root: str, matcher: IgnoreMatcher, *, load_rules: bool
) -> Iterator[tuple[str, os.stat_result]]:
    """Every non-ignored regular file and symlink under ``root`` as ``(rel_path, lstat)``.

    With ``load_rules`` each directory's ``.gitignore`` is added to ``matcher`` before its entries
    are judged. Ignored directories are not descended into; other file types are skipped, and so
    are directories that cannot be opened, but one whose path is too long for the system to look
    up (:data:`~orchestrator.vfs._fileio.PATH_MAX`) raises :class:`PathRefused`.
    """
    flags = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
    root_fd = os.open(root, flags)
    try:
        stack = [""]
        while stack:
            parent = stack.pop()
            try:
                # Through a directory fd, each entry's stat is a one-component fstatat.
                fd = os.open(parent, flags, dir_fd=root_fd) if parent else os.dup(root_fd)
            except OSError as e:
                if e.errno == errno.ENAMETOOLONG:
                    # nothing could read, copy or apply what it holds: refused, not left out
                    raise PathRefused(
                        parent, f"a directory path too long for the system ({PATH_MAX - 1} bytes)"
                    ) from e
                log.warning("directory skipped", path=parent, error=str(e))
                continue
            try:
                with os.scandir(fd) as it:
                    entries = list(it)
                if load_rules and any(e.name == ".gitignore" for e in entries):
                    matcher.load_dir(root, parent)
                for entry in entries:
                    name = entry.name
                    rel = f"{parent}/{name}" if parent else name
                    if entry.is_dir(follow_symlinks=False):
                        if not matcher.ignored(rel, parent, name, True):
                            stack.append(rel)
                    elif (entry.is_file(follow_symlinks=False) or entry.is_symlink()) and not (
                        matcher.ignored(rel, parent, name, False)
                    ):
                        try:
                            st = entry.stat(follow_symlinks=False)
                        except FileNotFoundError:
                            continue
                        yield rel, st
            finally:
                os.close(fd)
    finally:
        os.close(root_fd)


@frozen
class Workspace:
    """The user's directory (a git repository or not). Never written during a run."""

    #: absolute, symlink-free path of the directory
    root: str
    #: what is not part of the workspace
    rules: IgnoreRules = field(factory=IgnoreRules)

    @classmethod
    def open(
        cls,
        root: str | os.PathLike[str],
        *,
        extra_ignores: tuple[str, ...] = (),
        use_gitignore: bool = True,
    ) -> Workspace:
        """The workspace at ``root`` (which must be a directory).

        ``extra_ignores`` are gitignore-syntax patterns (e.g. ``("node_modules/", "*.log")``).
        """
        real = os.path.realpath(root)
        if not os.path.isdir(real):
            raise NotADirectoryError(f"workspace is not a directory: {root}")
        return cls(real, IgnoreRules(use_gitignore=use_gitignore, extra=tuple(extra_ignores)))

    @property
    def path(self) -> Path:
        """:attr:`root` as a :class:`~pathlib.Path`."""
        return Path(self.root)

    def git_dir(self) -> str | None:
        """The ``.git`` directory or file of the workspace root, if it is a git work tree."""
        candidate = os.path.join(self.root, ".git")
        return candidate if os.path.lexists(candidate) else None

    def contains(self, path: str | os.PathLike[str]) -> bool:
        """Whether ``path`` (resolved) is the workspace root or inside it."""
        real = os.path.realpath(path)
        return real == self.root or real.startswith(self.root.rstrip("/") + "/")

    def snapshot(self, *, tracked: Iterable[str] | None = None) -> Snapshot:
        """Walk the workspace and record the stat of every file that is not ignored.

        ``tracked``: the files known to be part of it whatever the patterns say (a tree
        shipped elsewhere): then no git repository is asked, nor read around it.
        """
        started = time.time_ns()
        matcher = IgnoreMatcher.from_rules(self.rules)
        if tracked is None:
            matcher.load_exclude(self.root)
            matcher.load_tracked(self.root)  # as in git, tracked files are never ignored
        else:
            matcher.set_tracked(frozenset(tracked))
        stats: dict[str, StatInfo] = {}
        for rel, st in walk(self.root, matcher, load_rules=True):
            stats[rel] = StatInfo.from_stat(st)
        snap = Snapshot(self, stats, matcher, started)
        racy = [p for p, s in stats.items() if s.mtime_ns >= started - RACY_WINDOW_NS]
        for path in racy:
            snap._settle(path)
        log.info(
            "workspace snapshot",
            root=self.root,
            files=len(stats),
            hashed_now=len(racy),
            seconds=round((time.time_ns() - started) / 1e9, 3),
        )
        return snap


@define(eq=False)
class Snapshot:
    """The state of a workspace at one moment, as stat records plus lazily computed hashes.

    A snapshot is a root :class:`~orchestrator.vfs.tree.Tree`. Reading content re-checks the
    file's stat (and, once known, its hash), so a snapshot never hands out content it did not see;
    content kept (:meth:`keep`) is read from memory (see the module docs).
    """

    workspace: Workspace
    _stats: dict[str, StatInfo] = field(alias="_stats", repr=lambda s: f"<{len(s)} files>")
    ignore: IgnoreMatcher = field(repr=False)
    #: when the walk started (ns since the epoch)
    taken_ns: int = 0
    _digests: dict[str, str] = field(factory=dict, alias="_digests", repr=False)
    _racy: set[str] = field(factory=set, alias="_racy", repr=False)
    #: content seen while the workspace held it, verified against the hash
    _contents: dict[str, bytes] = field(factory=dict, alias="_contents", repr=False)

    @property
    def parent(self) -> None:
        """A snapshot is a root tree."""
        return None

    @property
    def root(self) -> str:
        """The workspace directory."""
        return self.workspace.root

    def paths(self) -> Set[str]:
        """Every file path recorded."""
        return self._stats.keys()

    def __len__(self) -> int:
        return len(self._stats)

    def exists(self, path: str) -> bool:
        """Whether ``path`` was a file (or symlink) at snapshot time."""
        return path in self._stats

    def stat(self, path: str) -> StatInfo:
        """The recorded stat of ``path``."""
        try:
            return self._stats[path]
        except KeyError:
            raise PathNotFound(path) from None

    def mode(self, path: str) -> int | None:
        """Mode of ``path`` at snapshot time."""
        info = self._stats.get(path)
        return None if info is None else info.mode

    def known_digest(self, path: str) -> str | None:
        """The hash of ``path`` if it was computed already (never reads)."""
        return self._digests.get(path)

    def has_content(self, path: str) -> bool:
        """Whether the content of ``path`` is kept (a read needs no workspace file)."""
        return path in self._contents

    def record_digest(self, path: str, digest: str) -> None:
        """Record the hash of ``path``'s content, read elsewhere under its recorded stat.

        A checkout that copies the file hashes what it copied: the snapshot then knows the
        file's hash even if the workspace file changes before anything else reads it. Raises
        :class:`WorkspaceChanged` when another hash is known (other content under the same stat).
        """
        if self._digests.setdefault(path, digest) != digest:
            raise WorkspaceChanged([path])

    def keep(self, path: str, data: bytes | None = None) -> bool:
        """Keep the content of ``path`` in memory: reads no longer need the workspace file.

        ``data`` is a copy's content (a branch's untouched copy), kept if its hash is the one
        known for ``path``; without it the workspace file is read now, unless it changed. For
        the files a branch writes: diffs and patches show the change against their content
        even once the workspace file changed. Returns whether the content is kept.
        """
        if path in self._contents:
            return True
        info = self._stats.get(path)
        if info is None or info.size > LARGE_FILE_SIZE:
            return False
        if data is None:
            try:
                data = self.read(path)
            except WorkspaceChanged:
                return False
        else:
            known = self._digests.get(path)
            if known is None or digest(data) != known:
                return False
        self._contents[path] = data
        return True

    def is_racy(self, path: str) -> bool:
        """Whether ``path`` must be compared by content (it changed too close to the snapshot)."""
        return path in self._racy

    def digest(self, path: str) -> str | None:
        """Hash of ``path`` at snapshot time (read and hashed on first use); None if absent."""
        if path not in self._stats:
            return None
        known = self._digests.get(path)
        if known is not None:
            return known
        info = self._stats[path]
        try:
            got, before, after = _hash_disk(os.path.join(self.root, path), info.mode)
        except OSError as e:
            raise WorkspaceChanged([path]) from e
        if not _held_still(before, after) or StatInfo.from_stat(before) != info:
            raise WorkspaceChanged([path])
        return self._digests.setdefault(path, got)

    def read(self, path: str) -> bytes:
        """Content of ``path`` at snapshot time: kept, or from the workspace, stat- and
        hash-checked."""
        info = self.stat(path)
        kept = self._contents.get(path)
        if kept is not None:
            return kept
        try:
            data, before, after = _read_disk(os.path.join(self.root, path), info.mode)
        except OSError as e:
            raise WorkspaceChanged([path]) from e
        racy = path in self._racy
        if not _held_still(before, after) or (not racy and StatInfo.from_stat(before) != info):
            raise WorkspaceChanged([path])
        got = digest(data)
        known = self._digests.setdefault(path, got)
        if known != got:
            raise WorkspaceChanged([path])
        return data

    def state(self, path: str) -> FileState | None:
        """Content and mode of ``path`` at snapshot time."""
        if path not in self._stats:
            return None
        data = self.read(path)
        return FileState(data, self._stats[path].mode, self._digests[path])

    def _settle(self, path: str) -> None:
        """Hash a racily-clean file now and record the stat it was read with."""
        full = os.path.join(self.root, path)
        for _ in range(3):
            try:
                mode = self._stats[path].mode
                hashed, before, after = _hash_disk(full, mode)
            except OSError:
                break
            if _held_still(before, after):
                self._stats[path] = StatInfo.from_stat(before)
                self._digests[path] = hashed
                self._racy.add(path)
                return
        # Still changing: leave it out rather than record a state that never existed.
        self._stats.pop(path, None)
        log.warning("file changing during snapshot, left out", path=path)

    def disk_differs(self, path: str) -> str | None:
        """Why the workspace's ``path`` no longer matches the snapshot, or None if it does.

        Compares by content when the hash is known (always for racily-clean files), by stat
        otherwise; a file whose stat changed and whose hash was never taken cannot be proven
        unchanged and counts as changed.
        """
        full = os.path.join(self.root, path)
        info = self._stats.get(path)
        if info is None:
            return "created in the workspace after the snapshot" if os.path.lexists(full) else None
        try:
            st = os.lstat(full)
        except (FileNotFoundError, NotADirectoryError):
            return "deleted in the workspace after the snapshot"
        same_stat = StatInfo.from_stat(st) == info
        known = self._digests.get(path)
        if known is None:
            return None if same_stat else "changed in the workspace after the snapshot"
        if normalize_mode(st.st_mode) != info.mode:
            return "mode changed in the workspace after the snapshot"
        try:
            hashed, _, _ = _hash_disk(full, info.mode)
        except OSError:
            return "unreadable in the workspace"
        return None if hashed == known else "changed in the workspace after the snapshot"


def _held_still(before: os.stat_result, after: os.stat_result) -> bool:
    """Whether a file did not change between two stats (atime aside: reading may update it)."""
    return (
        before.st_size == after.st_size
        and before.st_mtime_ns == after.st_mtime_ns
        and before.st_ctime_ns == after.st_ctime_ns
        and before.st_ino == after.st_ino
        and before.st_mode == after.st_mode
    )


def _hash_disk(full: str, mode: int) -> tuple[str, os.stat_result, os.stat_result]:
    """:func:`_read_disk`, the content hashed as it streams by instead of returned."""
    if mode == SYMLINK_MODE:
        data, before, after = _read_disk(full, mode)
        return digest(data), before, after
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise OSError(errno.EISDIR, "not a regular file", full)
        hashed = digest_fd(fd)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    return hashed, before, after


def _read_disk(full: str, mode: int) -> tuple[bytes, os.stat_result, os.stat_result]:
    """Read a file or symlink; its stat before and after the read.

    Raises OSError (``ELOOP`` when the kind of entry differs from ``mode``'s) on any failure.
    """
    if mode == SYMLINK_MODE:
        before = os.lstat(full)
        if not stat.S_ISLNK(before.st_mode):
            raise OSError(errno.EINVAL, "not a symlink any more", full)
        data = name_bytes(os.readlink(full))
        return data, before, os.lstat(full)
    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        before = os.fstat(fd)
        if not stat.S_ISREG(before.st_mode):
            raise OSError(errno.EISDIR, "not a regular file", full)
        chunks = []
        while chunk := os.read(fd, max(before.st_size + 1, 65536)):
            chunks.append(chunk)
        after = os.fstat(fd)
    finally:
        os.close(fd)
    return b"".join(chunks), before, after
