"""Branches: an isolated, writable view of the workspace for one agent session or pipeline step.

A :class:`Branch` has a base tree (a workspace snapshot, or a frozen layer: another branch as it
was when forked, or a merge of several branches) and its own change set. Reads see the branch's
changes over its base; writes only ever change the change set, which keeps no no-op entries (a
file written back to its base content is no longer changed).

Fork a branch from a snapshot (:meth:`Branch.from_tree`), from another branch (:meth:`Branch.fork`)
or from a merge (:meth:`MergeResult.fork <orchestrator.vfs.merge.MergeResult.fork>`). Once a branch
is materialized into a working directory, change it through the
:class:`~orchestrator.vfs.workdir.Workdir` (or on disk, then harvest) so the directory stays in
step.
"""

from __future__ import annotations

import stat
import threading
from collections.abc import Set

from attrs import define, field

from .._log import get_logger
from ._fileio import DEFAULT_MODE, normalize_mode, normalize_path
from .changes import Change, ChangeSet, Delete, FileState, ModeChange, Write
from .errors import PathNotFound, WorkspaceChanged
from .snapshot import Snapshot
from .tree import Layer, Tree, change_between, compose, net_changes, root_of
from .watch import ConflictWatch

__all__ = ["Branch"]

log = get_logger(__name__)


@define(eq=False)
class Branch:
    """A named, writable view: a base tree plus this branch's own changes.

    Thread-safe. With a :class:`~orchestrator.vfs.watch.ConflictWatch`, every changed path is
    reported to it while the branch is live (until :meth:`close`).
    """

    name: str
    base: Tree
    watch: ConflictWatch | None = None
    _changes: dict[str, Change] = field(factory=dict, alias="_changes")
    _closed: bool = field(default=False, alias="_closed")
    _frozen: Tree | None = field(default=None, alias="_frozen", repr=False)
    # the last tree :meth:`freeze` made: what the branch's state came from since
    _last_frozen: Tree | None = field(default=None, alias="_last_frozen", repr=False)
    _lock: threading.RLock = field(factory=threading.RLock, alias="_lock", repr=False)

    @classmethod
    def from_tree(cls, base: Tree, name: str, *, watch: ConflictWatch | None = None) -> Branch:
        """A new branch over ``base`` (a :class:`~orchestrator.vfs.snapshot.Snapshot` usually)."""
        if watch is not None:
            watch.register(name)
        return cls(name, base, watch)

    def fork(self, name: str, *, watch: ConflictWatch | None = None) -> Branch:
        """A new branch starting from this branch's current state (same watch by default).

        Forks taken while this branch is unchanged share one frozen base, so merging them later
        compares against exactly the fork point.
        """
        return Branch.from_tree(
            self.freeze(), name, watch=watch if watch is not None else self.watch
        )

    def freeze(self) -> Tree:
        """The branch's current state as a frozen tree: its base if it was never changed.

        The same tree until the branch changes: its forks share it, and merges compare against
        it (:func:`~orchestrator.vfs.merge.merge_branches`). A later one comes from it
        (:attr:`Layer.origins <orchestrator.vfs.tree.Layer.origins>`): merging the branch with
        a fork taken earlier compares against the fork point.
        """
        with self._lock:
            if self._frozen is None:
                changes = ChangeSet.of(dict(self._changes))
                last = self._last_frozen
                if last is not None:
                    self._frozen = Layer(self.base, changes, f"fork of {self.name}", (last,))
                elif changes:
                    self._frozen = Layer(self.base, changes, f"fork of {self.name}")
                else:
                    self._frozen = self.base
                if self._frozen is not self.base:
                    self._last_frozen = self._frozen
            return self._frozen

    # ---------------------------------------------------------------- reading

    @property
    def root(self) -> Tree:
        """The root tree (the workspace snapshot) this branch descends from."""
        return root_of(self.base)

    @property
    def changes(self) -> ChangeSet:
        """This branch's own changes, relative to :attr:`base`."""
        with self._lock:
            return ChangeSet.of(dict(self._changes))

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def net_changes(self, ancestor: Tree | None = None) -> ChangeSet:
        """All changes relative to ``ancestor`` (default: :attr:`root`), no-ops dropped.

        ``ancestor`` must be :attr:`base` or a tree below it.
        """
        ancestor = self.root if ancestor is None else ancestor
        with self._lock:
            own = set(self._changes)
        return net_changes(self.state, compose(self.base, ancestor).keys() | own, ancestor)

    def exists(self, path: str) -> bool:
        """Whether ``path`` is a file in the branch."""
        path = normalize_path(path)
        with self._lock:
            change = self._changes.get(path)
        if change is None:
            return self.base.exists(path)
        return not isinstance(change, Delete)

    def state(self, path: str) -> FileState | None:
        """Content and mode of ``path`` in the branch, None if absent."""
        path = normalize_path(path)
        with self._lock:
            change = self._changes.get(path)
        if isinstance(change, Write):
            return change.state()
        if isinstance(change, Delete):
            return None
        state = self.base.state(path)
        if state is not None and isinstance(change, ModeChange):
            return FileState(state.data, change.mode, state.digest)
        return state

    def read(self, path: str) -> bytes:
        """Content of ``path``: the branch's own version, else the base's."""
        state = self.state(path)
        if state is None:
            raise PathNotFound(path)
        return state.data

    def digest(self, path: str) -> str | None:
        """Content hash of ``path``, None if absent (hashing the base file on first use)."""
        path = normalize_path(path)
        with self._lock:
            change = self._changes.get(path)
        if isinstance(change, Write):
            return change.digest
        if isinstance(change, Delete):
            return None
        return self.base.digest(path)

    def mode(self, path: str) -> int | None:
        """Mode of ``path``, None if absent."""
        path = normalize_path(path)
        with self._lock:
            change = self._changes.get(path)
        if isinstance(change, Write | ModeChange):
            return change.mode
        if isinstance(change, Delete):
            return None
        return self.base.mode(path)

    def paths(self) -> Set[str]:
        """Every file path in the branch."""
        with self._lock:
            changes = dict(self._changes)
        paths = set(self.base.paths())
        for path, change in changes.items():
            if isinstance(change, Delete):
                paths.discard(path)
            elif isinstance(change, Write):
                paths.add(path)
        return paths

    # ---------------------------------------------------------------- writing

    def write(self, path: str, data: bytes, mode: int | None = None) -> Change | None:
        """Set the content of ``path`` (keeping its mode, or 0o100644 for a new file)."""
        path = normalize_path(path)
        if mode is None:
            mode = self.mode(path) or DEFAULT_MODE
        return self.set_state(path, FileState(bytes(data), normalize_mode(mode)))

    def delete(self, path: str) -> Change | None:
        """Delete ``path`` (:class:`PathNotFound` if it does not exist)."""
        path = normalize_path(path)
        if not self.exists(path):
            raise PathNotFound(path)
        return self.set_state(path, None)

    def chmod(self, path: str, mode: int) -> Change | None:
        """Change the permission bits of ``path`` (e.g. ``0o755``)."""
        state = self.state(path)
        if state is None:
            raise PathNotFound(path)
        kind = mode & 0o170000 or state.mode & 0o170000
        return self.set_state(path, FileState(state.data, kind | (mode & 0o7777), state.digest))

    def set_mode(self, path: str, mode: int) -> Change | None:
        """Give ``path`` the mode ``mode`` (same kind of file), its content unchanged.

        Unlike :meth:`chmod`, the content is never read: only hashes and modes are compared.
        """
        path = normalize_path(path)
        mode = normalize_mode(mode)
        with self._lock:
            own = self._changes.get(path)
        if isinstance(own, Write):
            return self.set_state(path, FileState(own.data, mode, own.digest))
        base_mode = None if isinstance(own, Delete) else self.base.mode(path)
        if base_mode is None:
            raise PathNotFound(path)
        if stat.S_IFMT(base_mode) != stat.S_IFMT(mode):
            raise ValueError(f"{path}: a new mode of another kind of file is new content")
        return self._record(path, None if mode == base_mode else ModeChange(mode))

    def revert(self, path: str) -> None:
        """Drop this branch's change to ``path`` (back to the base version)."""
        path = normalize_path(path)
        with self._lock:
            self._changes.pop(path, None)
            self._frozen = None

    def set_state(self, path: str, state: FileState | None) -> Change | None:
        """Make ``path`` hold ``state`` (None: absent); return the change now recorded for it."""
        path = normalize_path(path)
        try:
            change = change_between(self.base, path, state)
        except WorkspaceChanged:
            # The base content is gone from the workspace: keep the new state as a full write;
            # apply will report the outside change.
            change = Delete() if state is None else Write.from_state(state)
        return self._record(path, change)

    def _record(self, path: str, change: Change | None) -> Change | None:
        """Record ``change`` (None: none) as this branch's change to ``path``."""
        root = root_of(self.base)
        if (
            isinstance(change, Write | ModeChange)
            and isinstance(root, Snapshot)
            and root.exists(path)
        ):
            # the run's diffs and patch show this change against the workspace's version: keep
            # it while the workspace still holds it (if it already changed, they show the new
            # version whole). Not for a deletion: all old lines, and possibly a whole directory.
            root.keep(path)
        with self._lock:
            if self._closed:
                log.warning("change recorded on a closed branch", branch=self.name, path=path)
            if change is None:
                self._changes.pop(path, None)
            else:
                self._changes[path] = change
            self._frozen = None
        if change is not None and self.watch is not None:
            self.watch.touch(self.name, path)
        return change

    def close(self) -> None:
        """Mark the branch finished: it no longer counts for early warnings."""
        with self._lock:
            self._closed = True
        if self.watch is not None:
            self.watch.unregister(self.name)
