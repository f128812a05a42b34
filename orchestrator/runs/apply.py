"""Apply: the one path that writes a run's changes to its workspace, all or nothing."""

from __future__ import annotations

import os
import time
from typing import Any

import trio
from attrs import frozen

from ..errors import ResumeConflict, UsageError
from ..pipeline.branches import FINAL, rebuild_branch
from ..state import state_directory
from ..store import RunRecord, RunStore, open_run_store
from ..vfs import Branch, Snapshot, Workspace, apply_changes_async, merge_branches
from .run import recover

__all__ = ["ApplyOutcome", "apply_run", "apply_run_sync"]


@frozen
class ApplyOutcome:
    """What :func:`apply_run` wrote, or the files that blocked it."""

    applied: bool
    written: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    #: files changed in the workspace since the run (nothing was written)
    paths: tuple[str, ...] = ()


async def _branch_of(
    store: RunStore, record: RunRecord, step: str | None, snapshot: Snapshot
) -> Branch:
    """The branch of a run (its final merge) or of one step (its instances merged)."""
    steps = await store.steps(record.run_id)
    if step is None:
        has_final = FINAL in await store.change_keys(record.run_id)
        keys = [FINAL] if has_final or record.kind != "compare" else []
        if not keys:
            raise UsageError(
                f"run {record.run_id} is a comparison: name the agent with --step compare[NAME]"
            )
    else:
        keys = [
            s.key for s in steps if s.key == step or (s.step == step and s.status == "succeeded")
        ]
        if not keys:
            known = sorted({s.key for s in steps if s.status == "succeeded"})
            listed = ", ".join(known) or "none"
            raise UsageError(
                f"run {record.run_id} has no finished step {step!r} (finished: {listed})"
            )
    branches = [
        rebuild_branch(snapshot, key, await store.changes(record.run_id, key)) for key in keys
    ]
    if len(branches) == 1:
        return branches[0]
    merged = merge_branches(branches, strategy="fail")
    if merged.conflicts:
        raise UsageError(
            f"the instances of {step} conflict in {', '.join(c.path for c in merged.conflicts)}: "
            "apply one of them with --step STEP[KEY]"
        )
    return merged.fork(step or FINAL)


async def apply_run(
    run_id: str, *, step: str | None = None, state_dir: str | os.PathLike[str] | None = None
) -> ApplyOutcome:
    """Write a run's changes (or one step's) to its workspace, all or nothing.

    Refused for files the workspace changed since the run (``paths``; nothing is written).
    """
    state = state_directory(state_dir)
    await recover(state)
    async with open_run_store(state) as store:
        record = await store.get_run(run_id)
        snapshot = await trio.to_thread.run_sync(Workspace.open(record.cwd).snapshot)
        try:
            branch = await _branch_of(store, record, step, snapshot)
        except ResumeConflict as e:
            return ApplyOutcome(False, paths=e.paths)
        if not branch.changes:
            return ApplyOutcome(True)
        outcome = await apply_changes_async(branch, state_dir=state)
        if outcome.applied:
            await store.update_run(record.run_id, applied=time.time())
        return ApplyOutcome(
            outcome.applied,
            outcome.written,
            outcome.deleted,
            tuple(c.path for c in outcome.conflicts),
        )


def apply_run_sync(run_id: str, **kwargs: Any) -> ApplyOutcome:
    """:func:`apply_run` for scripts: runs its own trio loop."""
    return trio.run(lambda: apply_run(run_id, **kwargs))
