"""Read-only file trees: the :class:`Tree` protocol, in-memory trees and layers of changes.

Every branch has a base tree. The root of a chain of trees is a workspace :class:`Snapshot`
(:mod:`orchestrator.vfs.snapshot`) or a :class:`MemoryTree`; a :class:`Layer` is a frozen change
set over a parent tree (what a branch looked like when another branch forked from it, or a merge
result that a pipeline step forks from). A layer whose state came from more than its parent names
those trees (:attr:`Layer.origins`: what a merge merged, a branch's state when it was last
frozen); the history of a tree (:func:`history`) is everything its state came from, and merges
compare two sides against the nearest trees their histories share.
"""

from __future__ import annotations

import stat
from collections.abc import Callable, Iterable, Mapping, Set
from typing import Protocol, runtime_checkable

from attrs import define, field

from ._fileio import normalize_path
from .changes import Change, ChangeSet, Delete, FileState, ModeChange, Write
from .errors import PathNotFound, WorkspaceChanged
from .ignore import IgnoreMatcher, IgnoreRules

__all__ = [
    "ChangeSource",
    "Layer",
    "MemoryTree",
    "Tree",
    "ancestors",
    "came_from",
    "change_between",
    "compose",
    "history",
    "net_changes",
    "root_of",
]


@runtime_checkable
class Tree(Protocol):
    """A read-only tree of files addressed by branch paths (relative, ``/``-separated)."""

    @property
    def parent(self) -> Tree | None:
        """The tree this one is layered on; None for a root (snapshot or memory tree)."""
        ...

    @property
    def ignore(self) -> IgnoreMatcher:
        """The ignore rules of the root tree."""
        ...

    def paths(self) -> Set[str]:
        """Every file path in the tree."""
        ...

    def exists(self, path: str) -> bool:
        """Whether ``path`` is a file (or symlink) in the tree."""
        ...

    def digest(self, path: str) -> str | None:
        """The content hash of ``path``, None if absent."""
        ...

    def mode(self, path: str) -> int | None:
        """The mode of ``path`` (type and permission bits), None if absent."""
        ...

    def read(self, path: str) -> bytes:
        """The content of ``path``; :class:`PathNotFound` if absent."""
        ...

    def state(self, path: str) -> FileState | None:
        """Content and mode of ``path``, None if absent."""
        ...


class ChangeSource(Protocol):
    """Something whose changes can be applied or exported: a branch or a merge result."""

    @property
    def root(self) -> Tree:
        """The root tree (usually a workspace snapshot) the net changes are relative to."""
        ...

    def net_changes(self) -> ChangeSet:
        """All changes relative to :attr:`root`, with no-op changes dropped."""
        ...


def ancestors(tree: Tree) -> list[Tree]:
    """``tree`` and the trees below it, nearest first, ending with the root."""
    chain = [tree]
    while (parent := chain[-1].parent) is not None:
        chain.append(parent)
    return chain


def came_from(tree: Tree) -> tuple[Tree, ...]:
    """The trees ``tree``'s state came from: a layer's :attr:`~Layer.origins`, else its parent."""
    if isinstance(tree, Layer) and tree.origins:
        return tree.origins
    return () if tree.parent is None else (tree.parent,)


def history(tree: Tree) -> dict[int, Tree]:
    """``tree`` and every tree its state came from (:func:`came_from`, repeatedly), by id.

    In a fixed order (depth first, origins in their order). A layer's parent is in the history
    of its origins.
    """
    seen: dict[int, Tree] = {}
    todo = [tree]
    while todo:
        current = todo.pop()
        if id(current) not in seen:
            seen[id(current)] = current
            todo.extend(reversed(came_from(current)))
    return seen


def root_of(tree: Tree) -> Tree:
    """The root of ``tree``'s chain."""
    return ancestors(tree)[-1]


def _combine(old: Change, new: Change) -> Change:
    if isinstance(new, ModeChange):
        if isinstance(old, Write):
            return Write(old.data, new.mode, old.digest)
        if isinstance(old, Delete):
            return old
    return new


def compose(tree: Tree, ancestor: Tree) -> dict[str, Change]:
    """The changes that turn ``ancestor`` into ``tree`` (which must be layered on it), raw."""
    layers: list[Layer] = []
    current: Tree | None = tree
    while current is not ancestor:
        if not isinstance(current, Layer):
            raise TypeError("the tree is not layered on the given ancestor")
        layers.append(current)
        current = current.parent
    out: dict[str, Change] = {}
    for layer in reversed(layers):
        for path, change in layer.changes.items():
            previous = out.get(path)
            out[path] = change if previous is None else _combine(previous, change)
    return out


def change_between(base: Tree, path: str, state: FileState | None) -> Change | None:
    """The change from ``base``'s version of ``path`` to ``state``; None when they are the same."""
    base_mode = base.mode(path)
    if state is None:
        return None if base_mode is None else Delete()
    if base_mode is None:
        return Write.from_state(state)
    # a file that becomes a symlink (or back) is new content even when the bytes agree: a mode
    # change only sets permission bits
    if base.digest(path) == state.digest and stat.S_IFMT(base_mode) == stat.S_IFMT(state.mode):
        return None if base_mode == state.mode else ModeChange(state.mode)
    return Write.from_state(state)


def net_changes(
    state_of: Callable[[str], FileState | None], paths: Iterable[str], ancestor: Tree
) -> ChangeSet:
    """The changes from ``ancestor`` to the states ``state_of`` gives for ``paths``, no-ops dropped.

    A path whose ancestor content is gone from the workspace is kept as a full write (or delete).
    """
    out: dict[str, Change] = {}
    for path in paths:
        state = state_of(path)
        try:
            change = change_between(ancestor, path, state)
        except WorkspaceChanged:
            change = Delete() if state is None else Write.from_state(state)
        if change is not None:
            out[path] = change
    return ChangeSet.of(out)


@define(eq=False)
class MemoryTree:
    """A root tree held in memory: for tests, scripts, and trees that are not on disk."""

    _files: dict[str, FileState] = field(alias="_files", repr=lambda f: f"<{len(f)} files>")
    ignore: IgnoreMatcher = field(
        factory=lambda: IgnoreMatcher.from_rules(IgnoreRules()), repr=False
    )

    @classmethod
    def from_files(cls, files: Mapping[str, bytes | FileState]) -> MemoryTree:
        """A tree of ``path -> bytes`` (mode 0o100644) or ``path -> FileState``."""
        return cls(
            {
                normalize_path(p): v if isinstance(v, FileState) else FileState(v)
                for p, v in files.items()
            }
        )

    @property
    def parent(self) -> None:
        """A memory tree is a root."""
        return None

    def paths(self) -> Set[str]:
        """Every file path."""
        return self._files.keys()

    def exists(self, path: str) -> bool:
        """Whether ``path`` is in the tree."""
        return path in self._files

    def state(self, path: str) -> FileState | None:
        """Content and mode of ``path``."""
        return self._files.get(path)

    def digest(self, path: str) -> str | None:
        """Content hash of ``path``."""
        state = self._files.get(path)
        return None if state is None else state.digest

    def mode(self, path: str) -> int | None:
        """Mode of ``path``."""
        state = self._files.get(path)
        return None if state is None else state.mode

    def read(self, path: str) -> bytes:
        """Content of ``path``."""
        state = self._files.get(path)
        if state is None:
            raise PathNotFound(path)
        return state.data


@define(eq=False)
class Layer:
    """A frozen change set over a parent tree, itself a tree."""

    parent: Tree = field(repr=False)
    changes: ChangeSet
    #: what the layer is: ``"fork of impl-claude"``, ``"merge of a+b"``
    label: str = ""
    #: the trees its state came from, when that is not (only) its parent: the trees a merge
    #: merged; a branch's state before it changed since a fork (:func:`history`)
    origins: tuple[Tree, ...] = field(default=(), repr=False)
    _paths: frozenset[str] | None = field(default=None, init=False, repr=False)

    @property
    def ignore(self) -> IgnoreMatcher:
        """The root's ignore rules."""
        return self.parent.ignore

    def paths(self) -> Set[str]:
        """Every file path (computed once)."""
        if self._paths is None:
            paths = set(self.parent.paths())
            for path, change in self.changes.items():
                if isinstance(change, Delete):
                    paths.discard(path)
                elif isinstance(change, Write):
                    paths.add(path)
            self._paths = frozenset(paths)
        return self._paths

    def exists(self, path: str) -> bool:
        """Whether ``path`` is in the tree."""
        change = self.changes.get(path)
        if change is None:
            return self.parent.exists(path)
        return not isinstance(change, Delete)

    def digest(self, path: str) -> str | None:
        """Content hash of ``path``."""
        change = self.changes.get(path)
        if isinstance(change, Write):
            return change.digest
        if isinstance(change, Delete):
            return None
        return self.parent.digest(path)

    def mode(self, path: str) -> int | None:
        """Mode of ``path``."""
        change = self.changes.get(path)
        if isinstance(change, Write | ModeChange):
            return change.mode
        if isinstance(change, Delete):
            return None
        return self.parent.mode(path)

    def read(self, path: str) -> bytes:
        """Content of ``path``."""
        change = self.changes.get(path)
        if isinstance(change, Write):
            return change.data
        if isinstance(change, Delete):
            raise PathNotFound(path)
        return self.parent.read(path)

    def state(self, path: str) -> FileState | None:
        """Content and mode of ``path``."""
        change = self.changes.get(path)
        if isinstance(change, Write):
            return change.state()
        if isinstance(change, Delete):
            return None
        state = self.parent.state(path)
        if state is not None and isinstance(change, ModeChange):
            return FileState(state.data, change.mode, state.digest)
        return state
