"""The shared virtual filesystem: isolated branches of the user's workspace, merged safely.

Agents change files in two ways: through the client (``fs/write_text_file``) and behind its back
(their own tools, shell commands). The VFS captures both:

- a :class:`Workspace` is the user's directory, never written during a run; a :class:`Snapshot`
  records it cheaply (stat only, hashes on demand);
- a :class:`Branch` (one per agent session or pipeline step) is a base tree plus its own
  :class:`ChangeSet`; fork it from a snapshot, another branch, or a merge;
- :func:`materialize` gives a branch a real working directory (:class:`Workdir`, the agent's
  ``cwd``), and :meth:`Workdir.harvest` records what changed on disk into the branch;
- the ACP ``fs/*`` service over a branch lives with the agent side
  (:class:`orchestrator.agent.branchfs.BranchFileSystem`);
- :func:`merge_branches` merges branches three-way per file, reporting :class:`Conflict` values
  and resolving them only as the :class:`ConflictStrategy` says; a :class:`ConflictWatch` emits an
  :class:`EarlyWarning` as soon as two live branches touch the same path;
- :func:`apply_changes` is the only write to the user's disk, all-or-nothing with a journal
  (:func:`recover_applies` finishes or undoes an interrupted one, :func:`interrupted_applies`
  lists them without touching anything); :func:`unified_diff`,
  :func:`git_patch` and :func:`git_commit` export instead.

Typical use::

    ws = Workspace.open("~/project", extra_ignores=("node_modules/",))
    snap = ws.snapshot()                       # stat only; hashes on demand
    watch = ConflictWatch()                    # early warnings while branches run
    a = Branch.from_tree(snap, "claude", watch=watch)
    b = Branch.from_tree(snap, "codex", watch=watch)
    wd = materialize(a, state_dir / "branches" / "claude")   # the agent's cwd
    services = ClientServices(fs=BranchFileSystem(wd))         # agent.branchfs, per branch
    ...                                        # after every turn / terminal command:
    wd.harvest()                               # (or await wd.harvest_async())
    a.close(); b.close()
    result = merge_branches([a, b], strategy="fail")
    if result.ok:
        apply_changes(result, state_dir=state_dir)   # all-or-nothing, journaled
    else:
        for conflict in result.conflicts: ...  # base/ours/theirs, hunks, with_markers()

On start, call :func:`recover_applies` (``state_dir``) to finish or undo an apply a crash
interrupted. A pipeline step forks from its parents' merge: ``merge_branches(parents).fork(name)``.
"""

from __future__ import annotations

from ._fileio import NAME_MAX, PATH_MAX, CopyStats, check_path_limits, remove_tree
from .apply import (
    ApplyResult,
    InterruptedApply,
    OutsideChange,
    RecoveryReport,
    apply_changes,
    apply_changes_async,
    check_symlinks,
    disk_digest,
    interrupted_applies,
    recover_applies,
)
from .branch import Branch
from .changes import Change, ChangeSet, Delete, FileState, ModeChange, Write
from .checkout import materialize, materialize_async
from .errors import (
    ApplyError,
    FileTooLarge,
    MergeConflictError,
    PathNotFound,
    PathRefused,
    SymlinkOutside,
    VfsError,
    WorkspaceChanged,
)
from .export import (
    GitBranchRefused,
    check_git_branch,
    git_commit,
    git_commit_async,
    git_head_tree,
    git_patch,
    large_paths,
    unified_diff,
)
from .ignore import IgnoreRules
from .merge import (
    DELETE,
    Conflict,
    ConflictStrategy,
    Hunk,
    MergeResult,
    Resolver,
    merge_branches,
    merge_branches_async,
    merge_file,
)
from .snapshot import Snapshot, StatInfo, Workspace
from .tree import Layer, MemoryTree, Tree
from .watch import ConflictWatch, EarlyWarning
from .workdir import HarvestReport, Workdir, harvest

__all__ = [
    "DELETE",
    "NAME_MAX",
    "PATH_MAX",
    "ApplyError",
    "ApplyResult",
    "Branch",
    "Change",
    "ChangeSet",
    "Conflict",
    "ConflictStrategy",
    "ConflictWatch",
    "CopyStats",
    "Delete",
    "EarlyWarning",
    "FileState",
    "FileTooLarge",
    "GitBranchRefused",
    "HarvestReport",
    "Hunk",
    "IgnoreRules",
    "InterruptedApply",
    "Layer",
    "MemoryTree",
    "MergeConflictError",
    "MergeResult",
    "ModeChange",
    "OutsideChange",
    "PathNotFound",
    "PathRefused",
    "RecoveryReport",
    "Resolver",
    "Snapshot",
    "StatInfo",
    "SymlinkOutside",
    "Tree",
    "VfsError",
    "Workdir",
    "Workspace",
    "WorkspaceChanged",
    "Write",
    "apply_changes",
    "apply_changes_async",
    "check_git_branch",
    "check_path_limits",
    "check_symlinks",
    "disk_digest",
    "git_commit",
    "git_commit_async",
    "git_head_tree",
    "git_patch",
    "harvest",
    "interrupted_applies",
    "large_paths",
    "materialize",
    "materialize_async",
    "merge_branches",
    "merge_branches_async",
    "merge_file",
    "recover_applies",
    "remove_tree",
    "unified_diff",
]
