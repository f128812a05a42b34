"""Branch bookkeeping for runs: change lists, diffs, and branches rebuilt from the run store.

Used by the pipeline runner and by single prompts; kept outside :mod:`orchestrator.pipeline` so
that a prompt does not import the pipeline machinery (networkx alone costs ~0.15 s at start).
"""

from __future__ import annotations

import stat
from collections.abc import Mapping, Sequence, Set
from typing import Any, Literal

from .._log import get_logger
from .._names import name_json, name_of
from ..errors import ResumeConflict
from ..store import BASE_UNKNOWN, StoredChange
from ..vfs import (
    Branch,
    Change,
    ChangeSet,
    Conflict,
    Delete,
    ModeChange,
    Tree,
    WorkspaceChanged,
    Write,
    disk_digest,
    git_patch,
    large_paths,
    unified_diff,
)
from ..vfs.apply import dir_in_the_way

ChangeKind = Literal["added", "modified", "deleted"]

log = get_logger(__name__)

__all__ = [
    "FINAL",
    "ResumeConflict",
    "base_gone",
    "base_moved",
    "change_kinds",
    "conflict_json",
    "diff_of",
    "patch_left_out",
    "patch_of",
    "rebuild_branch",
    "stored_changes",
    "symlink_targets",
    "workspace_moved",
]


#: the change-set key of a run's final result (its merged sinks; a prompt's one branch)
FINAL = "(final)"


def change_kinds(base: Tree, changes: Mapping[str, Change]) -> tuple[tuple[str, ChangeKind], ...]:
    """``(path, added|modified|deleted)`` for each change relative to ``base``."""
    out: list[tuple[str, ChangeKind]] = []
    for path in sorted(changes):
        if isinstance(changes[path], Delete):
            out.append((path, "deleted"))
        else:
            out.append((path, "modified" if base.exists(path) else "added"))
    return tuple(out)


def symlink_targets(changes: Mapping[str, Change]) -> tuple[tuple[str, str], ...]:
    """``(path, target)`` for each change that leaves a symbolic link at its path."""
    return tuple(
        (path, name_of(change.data))
        for path, change in sorted(changes.items())
        if isinstance(change, Write) and stat.S_ISLNK(change.mode)
    )


def diff_of(branch: Branch, changes: ChangeSet | None = None) -> str:
    """The diff of the branch's own changes, or of ``changes`` relative to the workspace snapshot.

    A file whose base content is gone (see :func:`base_gone`) has its change shown whole, under
    a hunk header saying so (see :func:`~orchestrator.vfs.unified_diff`).
    """
    # the branch's own changes are against what it forked from, not the workspace
    source: Tree = branch.base if changes is None else branch.root
    changes = branch.changes if changes is None else changes
    return unified_diff(source, changes, base_gone="whole")


def patch_of(root: Tree, changes: ChangeSet) -> bytes:
    """A ``git apply``-able patch of ``changes`` relative to ``root``.

    A file whose content at the start of the run is gone (see :func:`base_gone`) has no base to
    patch, and a large file would be held whole in it: they are left out (with a warning,
    :func:`patch_left_out` names them); the run store keeps their changes, and :func:`diff_of`
    shows them (a large one by its sizes).
    """
    return git_patch(root, changes, base_gone="omit")


def patch_left_out(root: Tree, changes: Mapping[str, Change]) -> list[str]:
    """The paths of ``changes`` that :func:`patch_of` leaves out: a version is too large to
    patch (see :func:`~orchestrator.vfs.large_paths`), or their base content is gone (see
    :func:`base_gone`)."""
    large = set(large_paths(root, changes))
    small = {path: change for path, change in changes.items() if path not in large}
    return sorted(large.union(base_gone(root, small)))


def base_gone(root: Tree, changes: Mapping[str, Change]) -> list[str]:
    """The paths of ``changes`` whose content in ``root`` is gone: they changed in the workspace
    before the run kept what they held (a patch leaves them out, a diff shows them whole)."""
    gone: list[str] = []
    for path in sorted(changes):
        if root.exists(path):
            try:
                root.state(path)
            except WorkspaceChanged:
                gone.append(path)
    return gone


def stored_changes(root: Tree, changes: Mapping[str, Change]) -> list[StoredChange]:
    """A branch's net changes (relative to the run's snapshot ``root``) for the run store.

    Every change is kept with the digest of its base, so that an apply can check the workspace
    against it. A file the user changed in the workspace during the run keeps the digest the
    run copied or read it with; if the run never did before it changed, its base is
    :data:`~orchestrator.store.BASE_UNKNOWN`, which no content matches (an apply refuses it).
    A write that leaves a file's mode as it was records no mode (None): an apply then keeps the
    mode the file has when it is applied (a ``chmod`` made since the run stays); a mode the
    run set is recorded, and applied.
    """
    out: list[StoredChange] = []
    unknown: list[str] = []
    for path in sorted(changes):
        change = changes[path]
        try:
            base = root.digest(path) if root.exists(path) else None
        except WorkspaceChanged:
            base = BASE_UNKNOWN
            unknown.append(path)
        if isinstance(change, Write):
            out.append(
                StoredChange(path, "write", change.data, _new_mode(root, path, change), base)
            )
        elif isinstance(change, ModeChange):
            out.append(StoredChange(path, "mode", None, change.mode, base))
        else:
            out.append(StoredChange(path, "delete", None, None, base))
    if unknown:
        log.warning("changed in the workspace before the run copied or read them", files=unknown)
    return out


def _new_mode(root: Tree, path: str, change: Write) -> int | None:
    """The mode a write records: None when it keeps the regular file's mode it started from."""
    if stat.S_ISREG(change.mode) and root.exists(path) and root.mode(path) == change.mode:
        return None
    return change.mode


def base_moved(tree: Tree, changes: Sequence[StoredChange]) -> list[str]:
    """The paths of ``changes`` whose recorded base is not what ``tree`` holds now."""
    moved: list[str] = []
    for c in changes:
        if c.base_digest == BASE_UNKNOWN:
            moved.append(c.path)
            continue
        try:
            now = tree.digest(c.path) if tree.exists(c.path) else None
        except WorkspaceChanged:  # changing while we look
            moved.append(c.path)
            continue
        if now != c.base_digest:
            moved.append(c.path)
    return moved


def workspace_moved(
    root: str, changes: Sequence[StoredChange], *, deleted: Set[str] | None = None
) -> list[str]:
    """The paths of ``changes`` whose file in the workspace ``root`` is not, now, the base
    the run recorded for it (blocking: hashes those files, and only those). A new file where
    the workspace has a directory of files the changes delete (``deleted``: by default, those
    ``changes`` delete) is not one: an apply makes room for it, as
    :func:`~orchestrator.vfs.apply_changes` does."""
    moved: list[str] = []
    if deleted is None:
        deleted = {c.path for c in changes if c.kind == "delete"}
    for c in changes:
        if c.base_digest == BASE_UNKNOWN:
            moved.append(c.path)
            continue
        try:
            now = disk_digest(root, c.path)
        except OSError:  # cannot be read: not the base any more, as far as an apply can tell
            moved.append(c.path)
            continue
        if now == c.base_digest:
            continue
        if c.base_digest is None and dir_in_the_way(root, c.path, deleted) is None:
            continue
        moved.append(c.path)
    return moved


def rebuild_branch(snapshot: Tree, name: str, changes: Sequence[StoredChange]) -> Branch:
    """A branch of ``snapshot`` holding ``changes``; refuses if their base files moved on.

    ``snapshot`` is the workspace now (or another tree to check the recorded bases against).
    A write that recorded no mode keeps the file's mode in ``snapshot``.
    """
    moved = base_moved(snapshot, changes)
    if moved:
        raise ResumeConflict(moved)
    branch = Branch.from_tree(snapshot, name)
    for c in changes:
        if c.kind == "write":
            assert c.data is not None
            mode = c.mode
            if mode is None and not stat.S_ISREG(snapshot.mode(c.path) or stat.S_IFREG):
                # the run wrote a regular file; what took its place since is not one
                mode = stat.S_IFREG | 0o644
            branch.write(c.path, c.data, mode)
        elif c.kind == "mode":
            assert c.mode is not None
            branch.chmod(c.path, c.mode)
        else:
            branch.delete(c.path)
    return branch


def _text(data: bytes | None) -> str | None:
    if data is None:
        return None
    return data.decode("utf-8", "replace")


def conflict_json(step: str, conflict: Conflict, resolution: str) -> dict[str, Any]:
    """A conflict as ``--json`` output, reports and the run store show it.

    ``ours`` is the content of the merge so far (the instances merged before ``theirsLabel``,
    closest first then in fan-in order), labelled ``oursLabel``; ``theirs`` is the content of
    what is merged into it (an instance, or a merge of instances of a nearer ancestor: ``a+b``),
    labelled ``theirsLabel``; ``alsoChanged`` lists the other instances that changed the path
    too, whose changes an unresolved conflict leaves out. ``branches`` is every label.
    """
    also = [{"label": name, "content": _text(data)} for name, data in conflict.also_changed]
    return {
        "step": step,
        **name_json(conflict.path),
        "kind": conflict.kind,
        "branches": [conflict.ours_name, conflict.theirs_name, *(a["label"] for a in also)],
        "base": _text(conflict.base),
        "ours": _text(conflict.ours),
        "theirs": _text(conflict.theirs),
        "oursLabel": conflict.ours_name,
        "theirsLabel": conflict.theirs_name,
        "alsoChanged": also,
        "resolution": resolution,
    }
