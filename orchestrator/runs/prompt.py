"""The library API: what the command line does, callable from Python.

Every function has an ``async`` form for trio code and a synchronous twin for scripts::

    from orchestrator import prompt_sync
    result = prompt_sync("demo", 'replace "a" with "b" in *.txt', cwd="project")
    print(result.turn.text)
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import attrs
import structlog
import trio
from attrs import frozen

from ..agent.client import ClientOptions, open_agent
from ..agent.elicitation import PolicyElicitationService
from ..agent.permissions import Escalate, PolicyPermissionService
from ..agent.services import ClientServices, PermissionRecord
from ..agent.terminals import open_terminal_service
from ..agent.transcript import TranscriptWriter
from ..agent.turn import TurnResult
from ..agents import AgentSpec, resolve_agent
from ..errors import UsageError
from ..policy import PolicySet
from ..protocol import types as t
from ..state import state_directory
from ..store import StoredChange
from ..vfs import (
    Branch,
    BranchFileSystem,
    Change,
    ChangeSet,
    Delete,
    RecoveryReport,
    Workspace,
    WorkspaceChanged,
    apply_changes_async,
    git_patch,
    materialize_async,
    recover_applies,
    unified_diff,
)

ChangeKind = Literal["added", "modified", "deleted"]

log = structlog.get_logger(__name__)

__all__ = ["PromptRun", "load_policy", "prompt", "prompt_sync", "recover"]


@frozen
class PromptRun:
    """The outcome of one prompt to one agent."""

    #: an id for this run
    run_id: str
    #: the agent as configured
    agent: AgentSpec
    #: what the agent said about itself in ``initialize``
    agent_info: t.Implementation | None
    #: the session the turn ran in
    session_id: str
    #: the turn's result
    turn: TurnResult
    #: wall-clock seconds from start to the end of the turn
    wall_seconds: float
    #: the files the agent changed in its branch: (path relative to the workspace, change)
    changes: tuple[tuple[str, ChangeKind], ...] = ()
    #: the unified diff of those changes
    diff: str = ""
    #: whether the changes were written to the workspace (``apply=True`` and no conflict)
    applied: bool = False
    #: files the apply refused because they changed in the workspace during the run
    apply_conflicts: tuple[str, ...] = ()
    #: the run's directory in the state directory (it keeps ``changes.patch``)
    run_dir: str = ""

    @property
    def permissions(self) -> list[PermissionRecord]:
        """The permission decisions of the turn, in order."""
        return self.turn.permissions

    def to_json(self) -> dict[str, Any]:
        """The ``--json`` object of ``orchestrator prompt``."""
        info = self.agent_info
        return {
            "runId": self.run_id,
            "sessionId": self.session_id,
            "agent": {
                "name": self.agent.name,
                "version": info.version if info else None,
                "reportedName": info.name if info else None,
            },
            "stopReason": self.turn.stop_reason,
            "text": self.turn.text,
            "toolCalls": [c.to_json() for c in self.turn.tool_calls.values()],
            "permissions": [
                {
                    "toolCallId": p.tool_call_id,
                    "kind": p.kind,
                    "title": p.title,
                    "verdict": p.verdict,
                    "optionId": p.option_id,
                    "rule": p.rule,
                }
                for p in self.turn.permissions
            ],
            "usage": self.turn.usage_json(),
            "changes": [{"path": path, "change": change} for path, change in self.changes],
            "diff": self.diff,
            "applied": self.applied,
            "applyConflicts": list(self.apply_conflicts),
            "patch": os.path.join(self.run_dir, "changes.patch") if self.changes else None,
            "wallSeconds": round(self.wall_seconds, 3),
        }


def load_policy(policy: str | os.PathLike[str] | PolicySet | None) -> PolicySet:
    """A policy from a preset name, a TOML file, or a ready :class:`PolicySet`.

    None is the empty policy: every request is rejected by the ``default`` rule.
    """
    if policy is None:
        return PolicySet()
    if isinstance(policy, PolicySet):
        return policy
    return PolicySet.load(os.fspath(policy))


async def prompt(
    agent: str | AgentSpec,
    text: str,
    *,
    cwd: str | os.PathLike[str] = ".",
    policy: str | os.PathLike[str] | PolicySet | None = None,
    escalate: Escalate | None = None,
    services: ClientServices | None = None,
    options: ClientOptions | None = None,
    transcript: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
    idle_timeout: float | None = None,
    on_update: Callable[[t.SessionUpdate], None] | None = None,
    apply: bool = False,
    state_dir: str | os.PathLike[str] | None = None,
) -> PromptRun:
    """Start ``agent`` on a branch of ``cwd``, run one turn with ``text``, shut it down.

    The agent works in its own copy of the workspace (a VFS branch materialized under the state
    directory): what it writes through ``fs/*``, on disk itself or with terminal commands is
    harvested into the branch; the workspace is written only when ``apply`` is true, all or
    nothing, and only if the touched files did not change meanwhile. The changes are also kept
    as a git-applicable ``changes.patch`` in the run directory.

    Permission requests are answered by ``policy`` (a preset name, a TOML file or a
    :class:`PolicySet`; default: reject everything), with ``escalate`` called for ``ask``
    verdicts. The agent gets real terminals (in its branch directory) whose commands the same
    policy vets. Passing ``services`` replaces the permission, terminal and elicitation services
    (the fs service of the branch is always installed).
    """
    spec = resolve_agent(agent) if isinstance(agent, str) else agent
    spec = spec.resolved(os.getcwd())  # the agent runs elsewhere: its branch directory
    root = Path(cwd).absolute()
    if not root.is_dir():
        raise UsageError(f"--cwd {root} is not a directory")
    policy_set = load_policy(policy)
    state = state_directory(state_dir)
    await recover(state)
    run_id = uuid.uuid4().hex[:12]
    run_dir = state / "runs" / run_id
    writer = TranscriptWriter(transcript, agent=spec.name) if transcript else None
    started = time.monotonic()
    snapshot = await trio.to_thread.run_sync(Workspace.open(root).snapshot)
    branch = Branch.from_tree(snapshot, spec.name)
    workdir = await materialize_async(branch, run_dir / "branches" / _safe_name(spec.name))
    fs = BranchFileSystem(workdir)
    permission = PolicyPermissionService(policy_set, escalate=escalate)
    try:
        # the terminal vets commands with the same service, so a command a human approved
        # runs; after each command, what it changed on disk is harvested into the branch
        async with open_terminal_service(
            command_check=permission.check_command, on_exit=fs.on_terminal_exit
        ) as terminals:
            base = services or ClientServices(
                terminal=terminals,
                permission=permission,
                elicitation=PolicyElicitationService.from_policy(policy_set),
            )
            installed = ClientServices(
                fs=fs,
                terminal=base.terminal,
                permission=base.permission,
                elicitation=base.elicitation,
            )
            async with open_agent(
                list(spec.command),
                name=spec.name,
                cwd=workdir.root,
                env=dict(spec.env) or None,
                services=installed,
                options=options,
                transcript=writer,
            ) as conn:
                session = await conn.new_session(workdir.root)
                result = await session.prompt(
                    text, timeout=timeout, idle_timeout=idle_timeout, on_update=on_update
                )
                info = conn.agent_info
        await fs.harvest(full=True)
        kept = await trio.to_thread.run_sync(_stored, branch)  # before an apply moves the base
        run = await _finish(
            PromptRun(
                run_id=run_id,
                agent=spec,
                agent_info=info,
                session_id=session.session_id,
                turn=result,
                wall_seconds=time.monotonic() - started,
                run_dir=str(run_dir),
            ),
            branch,
            state,
            apply,
        )
        await _record(run, kept, state, root, text)
        return run
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(workdir.remove)


async def recover(state_dir: str | os.PathLike[str] | None = None) -> list[RecoveryReport]:
    """Complete or roll back applies that a crash interrupted (run before any new work)."""
    reports = await trio.to_thread.run_sync(recover_applies, state_directory(state_dir))
    for report in reports:
        log.warning(
            "interrupted apply recovered",
            action=report.action,
            journal=report.journal,
            paths=list(report.paths),
        )
    return reports


async def _finish(run: PromptRun, branch: Branch, state: Path, apply: bool) -> PromptRun:
    """Record the branch's changes on the run; apply them when asked."""
    changes = branch.changes
    if not changes:
        return run
    kinds = tuple((path, _change_kind(branch, path, changes[path])) for path in changes)
    applied: bool = False
    refused: tuple[str, ...] = ()
    try:
        diff, patch = unified_diff(branch), git_patch(branch)
    except WorkspaceChanged as e:
        # someone edited files the agent changed too: their base is gone, so those files
        # cannot be diffed or applied; the rest still can be shown
        refused = e.paths
        rest = {path: change for path, change in changes.items() if path not in e.paths}
        diff, patch = unified_diff(branch, rest), git_patch(branch, rest)
        log.warning("workspace changed during the run", files=list(refused))
    await trio.to_thread.run_sync(Path(run.run_dir, "changes.patch").write_bytes, patch)
    if apply and not refused:
        outcome = await apply_changes_async(branch, state_dir=state)
        applied = outcome.applied
        refused = tuple(c.path for c in outcome.conflicts)
    return attrs.evolve(run, changes=kinds, diff=diff, applied=applied, apply_conflicts=refused)


def _stored(branch: Branch) -> tuple[list[StoredChange], str]:
    """The branch's changes as the run store keeps them, and their diff.

    Files changed in the workspace during the run are left out: their base is gone.
    """
    from ..pipeline.branches import diff_of, stored_changes

    net = branch.net_changes()
    try:
        return stored_changes(branch.root, net), diff_of(branch, net)
    except WorkspaceChanged as e:
        rest = {p: c for p, c in net.items() if p not in e.paths}
        return stored_changes(branch.root, rest), diff_of(branch, ChangeSet.of(rest))


async def _record(
    run: PromptRun, kept: tuple[list[StoredChange], str], state: Path, root: Path, text: str
) -> None:
    """Keep the run in the run store, so ``runs``, ``show``, ``diff`` and ``apply`` know it."""
    result = run.to_json()
    if run.apply_conflicts:
        status = "conflicts"
    else:
        status = "succeeded" if run.turn.stop_reason == "end_turn" else "failed"
    now = time.time()
    # the changes may be applied already: the record must not be left half written
    with trio.CancelScope(shield=True):
        await _write_record(state, run, kept, status, now, root, text, result)


async def _write_record(
    state: Path,
    run: PromptRun,
    kept: tuple[list[StoredChange], str],
    status: str,
    now: float,
    root: Path,
    text: str,
    result: dict[str, Any],
) -> None:
    from ..pipeline.branches import FINAL
    from ..store import AddPermissions, PutChanges, PutStep, RunRecord, StepRecord, open_run_store

    async with open_run_store(state) as store:
        await store.create_run(
            RunRecord(
                run_id=run.run_id,
                kind="prompt",
                status=status,
                created=now - run.wall_seconds,
                finished=now,
                cwd=str(root),
                inputs={"text": text, "agent": run.agent.name},
                result=result,
                applied=now if run.applied else None,
            )
        )
        step = PutStep(
            StepRecord(
                run_id=run.run_id,
                key="prompt",
                step="prompt",
                instance=None,
                agent=run.agent.name,
                status="succeeded" if status != "failed" else "failed",
                started=now - run.wall_seconds,
                finished=now,
                session_id=run.session_id,
                result=result,
                usage=result.get("usage"),
            )
        )
        audit = [p.to_json() for p in run.turn.permissions]
        await store.write_many(
            [
                step,
                PutChanges(run.run_id, FINAL, kept[0], kept[1]),
                *([AddPermissions(run.run_id, "prompt", audit)] if audit else []),
            ]
        )


def _change_kind(branch: Branch, path: str, change: Change) -> ChangeKind:
    if isinstance(change, Delete):
        return "deleted"
    return "modified" if branch.root.exists(path) else "added"


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "agent"


def prompt_sync(agent: str | AgentSpec, text: str, **kwargs: Any) -> PromptRun:
    """:func:`prompt` for scripts: runs its own trio loop."""

    async def run() -> PromptRun:
        return await prompt(agent, text, **kwargs)

    return trio.run(run)
