"""Branch bookkeeping for runs: change lists, diffs, and branches rebuilt from the run store.

Used by the pipeline runner and by single prompts; kept outside :mod:`orchestrator.pipeline` so
that a prompt does not import the pipeline machinery (networkx alone costs ~0.15 s at start).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import structlog

from ..errors import ResumeConflict
from ..store import StoredChange
from ..vfs import (
    Branch,
    Change,
    ChangeSet,
    Conflict,
    Delete,
    ModeChange,
    Snapshot,
    Tree,
    WorkspaceChanged,
    Write,
    unified_diff,
)

ChangeKind = Literal["added", "modified", "deleted"]

log = structlog.get_logger(__name__)

__all__ = [
    "FINAL",
    "ResumeConflict",
    "change_kinds",
    "conflict_json",
    "diff_of",
    "rebuild_branch",
    "stored_changes",
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


def diff_of(branch: Branch, changes: ChangeSet | None = None) -> str:
    """The diff of the branch's own changes, or of ``changes`` relative to the workspace snapshot.

    Files changed in the workspace since the snapshot (their base is gone) are left out.
    """
    # the branch's own changes are against what it forked from, not the workspace
    source: Tree = branch.base if changes is None else branch.root
    changes = branch.changes if changes is None else changes
    try:
        return unified_diff(source, changes)
    except WorkspaceChanged as e:
        rest = ChangeSet.of({p: c for p, c in changes.items() if p not in e.paths})
        return unified_diff(source, rest)


def stored_changes(root: Tree, changes: Mapping[str, Change]) -> list[StoredChange]:
    """A branch's net changes (relative to the run's snapshot ``root``) for the run store.

    A file the user changed in the workspace during the run has lost its base: its change
    cannot be applied safely, so it is left out (with a warning) rather than stored.
    """
    out: list[StoredChange] = []
    moved: list[str] = []
    for path in sorted(changes):
        change = changes[path]
        try:
            base = root.digest(path) if root.exists(path) else None
        except WorkspaceChanged:
            moved.append(path)
            continue
        if isinstance(change, Write):
            out.append(StoredChange(path, "write", change.data, change.mode, base))
        elif isinstance(change, ModeChange):
            out.append(StoredChange(path, "mode", None, change.mode, base))
        else:
            out.append(StoredChange(path, "delete", None, None, base))
    if moved:
        log.warning("changed in the workspace during the run; not kept", files=moved)
    return out


def rebuild_branch(snapshot: Snapshot, name: str, changes: Sequence[StoredChange]) -> Branch:
    """A branch of ``snapshot`` holding ``changes``; refuses if their base files moved on."""
    moved = [
        c.path
        for c in changes
        if (snapshot.digest(c.path) if snapshot.exists(c.path) else None) != c.base_digest
    ]
    if moved:
        raise ResumeConflict(moved)
    branch = Branch.from_tree(snapshot, name)
    for c in changes:
        if c.kind == "write":
            assert c.data is not None
            branch.write(c.path, c.data, c.mode)
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
    """A conflict as ``--json`` output, reports and the run store show it."""
    return {
        "step": step,
        "path": conflict.path,
        "kind": conflict.kind,
        "branches": [conflict.ours_name, conflict.theirs_name],
        "base": _text(conflict.base),
        "ours": _text(conflict.ours),
        "theirs": _text(conflict.theirs),
        "resolution": resolution,
    }
