"""Three-way merge of branches, per file, against their common base.

For every path changed by either side: one side changed it -> take that side; both made the same
change -> take it (not a conflict); both changed text -> a line-level merge (``merge3``), and
overlapping hunks make a :class:`Conflict` holding base, ours and theirs with the hunks' line
ranges. Binary files (and symlinks) conflict on any difference; a deletion against a modification
conflicts; modes merge three-way on their own. Renames are a delete plus an add.

Two sides are compared against their nearest common ancestor: the nearest tree both histories
hold (:func:`~orchestrator.vfs.tree.history`: a branch's state comes from the tree it was
forked from, a merge's from the branches it merged), so what a shared ancestor did (a file it
created) is no change of either. Where no one tree is nearest (two merges of the same branches
that came out differently), the base is the merge of the nearest ones (a virtual merge base, as
in git's recursive merge).

Several branches merge closest first: the two whose nearest common ancestor is deepest (of
equal ones, the first in order) merge, their merge takes the place of the first, and so on. So
branches of one step merge against it before what is beside it joins, and branches all forked
from one tree fold in order: ``((b1 + b2) + b3) + ...``. In each merge, *ours* is the earlier
side, the merge so far (named ``b1+b2``), and *theirs* the later one (a branch, or a merge of
several). One conflict is one path: the branches that changed a path whose conflict was left
unresolved join that conflict (:attr:`Conflict.also_changed`) instead of making another. A
conflict is resolved by the strategy — ``fail`` (default: the file stays at the conflict's base
version in the result and the conflict is reported with all versions), ``ours``/``theirs`` (the
conflicting hunks take that side; non-overlapping changes of both still merge), ``union`` (both
sides' lines, ours first: for append-only files), or a resolver callable. Nothing is resolved
silently: every resolved conflict is listed in :attr:`MergeResult.resolved` and logged.
"""

from __future__ import annotations

import enum
import inspect
import itertools
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any, Literal, TypeAlias, cast

import attrs
from attrs import field, frozen
from merge3 import Merge3

from .._log import get_logger
from ._fileio import is_binary, is_symlink
from ._lines import LineMatcher
from .branch import Branch
from .changes import Change, ChangeSet, FileState, ModeChange, Write
from .errors import MergeConflictError, WorkspaceChanged
from .tree import (
    Layer,
    Tree,
    ancestors,
    came_from,
    change_between,
    compose,
    history,
    net_changes,
    root_of,
)
from .watch import ConflictWatch

__all__ = [
    "DELETE",
    "Conflict",
    "ConflictKind",
    "ConflictStrategy",
    "Hunk",
    "MergeResult",
    "Resolution",
    "Resolver",
    "common_base",
    "merge_branches",
    "merge_branches_async",
    "merge_file",
]

log = get_logger(__name__)

ConflictKind = Literal["content", "add/add", "binary", "delete/modify", "mode"]


class ConflictStrategy(enum.Enum):
    """Built-in ways to settle a conflict (a resolver callable is the other way)."""

    #: leave the file at its base version and report the conflict (the default)
    FAIL = "fail"
    #: conflicting hunks (or the whole file, when not text) take our side
    OURS = "ours"
    #: conflicting hunks (or the whole file, when not text) take their side
    THEIRS = "theirs"
    #: conflicting hunks keep both sides' lines, ours first (text only)
    UNION = "union"


class _Delete(enum.Enum):
    DELETE = "delete"


#: a resolver's answer meaning "the file is deleted"
DELETE = _Delete.DELETE

Resolution: TypeAlias = bytes | FileState | _Delete | None
"""A resolver's answer: content (mode merged, else ours), a full state, DELETE, or None to leave
the conflict unresolved."""

Resolver: TypeAlias = Callable[["Conflict"], Resolution | Awaitable[Resolution]]
"""A function, sync or async, that settles one :class:`Conflict`."""

Strategy: TypeAlias = (
    ConflictStrategy | Literal["fail", "ours", "theirs", "union"] | Callable[..., Any]
)


@frozen
class Hunk:
    """One overlapping region: 0-based, end-exclusive line ranges in base, ours and theirs."""

    base: tuple[int, int]
    ours: tuple[int, int]
    theirs: tuple[int, int]


@frozen
class Conflict:
    """Both sides changed one path in ways that do not combine. Versions are ``None`` if absent."""

    path: str
    kind: ConflictKind
    base: bytes | None = field(repr=False)
    ours: bytes | None = field(repr=False)
    theirs: bytes | None = field(repr=False)
    base_mode: int | None = None
    ours_mode: int | None = None
    theirs_mode: int | None = None
    #: the overlapping line ranges, for text conflicts
    hunks: tuple[Hunk, ...] = ()
    #: who "ours" and "theirs" are: the merge so far (``a+b`` after two branches) and the
    #: branch (or merge of branches of a nearer ancestor, ``c+d``) being merged in
    ours_name: str = "ours"
    theirs_name: str = "theirs"
    #: the other branches (or merges of several) that changed the path too, in merge order:
    #: (name, their version; None if they deleted it): those merged after this conflict was
    #: left unresolved, and the merge so far it came into if it was one between branches of a
    #: nearer ancestor. Their changes of the path are not in the merge either.
    also_changed: tuple[tuple[str, bytes | None], ...] = field(default=(), repr=False)

    def with_markers(self) -> bytes:
        """The file with diff3-style conflict markers (``<<<<<<<``, ``|||||||``, ``=======``)."""
        if self.kind not in ("content", "add/add"):
            raise ValueError(f"a {self.kind} conflict has no line-level rendering")
        return _merge_text(self.base or b"", self.ours or b"", self.theirs or b"", self)[0]

    def _clean_content(self) -> bytes:
        """The merged content of a conflict about modes only (its content merged cleanly)."""
        base, ours, theirs = self.base, self.ours or b"", self.theirs or b""
        if ours == theirs or theirs == base:
            return ours
        if ours == base:
            return theirs
        return _merge_text(base or b"", ours, theirs, None)[0]

    def resolve(self, strategy: ConflictStrategy) -> FileState | Conflict | None:
        """The outcome under a built-in strategy: a state, None (deleted), or self (unresolved)."""
        if strategy is ConflictStrategy.FAIL:
            return self
        mode = _merge_mode(self.base_mode, self.ours_mode, self.theirs_mode)
        if strategy is ConflictStrategy.UNION:
            if self.kind not in ("content", "add/add") or mode is None:
                return self
            text = _merge_text(self.base or b"", self.ours or b"", self.theirs or b"", "union")[0]
            return FileState(text, mode)
        side: Literal["ours", "theirs"] = "ours" if strategy is ConflictStrategy.OURS else "theirs"
        data, side_mode = (
            (self.ours, self.ours_mode) if side == "ours" else (self.theirs, self.theirs_mode)
        )
        if self.kind in ("content", "add/add"):
            text = _merge_text(self.base or b"", self.ours or b"", self.theirs or b"", side)[0]
            return FileState(text, mode if mode is not None else cast(int, side_mode))
        if self.kind == "mode" and side_mode is not None:
            return FileState(self._clean_content(), side_mode)
        if data is None or side_mode is None:
            return None
        return FileState(data, side_mode)


def _merge_mode(base: int | None, ours: int | None, theirs: int | None) -> int | None:
    """Three-way merge of modes; None when both changed them differently (or one is absent)."""
    if ours == theirs or theirs == base:
        return ours
    if ours == base:
        return theirs
    return None


def _merge_text(
    base: bytes,
    ours: bytes,
    theirs: bytes,
    pick: Literal["ours", "theirs", "union"] | Conflict | None,
) -> tuple[bytes, tuple[Hunk, ...]]:
    """Line-level merge; conflicting hunks per ``pick`` (a Conflict: render markers)."""
    b, o, t = base.splitlines(True), ours.splitlines(True), theirs.splitlines(True)
    m3 = Merge3(b, o, t, sequence_matcher=cast(Any, LineMatcher))
    out: list[bytes] = []
    hunks: list[Hunk] = []
    for region in m3.merge_regions():
        what = region[0]
        if what == "unchanged":
            out.extend(b[region[1] : region[2]])
        elif what in ("a", "same"):
            out.extend(o[region[1] : region[2]])
        elif what == "b":
            out.extend(t[region[1] : region[2]])
        else:
            _, zs, ze, os_, oe, ts, te = cast(tuple[str, int, int, int, int, int, int], region)
            hunks.append(Hunk((zs, ze), (os_, oe), (ts, te)))
            if pick == "ours":
                out.extend(o[os_:oe])
            elif pick == "theirs":
                out.extend(t[ts:te])
            elif pick == "union":
                out.extend(_terminated(o[os_:oe]) if te > ts else o[os_:oe])
                out.extend(t[ts:te])
            elif isinstance(pick, Conflict):
                out.append(f"<<<<<<< {pick.ours_name}\n".encode())
                out.extend(_terminated(o[os_:oe]))
                out.append(b"||||||| base\n")
                out.extend(_terminated(b[zs:ze]))
                out.append(b"=======\n")
                out.extend(_terminated(t[ts:te]))
                out.append(f">>>>>>> {pick.theirs_name}\n".encode())
    return b"".join(out), tuple(hunks)


def _terminated(lines: list[bytes]) -> list[bytes]:
    """``lines`` with a newline added to the last one if it lacks one."""
    if lines and not lines[-1].endswith((b"\n", b"\r")):
        return [*lines[:-1], lines[-1] + b"\n"]
    return lines


def merge_file(
    path: str,
    base: FileState | None,
    ours: FileState | None,
    theirs: FileState | None,
    *,
    ours_name: str = "ours",
    theirs_name: str = "theirs",
) -> FileState | Conflict | None:
    """Three-way merge of one path: the merged state, None (deleted), or a :class:`Conflict`."""

    def same(x: FileState | None, y: FileState | None) -> bool:
        return x is None if y is None else y.same_as(x)

    if same(ours, theirs) or same(theirs, base):
        return ours
    if same(ours, base):
        return theirs

    def conflict(kind: ConflictKind, hunks: tuple[Hunk, ...] = ()) -> Conflict:
        return Conflict(
            path,
            kind,
            None if base is None else base.data,
            None if ours is None else ours.data,
            None if theirs is None else theirs.data,
            None if base is None else base.mode,
            None if ours is None else ours.mode,
            None if theirs is None else theirs.mode,
            hunks,
            ours_name,
            theirs_name,
        )

    if ours is None or theirs is None:
        return conflict("delete/modify")
    mode = _merge_mode(None if base is None else base.mode, ours.mode, theirs.mode)
    if ours.digest == theirs.digest or (base is not None and theirs.digest == base.digest):
        data: bytes | None = ours.data
    elif base is not None and ours.digest == base.digest:
        data = theirs.data
    else:
        data = None
    if data is None:
        texts = [ours.data, theirs.data] + ([] if base is None else [base.data])
        if any(is_binary(x) for x in texts) or is_symlink(ours.mode) or is_symlink(theirs.mode):
            return conflict("binary")
        merged, hunks = _merge_text(
            b"" if base is None else base.data, ours.data, theirs.data, None
        )
        if hunks:
            return conflict("content" if base is not None else "add/add", hunks)
        data = merged
    if mode is None:
        return conflict("mode")
    return FileState(data, mode)


def common_base(branches: Sequence[Branch]) -> Tree:
    """The nearest tree on every branch's chain (its state frozen, then its bases).

    What the merge of the branches is layered on (:attr:`MergeResult.base`); each step of the
    merge compares against the nearest common ancestor of its two sides, which may be nearer.
    """
    return _shared([b.freeze() for b in branches])


def _shared(trees: Sequence[Tree]) -> Tree:
    """The nearest tree on every tree's chain (its parents)."""
    chains = [ancestors(t) for t in trees]
    others = [{id(t) for t in chain} for chain in chains[1:]]
    for tree in chains[0]:
        if all(id(tree) in ids for ids in others):
            return tree
    raise ValueError("the branches do not descend from a common tree")


@frozen
class MergeResult:
    """The outcome of a merge: merged changes over the common base, and what conflicted."""

    #: the tree the merge is layered on: the nearest on every merged branch's chain
    #: (:func:`common_base`)
    base: Tree
    #: the cleanly merged (or resolved) changes, relative to :attr:`base`
    changes: ChangeSet
    #: unresolved conflicts; their paths stay at their conflict's base version
    conflicts: tuple[Conflict, ...] = ()
    #: conflicts the strategy resolved (reported, never silent)
    resolved: tuple[Conflict, ...] = ()
    #: the names of the merged branches, in merge order
    sources: tuple[str, ...] = ()
    #: paths several branches changed whose content at the base is gone from the workspace
    #: (it changed there before a branch kept it): merged without a base, as if each side had
    #: added the file (the same version, else an ``add/add`` conflict)
    base_gone: tuple[str, ...] = ()
    #: the merged branches' states, frozen (:meth:`Branch.freeze`), in merge order: the
    #: history of :meth:`tree`, so merging what forks from it compares against them
    merged: tuple[Tree, ...] = field(default=(), repr=False)
    # one tree for every fork: branches forked from this merge (a fan-out after it) then share
    # it as their base, and merging them compares against it, not against :attr:`base`, where
    # what the merge brought in would be a change of each side
    _tree: Layer = field(
        init=False,
        eq=False,
        repr=False,
        default=attrs.Factory(
            lambda self: Layer(
                self.base, self.changes, f"merge of {'+'.join(self.sources)}", self.merged
            ),
            takes_self=True,
        ),
    )

    @property
    def ok(self) -> bool:
        """Whether no conflict is left."""
        return not self.conflicts

    @property
    def root(self) -> Tree:
        """The root tree (workspace snapshot)."""
        return root_of(self.base)

    def tree(self) -> Layer:
        """The merged tree: :attr:`changes` over :attr:`base` (the same one each time)."""
        return self._tree

    def net_changes(self) -> ChangeSet:
        """All merged changes relative to :attr:`root`, no-ops dropped."""
        tree = self.tree()
        return net_changes(tree.state, compose(tree, self.root).keys(), self.root)

    def fork(
        self, name: str, *, watch: ConflictWatch | None = None, allow_conflicts: bool = False
    ) -> Branch:
        """A new branch starting from the merged tree (a pipeline step after its parents).

        Every fork shares that tree, so merging forks of one merge compares against it.

        Raises :class:`MergeConflictError` when conflicts are left, unless ``allow_conflicts``
        (then the conflicted files are at their base version).
        """
        if self.conflicts and not allow_conflicts:
            raise MergeConflictError(self.conflicts)
        # the base itself when nothing came of the merge but it (no history is lost)
        plain = not self.changes and all(t is self.base for t in self.merged)
        return Branch.from_tree(self.base if plain else self.tree(), name, watch=watch)


def _strategy(strategy: Strategy) -> ConflictStrategy | Callable[..., Any]:
    if isinstance(strategy, ConflictStrategy) or callable(strategy):
        return strategy
    return ConflictStrategy(strategy)


def _state_in(base: Tree, changes: Mapping[str, Change], path: str) -> FileState | None:
    change = changes.get(path)
    if change is None or isinstance(change, ModeChange):
        state = base.state(path)
        if state is not None and isinstance(change, ModeChange):
            return FileState(state.data, change.mode, state.digest)
        return state
    return change.state() if isinstance(change, Write) else None


def _from_resolution(conflict: Conflict, answer: Resolution) -> FileState | Conflict | None:
    if answer is None:
        return conflict
    if answer is DELETE:
        return None
    if isinstance(answer, FileState):
        return answer
    if isinstance(answer, bytes | bytearray):
        mode = _merge_mode(conflict.base_mode, conflict.ours_mode, conflict.theirs_mode)
        fallback = conflict.ours_mode or conflict.theirs_mode or conflict.base_mode
        return FileState(bytes(answer), mode if mode is not None else cast(int, fallback))
    raise TypeError(f"a resolver returned {type(answer).__name__}, not bytes/FileState/DELETE/None")


@attrs.define
class _Side:
    """Branches merged so far: their merged tree, its history and the conflicts on the way."""

    #: the branches' names and frozen states, in merge order
    names: tuple[str, ...]
    trees: tuple[Tree, ...]
    tree: Tree
    seen: dict[int, Tree]
    #: unresolved conflicts, one per path; their paths hold their conflict's base version
    conflicts: list[Conflict] = attrs.Factory(list)
    resolved: list[Conflict] = attrs.Factory(list)
    #: a merge's changes over its tree's parent, as they were made (copied cheaply)
    own: dict[str, Change] | None = None
    #: paths merged without a base: its content is gone from the workspace
    gone: list[str] = attrs.Factory(list)

    @classmethod
    def of(cls, name: str, tree: Tree) -> _Side:
        return cls((name,), (tree,), tree, history(tree))

    @property
    def name(self) -> str:
        return "+".join(self.names)


_Merge = Generator[Conflict, Resolution, _Side]


def _changes_from(base: Tree, tree: Tree) -> ChangeSet:
    """The changes from ``base`` to ``tree`` (two trees of one root), no-ops dropped."""
    if isinstance(tree, Layer) and tree.parent is base:
        # a branch's frozen state or a merge so far, over its base: holds no no-op changes
        return tree.changes
    near = _shared([base, tree])
    return net_changes(tree.state, compose(tree, near).keys() | compose(base, near).keys(), base)


def _changes_of(base: Tree, side: _Side) -> Mapping[str, Change]:
    """The changes from ``base`` to ``side``'s tree."""
    tree = side.tree
    if side.own is not None and isinstance(tree, Layer) and tree.parent is base:
        return side.own
    return _changes_from(base, tree)


def _nearest(ours: dict[int, Tree], theirs: dict[int, Tree]) -> list[Tree]:
    """The nearest trees both histories hold: none of them came from another."""
    common = {i: t for i, t in theirs.items() if i in ours}
    if not common:
        raise ValueError("the branches do not descend from a common tree")
    # ``common`` holds every tree its trees came from: the nearest ones no tree there came from
    before = {id(t) for tree in common.values() for t in came_from(tree)}
    return [t for i, t in common.items() if i not in before]


def _merge_base(nearest: list[Tree]) -> Tree:
    """The tree to compare two sides against: their nearest common ancestor.

    If several are nearest (none came from another), their merge: its conflicts stay at their
    base versions, so both sides' changes of such a path are compared again (as git does).
    """
    if len(nearest) == 1:
        return nearest[0]
    virtual = _fold(
        [_Side.of(f"base {i}", t) for i, t in enumerate(nearest)], ConflictStrategy.FAIL
    )
    try:
        next(virtual)
    except StopIteration as done:
        return cast(_Side, done.value).tree
    raise AssertionError("a merge under `fail` asked for a resolution")


def _fold(sides: list[_Side], strategy: ConflictStrategy | Callable[..., Any]) -> _Merge:
    """Merge ``sides`` closest first, ours before theirs in their order; see the module docs."""
    depths: dict[int, int] = {}  # tree id -> how many trees its state came from

    def depth(tree: Tree) -> int:
        if id(tree) not in depths:
            depths[id(tree)] = len(history(tree))
        return depths[id(tree)]

    # (side, side) -> the depth of their nearest common ancestors, and they. Sides are numbered
    # (a merged side gets a new number): only the pairs of a new side are computed again.
    pairs: dict[tuple[int, int], tuple[int, list[Tree]]] = {}
    numbers = itertools.count()
    keys = [next(numbers) for _ in sides]
    while len(sides) > 1:
        # the deepest pair first; of equally deep ones the first in order (all of one base:
        # ``((s1 + s2) + s3) + ...``)
        i, j, deep, nearest = 0, 1, -1, []
        for a, b in itertools.combinations(range(len(sides)), 2):
            if (keys[a], keys[b]) not in pairs:
                common = _nearest(sides[a].seen, sides[b].seen)
                pairs[keys[a], keys[b]] = (max(depth(t) for t in common), common)
            pair_depth, common = pairs[keys[a], keys[b]]
            if pair_depth > deep:
                i, j, deep, nearest = a, b, pair_depth, common
        sides[i] = yield from _merge_two(sides[i], sides[j], _merge_base(nearest), strategy)
        keys[i] = next(numbers)
        del sides[j], keys[j]
    return sides[0]


def _merge_two(
    ours: _Side, theirs: _Side, base: Tree, strategy: ConflictStrategy | Callable[..., Any]
) -> _Merge:
    """``theirs`` merged into ``ours`` against ``base``, per path."""
    ours_set = _changes_of(base, ours)
    side = _changes_of(base, theirs)
    out = dict(ours_set)
    conflicts = list(ours.conflicts)
    resolved = [*ours.resolved, *theirs.resolved]
    gone = [*ours.gone, *theirs.gone]
    open_conflicts = {c.path: i for i, c in enumerate(conflicts)}  # path -> its index
    for conflict in theirs.conflicts:
        # one conflict per path: an earlier one of the path takes in this one's branches, or
        # this one takes in ours if ours changed the path (to something else than it keeps)
        path = conflict.path
        if path in open_conflicts:
            i = open_conflicts[path]
            joined = (
                (conflict.ours_name, conflict.ours),
                (conflict.theirs_name, conflict.theirs),
                *conflict.also_changed,
            )
            conflicts[i] = attrs.evolve(
                conflicts[i], also_changed=(*conflicts[i].also_changed, *joined)
            )
            continue
        ours_state, kept = _state_in(base, ours_set, path), _state_in(base, side, path)
        if path in ours_set and not (
            ours_state is None if kept is None else kept.same_as(ours_state)
        ):
            version = None if ours_state is None else ours_state.data
            conflict = attrs.evolve(
                conflict, also_changed=((ours.name, version), *conflict.also_changed)
            )
        open_conflicts[path] = len(conflicts)
        conflicts.append(conflict)
        if path in side:
            out[path] = side[path]
        else:
            out.pop(path, None)
    theirs_open = {c.path for c in theirs.conflicts}
    for path in sorted(side):
        if path in theirs_open:
            continue
        if path not in open_conflicts and path not in ours_set:
            out[path] = side[path]
            continue
        theirs_state = _state_in(base, side, path)
        if path in open_conflicts:
            # Already unresolved (there is no "merge so far" of this path to merge into):
            # theirs joins that conflict, so one conflicting path stays one conflict.
            i = open_conflicts[path]
            version = None if theirs_state is None else theirs_state.data
            also = (*conflicts[i].also_changed, (theirs.name, version))
            conflicts[i] = attrs.evolve(conflicts[i], also_changed=also)
            continue
        try:
            base_state = base.state(path)
        except WorkspaceChanged:
            # the workspace no longer holds it and no branch kept it: there is no common
            # version to merge against, so each side is whole (never raised: a run that
            # meets this still ends with its outcome)
            base_state = None
            gone.append(path)
        outcome = merge_file(
            path,
            base_state,
            _state_in(base, ours_set, path),
            theirs_state,
            ours_name=ours.name,
            theirs_name=theirs.name,
        )
        if isinstance(outcome, Conflict):
            conflict = outcome
            if isinstance(strategy, ConflictStrategy):
                outcome = conflict.resolve(strategy)
            else:
                outcome = _from_resolution(conflict, (yield conflict))
            if isinstance(outcome, Conflict):
                open_conflicts[path] = len(conflicts)
                conflicts.append(conflict)
                out.pop(path, None)
                continue
            resolved.append(conflict)
            # the caller gets it in the merge's result (a run reports it as an event and in
            # its result): a trace here, not a warning said a second time
            log.debug(
                "merge conflict resolved by strategy",
                path=path,
                kind=conflict.kind,
                ours=ours.name,
                theirs=theirs.name,
                strategy=strategy.value if isinstance(strategy, ConflictStrategy) else "resolver",
            )
        change = change_between(base, path, outcome)
        if change is None:
            out.pop(path, None)
        else:
            out[path] = change
    return _Side(
        (*ours.names, *theirs.names),
        (*ours.trees, *theirs.trees),
        Layer(base, ChangeSet.of(out)),
        {**ours.seen, **theirs.seen},
        conflicts,
        resolved,
        out,
        gone,
    )


def _merge(
    branches: Sequence[Branch], strategy: ConflictStrategy | Callable[..., Any]
) -> Generator[Conflict, Resolution, MergeResult]:
    """The merge of ``branches`` (their frozen states), its conflicts logged."""
    if not branches:
        raise ValueError("nothing to merge")
    sides = [_Side.of(b.name, b.freeze()) for b in branches]
    base = _shared([side.tree for side in sides])
    merged = yield from _fold(sides, strategy)
    tree = merged.tree
    # layered on the tree every branch's chain holds: usually the last merge's base already
    if isinstance(tree, Layer) and tree.parent is base and len(branches) > 1:
        changes = tree.changes
    else:
        changes = _changes_from(base, tree)
    # debug: a caller reports its conflicts (a run's progress, its result); a warning here
    # would say each one a second time
    for conflict in merged.conflicts:
        log.debug(
            "merge conflict",
            path=conflict.path,
            kind=conflict.kind,
            ours=conflict.ours_name,
            theirs=conflict.theirs_name,
            also_changed=[name for name, _ in conflict.also_changed],
        )
    return MergeResult(
        base,
        changes,
        tuple(merged.conflicts),
        tuple(merged.resolved),
        merged.names,
        merged=merged.trees,
        base_gone=tuple(sorted(set(merged.gone))),
    )


def merge_branches(branches: Sequence[Branch], *, strategy: Strategy = "fail") -> MergeResult:
    """Merge ``branches``, closest first, each two against their nearest common ancestor.

    See the module docs.

    ``strategy`` is a :class:`ConflictStrategy`, its name, or a synchronous resolver (use
    :func:`merge_branches_async` for an async one). Reading base files may raise
    :class:`~orchestrator.vfs.errors.WorkspaceChanged`.
    """
    how = _strategy(strategy)
    fold = _merge(branches, how)
    try:
        conflict = next(fold)
        while True:
            answer = cast(Callable[..., Any], how)(conflict)
            if inspect.isawaitable(answer):
                if inspect.iscoroutine(answer):
                    answer.close()
                raise TypeError("an async resolver needs merge_branches_async")
            conflict = fold.send(answer)
    except StopIteration as done:
        return cast(MergeResult, done.value)


async def merge_branches_async(
    branches: Sequence[Branch], *, strategy: Strategy = "fail"
) -> MergeResult:
    """:func:`merge_branches` accepting an async (or sync) resolver."""
    how = _strategy(strategy)
    fold = _merge(branches, how)
    try:
        conflict = next(fold)
        while True:
            answer = cast(Callable[..., Any], how)(conflict)
            if inspect.isawaitable(answer):
                answer = await answer
            conflict = fold.send(answer)
    except StopIteration as done:
        return cast(MergeResult, done.value)
