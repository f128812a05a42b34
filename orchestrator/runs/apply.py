"""Apply: the one path that writes a run's recorded changes, to its workspace or a new git branch.

Every apply goes through :func:`apply_recorded`: :func:`apply_run` (any kind of run, the whole
run or one step or instance), a run or resume asked to apply at its end
(:mod:`orchestrator.runs.run`), and a comparison's chosen agent (``compare(apply=NAME)``). It
reads the change sets from the run store (a run's changes are recorded there before anything is
applied), checks every touched file against the base the run recorded for it, and writes all or
nothing. What it does not do, it says:

- a choice is needed: a comparison as a whole, an unknown or unfinished step
  (:class:`~orchestrator.errors.UsageError`);
- merge conflicts between branches are left to settle: a run whose status is ``conflicts``, or a
  step whose instances conflict (:class:`~orchestrator.errors.UnsettledConflicts`);
- the same changes were applied to the workspace before
  (:class:`~orchestrator.errors.AlreadyApplied`; another instance of the same step, say
  ``compare[bob]`` after ``compare[alice]``, is an apply of its own, checked like any other);
- files changed in the workspace since the run (for a git branch: ``HEAD`` holds them otherwise
  than the run's base): the outcome lists them in ``workspace_changed`` and nothing is written;
- a symlink the changes would make that leads outside the workspace (absolute, climbing out
  with ``..``, or through links that do): :class:`~orchestrator.errors.SymlinkRefused` names
  them and nothing is written (nor committed), whatever the workspace holds;
- there is nothing to apply: the outcome says ``applied=False`` with nothing listed;
- a crash interrupted an earlier apply: every apply first finishes it from its journal
  (:func:`recover`: completed, or rolled back when its journal is incomplete; a completed one
  is recorded as the apply of its run) and says so in ``recovered``; an apply of the run whose
  apply was interrupted is then done. One that cannot be completed because files it touches
  were edited since the crash is rolled back around them: they keep the edit, the rest holds
  what it held before, the run is not recorded as applied (its report lists the edited files
  in ``problems``), and the apply asked for then goes on as usual (an apply of that same run
  finds those files changed since the run). :func:`interrupted_applies` lists them without
  touching anything.
"""

from __future__ import annotations

import datetime
import os
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
from attrs import frozen

from .._log import get_logger
from .._names import display_names, name_from_json
from ..errors import (
    AlreadyApplied,
    ApplyRefused,
    RunNotFound,
    SymlinkRefused,
    UnsettledConflicts,
    UsageError,
)
from ..pipeline.branches import FINAL, base_moved, rebuild_branch, workspace_moved
from ..state import state_directory
from ..store import ApplyRecord, RunRecord, RunStore, StepRecord, StoredChange, open_run_store
from ..vfs import (
    ApplyError,
    ChangeSet,
    GitBranchRefused,
    InterruptedApply,
    PathRefused,
    RecoveryReport,
    Snapshot,
    SymlinkOutside,
    Tree,
    Workspace,
    apply_changes_async,
    check_git_branch,
    check_symlinks,
    git_commit_async,
    git_head_tree,
    merge_branches,
    recover_applies,
)
from ..vfs import interrupted_applies as _interrupted_applies
from ..vfs.apply import logged_paths
from ._face import check_trio_face
from ._lock import hold_run_lock
from .recorded import no_such_step

__all__ = [
    "ApplyOutcome",
    "apply_recorded",
    "apply_run",
    "interrupted_applies",
    "interrupted_json",
    "recover",
]

log = get_logger(__name__)

#: what a run's exit code is when its changes could not be written (see the README)
EXIT_WORKSPACE_CHANGED = 3


def _origin(apply: InterruptedApply | None) -> tuple[str | None, str | None, tuple[str, ...]]:
    """The run, step and change-set keys an interrupted apply was writing (None: unknown)."""
    origin = dict(apply.origin or {}) if apply is not None else {}
    run_id, step, keys = origin.get("runId"), origin.get("step"), origin.get("keys")
    return (
        run_id if isinstance(run_id, str) else None,
        step if isinstance(step, str) else None,
        tuple(str(k) for k in keys) if isinstance(keys, list) else (),
    )


async def recover(state_dir: str | os.PathLike[str] | None = None) -> list[RecoveryReport]:
    """Complete or roll back applies that a crash interrupted (run before any new work).

    An apply of a run that is completed is recorded in the run store as that run's apply (the
    crash came before the record was written).
    """
    state = state_directory(state_dir)
    # what recovery wrote and its record go together (a Ctrl-C must not part them)
    with trio.CancelScope(shield=True):
        reports = await _recover(state)
    return reports


async def _recover(state: Path) -> list[RecoveryReport]:
    reports = await trio.to_thread.run_sync(recover_applies, state)
    completed: list[tuple[str, tuple[str, ...]]] = []
    for report in reports:
        run_id, _step, keys = _origin(report.apply)
        log.warning(
            "interrupted apply recovered",
            action=report.action,
            journal=report.journal,
            run_id=run_id,
            count=len(report.paths),
            paths=logged_paths(report.paths),
        )
        if run_id is not None and keys and report.action == "completed" and not report.problems:
            completed.append((run_id, keys))
    if completed:
        async with open_run_store(state) as store:
            for run_id, keys in completed:
                try:
                    await store.add_apply(ApplyRecord(run_id, keys, time.time()))
                except RunNotFound:
                    log.warning("the run of a recovered apply is no longer recorded", run=run_id)
    return reports


async def interrupted_applies(
    state_dir: str | os.PathLike[str] | None = None,
) -> list[InterruptedApply]:
    """The applies a crash interrupted, oldest first, as their journals hold them: their
    workspaces may be half written. Touches nothing (see :func:`recover`); empty while an apply
    is under way in another process."""
    return await trio.to_thread.run_sync(_interrupted_applies, state_directory(state_dir))


def interrupted_json(apply: InterruptedApply) -> dict[str, Any]:
    """An interrupted apply as ``--json`` objects show it."""
    run_id, step, keys = _origin(apply)
    return {
        "runId": run_id,
        "step": step,
        "keys": list(keys),
        "workspace": apply.workspace,
        "journal": apply.journal,
        "started": apply.started,
        "files": list(apply.paths),
        "edited": list(apply.edited),
    }


def _same_place(a: str, b: str) -> bool:
    """Whether two directories are one, or one holds the other."""
    a, b = os.path.realpath(a), os.path.realpath(b)
    return os.path.commonpath([a, b]) in (a, b)


@frozen
class ApplyOutcome:
    """What :func:`apply_run` wrote (or committed), or the files that kept it from writing."""

    #: the run's full id
    run_id: str
    #: what was asked: None for the whole run, else ``STEP`` or ``STEP[KEY]``
    step: str | None = None
    #: the change sets applied: ``(final)`` for the whole run, else step instance keys
    keys: tuple[str, ...] = ()
    #: whether the changes were written (or committed); False also when there were none
    applied: bool = False
    written: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    mode_changed: tuple[str, ...] = ()
    #: files the run changed whose base moved since: changed in the workspace (or, for a git
    #: branch, different at ``HEAD``); nothing was written
    workspace_changed: tuple[str, ...] = ()
    #: the branch made instead of writing the workspace, and its commit
    git_branch: str | None = None
    git_commit: str | None = None
    #: when the changes were applied (seconds since the epoch)
    at: float | None = None
    #: interrupted applies finished first (see :func:`recover`), whichever run they were of
    recovered: tuple[RecoveryReport, ...] = ()

    @property
    def nothing_to_apply(self) -> bool:
        """The changes asked for change no file: nothing was written, nothing is wrong."""
        return not self.applied and not self.workspace_changed

    @property
    def exit_code(self) -> int:
        """0 applied or nothing to apply, 3 refused because the workspace changed."""
        return EXIT_WORKSPACE_CHANGED if self.workspace_changed else 0

    def to_json(self) -> dict[str, Any]:
        """The ``orchestrator apply --json`` object."""
        return {
            "runId": self.run_id,
            "step": self.step,
            "keys": list(self.keys),
            "applied": self.applied,
            "written": display_names(self.written),
            "deleted": display_names(self.deleted),
            "modeChanged": display_names(self.mode_changed),
            "workspaceChanged": display_names(self.workspace_changed),
            "gitBranch": self.git_branch,
            "gitCommit": self.git_commit,
            "at": self.at,
            "recovered": [
                {
                    **(interrupted_json(r.apply) if r.apply is not None else {}),
                    "journal": r.journal,
                    "action": r.action,
                    "problems": display_names(r.problems),
                    "changed": display_names(r.changed),
                }
                for r in self.recovered
            ],
        }


def _when(at: float) -> str:
    return datetime.datetime.fromtimestamp(at).isoformat(sep=" ", timespec="seconds")


def _unfinished(steps: Sequence[StepRecord]) -> str:
    return ", ".join(f"{s.key} {s.status}" for s in steps)


async def _select(store: RunStore, record: RunRecord, step: str | None) -> tuple[str, ...]:
    """The change-set keys that ``step`` names in the run (None: the run's final changes)."""
    run_id = record.run_id
    # a prompt's one step is the whole run, once it has final changes; named, the step of a
    # prompt that never got them (interrupted, failed) is its instance, as far as it got
    if (
        record.kind == "prompt"
        and step in (None, "prompt")
        and (step is None or FINAL in await store.change_keys(run_id))
    ):
        step = None
    steps = await store.steps(run_id)
    if record.kind == "compare" and step in (None, "compare"):
        # the agents' branches are alternatives, never merged
        names = [s.key for s in steps if s.step == "compare" and s.instance is not None]
        raise UsageError(
            f"run {run_id} is a comparison: apply one agent's changes "
            f"({', '.join(names) or 'no agent finished'})"
        )
    if step is None:
        return await _whole_run(store, record, steps)
    members = [s for s in steps if s.step == step and s.key != step]
    if members:  # a fanned-out step: its instances merged
        unfinished = [s for s in members if s.status != "succeeded"]
        if unfinished:
            offered = await _with_changes(store, run_id, members)
            raise UsageError(
                f"step {step} of run {run_id} did not finish in every instance "
                f"({_unfinished(unfinished)}); apply its instances one at a time "
                f"({offered or 'none'})"
            )
        return tuple(s.key for s in members)
    exact = [s for s in steps if s.key == step]
    if exact:
        one = exact[0]
        # a failed instance's changes are kept, as far as it got; a step that failed before
        # it ran (a merge of its parents) has none
        if one.status != "succeeded" and step not in await store.change_keys(run_id):
            why = f": {one.error}" if one.error else ""
            raise UsageError(
                f"step {step} of run {run_id} has no changes to apply ({one.status}{why})"
            )
        return (step,)
    raise no_such_step(run_id, step, steps)


async def _whole_run(
    store: RunStore, record: RunRecord, steps: Sequence[StepRecord]
) -> tuple[str, ...]:
    run_id = record.run_id
    if record.status == "running":
        raise ApplyRefused(
            run_id, f"run {run_id} is still running (if its process is gone, resume it first)"
        )
    # a prompt has one branch: its "conflicts" is what older releases recorded for a
    # workspace that changed during the run, which the apply checks below as always
    if record.status == "conflicts" and record.kind != "prompt":
        unsettled = [c for c in await store.conflicts(run_id) if c.get("resolution") == "fail"]
        paths = sorted({name_from_json(c) for c in unsettled})
        where = "; ".join(f"{c.get('path')} at {c.get('step')}" for c in unsettled)
        raise UnsettledConflicts(
            run_id,
            f"run {run_id} has merge conflicts to settle{f' ({where})' if where else ''}: "
            "nothing applied; settle them with a merge strategy and resume, or apply one step "
            "instance",
            paths,
        )
    if FINAL in await store.change_keys(run_id) or record.status == "succeeded":
        return (FINAL,)
    offered = await _with_changes(store, run_id, steps)
    raise UsageError(
        f"run {run_id} {record.status} before it had final changes: apply a step instance "
        f"instead ({offered or 'none'})"
    )


async def _with_changes(store: RunStore, run_id: str, steps: Sequence[StepRecord]) -> str:
    """The step instances among ``steps`` that one can apply: finished ones, and the changes
    that others (interrupted, failed) recorded as far as they got, with their status."""
    keys = set(await store.change_keys(run_id))
    return ", ".join(
        s.key if s.status == "succeeded" else f"{s.key} {s.status}"
        for s in steps
        if s.key != FINAL and (s.status == "succeeded" or s.key in keys)
    )


def workspace_applies(record: RunRecord, applies: Sequence[ApplyRecord]) -> list[ApplyRecord]:
    """Those of ``applies`` (the run ``record``'s) that wrote to its workspace, not to a git
    branch; for a run applied by a release that recorded only when (or a prompt that applied
    at once), one apply of unknown keys at that time."""
    earlier = [a for a in applies if a.git_branch is None]
    if not earlier and record.applied is not None:
        earlier = [ApplyRecord(record.run_id, None, record.applied)]
    return earlier


async def _refuse_reapply(
    store: RunStore, record: RunRecord, step: str | None, keys: tuple[str, ...]
) -> None:
    """Raise :class:`AlreadyApplied` if these changes were written to the workspace before."""
    for a in workspace_applies(record, await store.applies(record.run_id)):
        # keys not recorded: the whole run's, but a comparison's agent is unknown
        unknown: set[str] = set() if record.kind == "compare" else {FINAL}
        done = set(a.keys) if a.keys is not None else unknown
        if set(keys) <= done:
            what = f"run {record.run_id}" if step is None else f"{step} of run {record.run_id}"
            part = "" if set(keys) == done else f" (with {', '.join(sorted(done - set(keys)))})"
            raise AlreadyApplied(
                record.run_id, f"{what} was already applied at {_when(a.at)}{part}", a.at
            )


def _moved(
    base: Tree, stored: Mapping[str, Sequence[StoredChange]], workspace: str | None
) -> tuple[str, ...]:
    """The touched files whose base is not what ``base`` holds (blocking: reads them); with
    the ``workspace`` written to, also a file made where a directory holding what the run
    did not copy stands (see :func:`~orchestrator.pipeline.branches.workspace_moved`), so that
    a refusal names every path at once."""
    out = {p for changes in stored.values() for p in base_moved(base, changes)}
    if workspace is not None:
        # ``base`` is the workspace as it is: a file the run found there was compared above.
        # Only a new file can meet what it does not hold (an ignored file, a directory).
        for changes in stored.values():
            new = [c for c in changes if c.base_digest is None]
            if new:
                deleted = {c.path for c in changes if c.kind == "delete"}
                out.update(workspace_moved(workspace, new, deleted=deleted))
    return tuple(sorted(out))


def _merged(
    record: RunRecord, step: str | None, base: Tree, stored: Mapping[str, Sequence[StoredChange]]
) -> ChangeSet:
    """The change sets rebuilt over ``base`` and merged (blocking)."""
    branches = [rebuild_branch(base, key, changes) for key, changes in stored.items()]
    if len(branches) == 1:
        return branches[0].net_changes()
    merged = merge_branches(branches, strategy="fail")
    if merged.conflicts:
        paths = sorted({c.path for c in merged.conflicts})
        raise UnsettledConflicts(
            record.run_id,
            f"the instances of step {step} of run {record.run_id} conflict in "
            f"{', '.join(display_names(paths))}: apply one of them ({', '.join(stored)})",
            paths,
        )
    return merged.net_changes()


def _in_clone_cache(cwd: str, state: Path) -> bool:
    """Whether ``cwd`` is a clone of the batches' cache in the state directory ``state``."""
    from ._clones import CLONES

    try:
        Path(cwd).resolve().relative_to((state / CLONES).resolve())
    except ValueError:
        return False
    return True


def _git_base(cwd: str, branch: str, paths: Sequence[str]) -> Tree:
    """``HEAD``'s version of ``paths``, once the branch is known to be possible (blocking)."""
    try:
        check_git_branch(cwd, branch)
    except GitBranchRefused as e:
        raise UsageError(f"cannot make git branch {branch!r}: {e}") from e
    return git_head_tree(cwd, paths)


def _workspace(cwd: str) -> Snapshot:
    try:
        return Workspace.open(cwd).snapshot()
    except NotADirectoryError as e:
        raise UsageError(f"the run's workspace {cwd} is not a directory any more") from e
    except PathRefused as e:  # a path in it too long for the system to look up
        raise UsageError(f"the run's workspace {cwd}: {e}") from e


def _commit_message(record: RunRecord, keys: tuple[str, ...], changes: ChangeSet) -> str:
    """Subject: what the run was asked; body: where the changes come from."""
    inputs = dict(record.inputs)
    options = dict(record.options)
    task = inputs.get("task") or inputs.get("text") or (options.get("compare") or {}).get("task")
    task_line = str(task).strip().splitlines()[0] if task and str(task).strip() else ""
    if record.kind == "pipeline":
        name = (options.get("graph") or {}).get("name") or Path(record.pipeline or "run").stem
        subject = f"{name}: {task_line}" if task_line else str(name)
    elif record.kind == "compare":
        agents = ", ".join(k.partition("[")[2].rstrip("]") or k for k in keys)
        subject = f"{agents}: {task_line}" if task_line else f"{agents}'s changes"
    else:
        subject = task_line or f"{record.kind} run {record.run_id}"
    if len(subject) > 72:
        subject = subject[:71] + "…"
    body = [
        f"Changes of orchestrator run {record.run_id} ({record.kind}, {record.status}): "
        f"{', '.join(keys)}.",
        f"Files: {len(changes.written)} written, {len(changes.deleted)} deleted, "
        f"{len(changes.mode_changed)} mode changes.",
    ]
    if record.pipeline:
        body.append(f"Pipeline: {record.pipeline}")
    if task and str(task).strip() != task_line:
        body += ["", "Task:", str(task).strip()]
    elif record.kind == "pipeline" and inputs:
        body.append("Inputs: " + ", ".join(f"{k}={v!r}" for k, v in inputs.items()))
    return f"{subject}\n\n" + "\n".join(body) + "\n"


async def apply_recorded(
    store: RunStore,
    run_id: str,
    *,
    state: Path,
    step: str | None = None,
    git_branch: str | None = None,
    message: str | None = None,
) -> ApplyOutcome:
    """Apply a recorded run's changes (the whole run's, or one step's): the one apply path.

    ``run_id`` may be a unique prefix. Without ``git_branch`` the run's workspace is written,
    all or nothing, if every touched file still has the base the run recorded for it. With
    ``git_branch``, the workspace's working tree, index and current branch are left alone: a new
    branch of that name is made at ``HEAD`` plus the changes, as one commit (``message``, or
    one saying what the run was asked), if ``HEAD`` holds the run's base for every touched
    file. Refusals are described in the module docs.
    """
    record = await store.get_run(run_id)
    run_id = record.run_id
    keys = await _select(store, record, step)
    if git_branch is None:
        await _refuse_reapply(store, record, step, keys)
    stored = {key: await store.changes(run_id, key) for key in keys}
    paths = sorted({c.path for changes in stored.values() for c in changes})
    outcome = ApplyOutcome(run_id, step, keys, git_branch=git_branch)
    base: Tree
    if git_branch is not None:
        base = await trio.to_thread.run_sync(_git_base, record.cwd, git_branch, paths)
    else:
        base = await trio.to_thread.run_sync(_workspace, record.cwd)
    written = record.cwd if git_branch is None else None
    moved = await trio.to_thread.run_sync(_moved, base, stored, written)
    if moved:
        return attrs.evolve(outcome, workspace_changed=moved)
    changes = await trio.to_thread.run_sync(_merged, record, step, base, stored)
    if not changes:
        return outcome
    try:
        # judged in the workspace, where the links will be (or be checked out from the branch)
        await trio.to_thread.run_sync(check_symlinks, record.cwd, changes)
    except SymlinkOutside as e:
        raise SymlinkRefused(
            run_id,
            f"run {run_id} would make symlinks the workspace cannot take: {e.described()}; "
            "nothing applied",
            [path for path, _ in e.links],
        ) from e
    # the write and its record go together: a Ctrl-C must not leave written files behind a
    # run recorded as not applied
    with trio.CancelScope(shield=True):
        if git_branch is not None:
            if message is None:
                message = _commit_message(record, keys, changes)
            commit = await git_commit_async(
                base, changes, branch=git_branch, message=message, workspace=record.cwd
            )
            at = time.time()
            await store.add_apply(ApplyRecord(run_id, keys, at, git_branch, commit))
            return attrs.evolve(
                outcome,
                applied=True,
                written=changes.written,
                deleted=changes.deleted,
                mode_changed=changes.mode_changed,
                git_commit=commit,
                at=at,
            )
        assert isinstance(base, Snapshot)
        # named in the journal, so that a crash midway leaves an apply one can trace to the run
        origin = {"runId": run_id, "step": step, "keys": list(keys)}
        try:
            result = await apply_changes_async(base, changes, state_dir=state, origin=origin)
        except ApplyError as e:  # a write failed (an immutable file, a full disk): undone
            raise ApplyRefused(
                run_id, f"run {run_id}'s changes were not applied: {e}; nothing is written"
            ) from e
        if not result.applied:
            return attrs.evolve(outcome, workspace_changed=tuple(c.path for c in result.conflicts))
        at = time.time()
        await store.add_apply(ApplyRecord(run_id, keys, at))
    return attrs.evolve(
        outcome,
        applied=True,
        written=result.written,
        deleted=result.deleted,
        mode_changed=result.mode_changed,
        at=at,
    )


async def apply_run(
    run_id: str,
    *,
    step: str | None = None,
    git_branch: str | None = None,
    state_dir: str | os.PathLike[str] | None = None,
) -> ApplyOutcome:
    """Write a recorded run's changes (or one step's) to its workspace, all or nothing.

    ``step`` is ``STEP`` (its instances merged) or ``STEP[KEY]`` (one instance; a comparison's
    agents are ``compare[NAME]``). With ``git_branch``, commit them on a new branch of the
    workspace's git repository instead, leaving the working tree, index and ``HEAD`` alone.
    See :func:`apply_recorded` for what is checked and refused.
    """
    check_trio_face("apply_run")  # before anything starts
    state = state_directory(state_dir)
    reports = tuple(r for r in await recover(state) if r.action != "discarded")
    async with open_run_store(state) as store:
        record = await store.get_run(run_id)
        full = record.run_id
        if record.kind == "batch":
            from .recorded import batch_refused

            raise batch_refused(full, "apply")
        if git_branch is None and _in_clone_cache(record.cwd, state):
            raise UsageError(
                f"run {full} worked in a clone the batch cache holds ({record.cwd}), which the "
                "next batch resets: commit its changes on a git branch instead"
            )
        # not while the run runs in another process (nor may it start while this applies)
        with hold_run_lock(state / "runs" / full, full, doing="apply"):
            if git_branch is None:
                done = await _finished_by_recovery(store, record, step, reports)
                if done is not None:
                    return attrs.evolve(done, recovered=reports)
            outcome = await apply_recorded(
                store, full, state=state, step=step, git_branch=git_branch
            )
            return attrs.evolve(outcome, recovered=reports)


async def _finished_by_recovery(
    store: RunStore, record: RunRecord, step: str | None, reports: Sequence[RecoveryReport]
) -> ApplyOutcome | None:
    """The outcome of this very apply (``step`` of the run), if recovery just completed it."""
    for report in reports:
        run_id, _step, keys = _origin(report.apply)
        if report.apply is None or report.action != "completed" or report.problems:
            continue
        if run_id == record.run_id and keys == await _select(store, record, step):
            at = [a.at for a in await store.applies(record.run_id) if a.keys == keys]
            return ApplyOutcome(
                record.run_id,
                step,
                keys,
                applied=True,
                written=report.apply.written,
                deleted=report.apply.deleted,
                mode_changed=report.apply.mode_changed,
                at=at[-1] if at else None,
            )
    return None
