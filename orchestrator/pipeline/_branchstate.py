"""What a branch holds, compared and put back: the diffs kept for a step instance's record,
and a round's work (what changed since a kept state, and undoing a check's writes on disk).

Pure functions over :class:`~orchestrator.vfs.Branch` and
:class:`~orchestrator.vfs.Workdir`; :class:`~orchestrator.pipeline._branchio.BranchDirs` runs
the blocking ones in its worker threads.
"""

from __future__ import annotations

import os

from ..vfs import Branch, ChangeSet, Workdir
from .branches import diff_of

__all__ = ["branch_diffs", "changes_since", "state_of", "undo_writes"]


def branch_diffs(branch: Branch) -> tuple[ChangeSet, str, str]:
    """A branch's net changes, their diff against the run's base, and its own diff.

    The own diff is of the branch's changes against what it forked from (:func:`diff_of`);
    for a branch forked from the workspace with nothing undone that is the same diff, made once.
    """
    net = branch.net_changes()
    own = branch.changes
    if not net and not own:
        return net, "", ""
    run_diff = diff_of(branch, net)
    if branch.base is branch.root and net == own:
        return net, run_diff, run_diff
    return net, run_diff, diff_of(branch)


def state_of(branch: Branch) -> Branch:
    """A copy of ``branch``'s state now, to read back what it held (no watch, not forked)."""
    return Branch(f"{branch.name}~kept", branch.base, _changes=dict(branch.changes))


def changes_since(before: Branch, branch: Branch) -> str:
    """The diff of what ``branch`` changed since ``before`` (a :func:`state_of` copy of it):
    one round's work. Blocking."""
    old, new = dict(before.changes), dict(branch.changes)
    paths = sorted(p for p in old.keys() | new.keys() if old.get(p) != new.get(p))
    if not paths:
        return ""
    delta = Branch.from_tree(before.freeze(), f"{branch.name}~round")
    for path in paths:
        delta.set_state(path, branch.state(path))
    return diff_of(delta)


def undo_writes(workdir: Workdir, before: Branch) -> int:
    """Undo on disk and in the branch what changed in ``workdir`` since ``before`` was taken
    (with :func:`state_of`, right after a harvest); how many paths were put back. Blocking.

    A full harvest finds every path written, deleted or chmod-ed since; each is written back
    as ``before`` holds it, or deleted if it held none (``.gitignore`` files first: their rules
    decide what the others are). Files the ignore rules leave out of a branch are left alone,
    as every harvest leaves them. What a step's check writes in the branch directory is thus
    never taken as the agent's work, and costs a scan of the directory, not a copy of it.
    """
    report = workdir.harvest(full=True)
    touched = {
        *report.added,
        *report.modified,
        *report.deleted,
        *report.mode_changed,
        *report.ignored,
        *report.too_large,
    }
    for path in sorted(touched, key=lambda p: (p.rpartition("/")[2] != ".gitignore", p)):
        state = before.state(path)
        if state is not None:
            workdir.write(path, state.data, state.mode)
        elif os.path.lexists(workdir.path_of(path)):
            workdir.delete(path)
        else:
            workdir.branch.set_state(path, None)
    return len(touched)
