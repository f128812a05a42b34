"""Three-way merge of branches, per file, against their common base.

For every path changed by either side: one side changed it -> take that side; both made the same
change -> take it (not a conflict); both changed text -> a line-level merge (``merge3``), and
overlapping hunks make a :class:`Conflict` holding base, ours and theirs with the hunks' line
ranges. Binary files (and symlinks) conflict on any difference; a deletion against a modification
conflicts; modes merge three-way on their own. Renames are a delete plus an add.

Several branches merge by folding pairwise against the common base (the nearest tree their base
chains share): ``((b1 + b2) + b3) + ...``. In each step of the fold, *ours* is the merge so far
(named ``b1+b2``) and *theirs* is the branch being merged in. One conflict is one path: a branch
merged after a path's conflict was left unresolved joins that conflict
(:attr:`Conflict.also_changed`) instead of making another. A conflict is resolved by the
strategy — ``fail`` (default: the file stays at its base version in the result and the conflict
is reported with all versions), ``ours``/``theirs`` (the conflicting hunks take that side;
non-overlapping changes of both still merge), ``union`` (both sides' lines, ours first: for
append-only files), or a resolver callable. Nothing is resolved silently: every resolved
conflict is listed in :attr:`MergeResult.resolved` and logged.
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Awaitable, Callable, Generator, Sequence
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
from .tree import Layer, Tree, ancestors, change_between, compose, net_changes, root_of
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
    #: branch being merged in
    ours_name: str = "ours"
    theirs_name: str = "theirs"
    #: branches merged after this conflict was left unresolved that changed the path too, in
    #: merge order: (name, their version; None if they deleted it). Their changes of the path
    #: are not in the merge either.
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
    """The nearest tree shared by every branch's chain of bases."""
    chains = [ancestors(b.base) for b in branches]
    others = [{id(t) for t in chain} for chain in chains[1:]]
    for tree in chains[0]:
        if all(id(tree) in ids for ids in others):
            return tree
    raise ValueError("the branches do not descend from a common tree")


@frozen
class MergeResult:
    """The outcome of a merge: merged changes over the common base, and what conflicted."""

    #: the common base the merge was computed against
    base: Tree
    #: the cleanly merged (or resolved) changes, relative to :attr:`base`
    changes: ChangeSet
    #: unresolved conflicts; their paths stay at the base version in :attr:`changes`
    conflicts: tuple[Conflict, ...] = ()
    #: conflicts the strategy resolved (reported, never silent)
    resolved: tuple[Conflict, ...] = ()
    #: the names of the merged branches, in merge order
    sources: tuple[str, ...] = ()
    # one tree for every fork: branches forked from this merge (a fan-out after it) then share
    # it as their base, and merging them compares against it, not against :attr:`base`, where
    # what the merge brought in would be a change of each side
    _tree: Layer = field(
        init=False,
        eq=False,
        repr=False,
        default=attrs.Factory(
            lambda self: Layer(self.base, self.changes, f"merge of {'+'.join(self.sources)}"),
            takes_self=True,
        ),
    )
    #: paths several branches changed whose content at the base is gone from the workspace
    #: (it changed there before a branch kept it): merged without a base, as if each side had
    #: added the file (the same version, else an ``add/add`` conflict)
    base_gone: tuple[str, ...] = ()

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
        return Branch.from_tree(self.tree() if self.changes else self.base, name, watch=watch)


def _strategy(strategy: Strategy) -> ConflictStrategy | Callable[..., Any]:
    if isinstance(strategy, ConflictStrategy) or callable(strategy):
        return strategy
    return ConflictStrategy(strategy)


def _state_in(base: Tree, changes: ChangeSet, path: str) -> FileState | None:
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


_Fold = Generator[Conflict, Resolution, MergeResult]


def _fold(branches: Sequence[Branch], strategy: ConflictStrategy | Callable[..., Any]) -> _Fold:
    if not branches:
        raise ValueError("nothing to merge")
    base = common_base(branches)
    names = [b.name for b in branches]
    acc: dict[str, Change] = dict(branches[0].net_changes(base))
    open_conflicts: dict[str, int] = {}  # unresolved paths -> their index in ``conflicts``
    conflicts: list[Conflict] = []
    resolved: list[Conflict] = []
    gone: list[str] = []
    ours_name = names[0]
    for branch in branches[1:]:
        side = branch.net_changes(base)
        acc_set = ChangeSet.of(acc)
        for path in side:
            theirs = _state_in(base, side, path)
            if path in open_conflicts:
                # Already unresolved (there is no "merge so far" of this path to merge into):
                # this branch joins that conflict, so one conflicting path stays one conflict.
                i = open_conflicts[path]
                version = None if theirs is None else theirs.data
                also = (*conflicts[i].also_changed, (branch.name, version))
                conflicts[i] = attrs.evolve(conflicts[i], also_changed=also)
                continue
            if path not in acc:
                acc[path] = side[path]
                continue
            ours = _state_in(base, acc_set, path)
            try:
                base_state = base.state(path)
            except WorkspaceChanged:
                # the workspace no longer holds it and no branch kept it: there is no common
                # version to merge against, so each side is whole (never raised: a run that
                # meets this still ends with its outcome)
                base_state = None
                gone.append(path)
            outcome = merge_file(
                path, base_state, ours, theirs, ours_name=ours_name, theirs_name=branch.name
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
                    acc.pop(path, None)
                    continue
                resolved.append(conflict)
                # the caller gets it in the merge's result (a run reports it as an event and in
                # its result): a trace here, not a warning said a second time
                log.debug(
                    "merge conflict resolved by strategy",
                    path=path,
                    kind=conflict.kind,
                    ours=ours_name,
                    theirs=branch.name,
                    strategy=strategy.value
                    if isinstance(strategy, ConflictStrategy)
                    else "resolver",
                )
            change = change_between(base, path, outcome)
            if change is None:
                acc.pop(path, None)
            else:
                acc[path] = change
        ours_name = f"{ours_name}+{branch.name}"
    # debug: a caller reports its conflicts (a run's progress, its result); a warning here
    # would say each one a second time
    for conflict in conflicts:
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
        ChangeSet.of(acc),
        tuple(conflicts),
        tuple(resolved),
        tuple(names),
        tuple(sorted(set(gone))),
    )


def merge_branches(branches: Sequence[Branch], *, strategy: Strategy = "fail") -> MergeResult:
    """Merge ``branches`` (in order) against their common base; see the module docs.

    ``strategy`` is a :class:`ConflictStrategy`, its name, or a synchronous resolver (use
    :func:`merge_branches_async` for an async one). Reading base files may raise
    :class:`~orchestrator.vfs.errors.WorkspaceChanged`.
    """
    how = _strategy(strategy)
    fold = _fold(branches, how)
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
    fold = _fold(branches, how)
    try:
        conflict = next(fold)
        while True:
            answer = cast(Callable[..., Any], how)(conflict)
            if inspect.isawaitable(answer):
                answer = await answer
            conflict = fold.send(answer)
    except StopIteration as done:
        return cast(MergeResult, done.value)
