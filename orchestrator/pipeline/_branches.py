"""Branch bookkeeping for runs (defined in :mod:`orchestrator._runbranches`)."""

from .._runbranches import (
    FINAL,
    ResumeConflict,
    change_kinds,
    conflict_json,
    diff_of,
    rebuild_branch,
    stored_changes,
)

__all__ = [
    "FINAL",
    "ResumeConflict",
    "change_kinds",
    "conflict_json",
    "diff_of",
    "rebuild_branch",
    "stored_changes",
]
