"""One instance of a step: its own branch, its attempts (with retries), each one recorded.

An instance forks its branch from what its step starts from, holds one of the run's slots
while an attempt runs, and calls the step function: on the loop or in a worker thread, in a
branch directory if it wants one, and for an agent step through a turn of a leased session.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs
import trio
from attrs import define, field

from ..errors import RemoteTurnFailed
from ..store import StepRecord
from ..vfs import Branch, MergeResult, Snapshot
from ._agent_step import AgentTurns
from ._branchio import BranchDirs
from ._budget import NotStarted, RunBudget
from ._calls import MISSING, call, describe, error_kind, user_traceback
from ._recording import Recorder
from ._remote import RemoteReply, RemoteTurn, RemoteTurns, run_remote
from ._state import StepState
from ._step import Step
from .results import CheckResult, RunEvent, StepContext, StepResult

__all__ = ["InstanceExecutor", "fork_from", "reuse_branch"]


@define(eq=False)
class InstanceExecutor:
    """Runs the instances of one run's steps (see the module docstring)."""

    run_id: str
    workspace: Path
    inputs: Mapping[str, Any]
    #: instances already finished in an earlier attempt of this run: key -> (record, branch
    #: rebuilt over the run's snapshot; see :func:`reuse_branch`)
    reused: Mapping[str, tuple[StepRecord, Branch]]
    #: instances whose check failed in every round of an earlier attempt of this run: key ->
    #: (record, branch rebuilt over the run's snapshot); a new loop of rounds starts on that
    #: branch, the last check's output as its first feedback
    continued: Mapping[str, tuple[StepRecord, Branch]]
    #: held by an attempt while it runs: the run's limit on instances at once
    slots: trio.Semaphore
    recorder: Recorder
    dirs: BranchDirs
    turns: AgentTurns
    #: the budget the run shares with others, if any: once it is spent, no attempt starts
    budget: RunBudget | None = None
    #: branch name -> the key of the instance it is the branch of
    branch_keys: dict[str, str | None] = field(factory=dict)
    #: this run's instances waiting for a slot now (the slots may be shared with other runs)
    waiting: int = 0
    #: where agent turns run when not here (a cluster's nodes); None: in this process
    remote: RemoteTurns | None = None

    async def run(
        self,
        state: StepState,
        base: Branch | MergeResult | Snapshot,
        args: Mapping[str, Any],
        key: str | None,
        agent: str | None,
        item: Any,
    ) -> None:
        """Run the instance ``key`` of ``state``'s step (or reuse it), into ``state``."""
        step = state.step
        name = f"{step.name}[{key}]" if key is not None else step.name
        reused = self.reused.get(name)
        if reused is not None:
            record, recorded = reused
            branch = reuse_branch(base, recorded)
            state.outputs[key] = (
                StepResult.from_json(record.result) if record.result is not None else record.value
            )
            state.branches.append(branch)
            self.branch_keys[branch.name] = key
            self.recorder.emit(RunEvent("step_reused", self.run_id, step.name, key, agent))
            return
        attempt = 1
        going_on = _going_on(self.continued.get(name), step.check is not None)
        while True:
            # an instance counts as started once it holds a slot (not while it waits for one)
            # and keeps it until its outcome is recorded
            self.waiting += 1
            try:
                await self.slots.acquire()
            finally:
                self.waiting -= 1
            try:
                spent = self.budget.spent if self.budget is not None else None
                if spent is not None:
                    self._not_started(state, name, key, agent, attempt, spent)
                    return
                retry = await self._run_attempt(
                    state, base, args, name, key, agent, item, attempt, going_on
                )
            finally:
                self.slots.release()
            if not retry:
                return
            attempt += 1
            going_on = None  # a retry starts afresh

    async def _run_attempt(
        self,
        state: StepState,
        base: Branch | MergeResult | Snapshot,
        args: Mapping[str, Any],
        name: str,
        key: str | None,
        agent: str | None,
        item: Any,
        attempt: int,
        going_on: tuple[Branch, CheckResult] | None = None,
    ) -> bool:
        """One attempt of one instance, recorded; True when it failed and may be retried.

        ``going_on``: the branch and last check of an earlier attempt whose rounds all failed,
        to go on from (a resume).
        """
        step = state.step
        recorder = self.recorder
        feedback = None
        if going_on is None:
            branch = fork_from(base, name)
        else:
            recorded, feedback = going_on
            # the new loop's work goes on where the earlier one left it
            branch = reuse_branch(base, recorded, close=False)
        self.dirs.forget(name)
        started = time.time()
        recorder.record(name, step, key, agent, "running", attempt, started=started)
        recorder.emit(
            RunEvent("step_started", self.run_id, step.name, key, agent, {"attempt": attempt})
        )
        try:
            output = await self._attempt(
                state, branch, args, name, key, agent, item, attempt, feedback
            )
        except NotStarted as e:
            # the budget was spent before its first turn was sent: the agent did nothing
            branch.close()
            self._not_started(state, name, key, agent, attempt, e.spent, started=started)
            return False
        except Exception as e:
            # what an agent step's turns did before the error (None for other steps, or when
            # no turn ran): taken even for a retry, which starts afresh
            cut_short = self.turns.take_interrupted(name)
            error = describe(e)
            kind = error_kind(e)
            # a turn whose node was lost may have been sent: its outcome is unknown, and a
            # retry would send it again (a resume is the user's choice)
            if attempt <= step.retries and kind != "node-lost":
                return self._retry(step, key, agent, error, attempt)
            state.failures[key] = error
            state.failure_kinds[key] = kind
            state.last[key] = e
            if cut_short is not None:
                # recorded as any failed instance is: its changes kept, never merged
                failed = attrs.evolve(cut_short, status="failed", error=error, error_kind=kind)
                diffs = self.dirs.take_diffs(branch)
                recorder.finish(
                    name, step, key, agent, failed, branch, attempt, started, diffs,
                    traceback=user_traceback(e),
                )  # fmt: skip
                return False
            recorder.record(
                name,
                step,
                key,
                agent,
                "failed",
                attempt,
                started=started,
                error=error,
                error_kind=kind,
                traceback=user_traceback(e),
            )
            recorder.emit(
                RunEvent(
                    "step_failed",
                    self.run_id,
                    step.name,
                    key,
                    agent,
                    {"error": error, "errorKind": kind},
                )
            )
            return False
        except BaseException:
            # Cancelled (Ctrl-C), alone or in a group with the clean-up's own: a turn it cut
            # short was harvested, keep what it did
            cut_short = self.turns.take_interrupted(name)
            if cut_short is not None:
                diffs = self.dirs.take_diffs(branch)
                recorder.finish(name, step, key, agent, cut_short, branch, attempt, started, diffs)
            raise
        if (
            isinstance(output, StepResult)
            and output.error_kind == "check"
            and attempt <= step.retries
        ):
            # no round passed the check: the whole loop starts again on a fresh branch
            return self._retry(step, key, agent, output.error, attempt)
        state.last[key] = output
        if isinstance(output, StepResult) and not output.ok:
            state.failures[key] = output.error or "failed"
            state.failure_kinds[key] = output.error_kind or "internal"
        else:
            state.outputs[key] = output
            state.branches.append(branch)
            self.branch_keys[branch.name] = key
        diffs = self.dirs.take_diffs(branch)
        recorder.finish(name, step, key, agent, output, branch, attempt, started, diffs)
        return False

    def _not_started(
        self,
        state: StepState,
        name: str,
        key: str | None,
        agent: str | None,
        attempt: int,
        spent: str,
        *,
        started: float | None = None,
    ) -> None:
        """Record instance ``name`` skipped: the run's budget is ``spent``. Its step fails (its
        dependants are skipped), and a resume runs it (only succeeded instances are reused)."""
        step = state.step
        error = f"not started: the budget is spent ({spent})"
        state.failures[key] = error
        state.failure_kinds[key] = "budget"
        self.recorder.record(
            name, step, key, agent, "skipped", attempt,
            started=started, error=error, error_kind="budget",
        )  # fmt: skip
        self.recorder.emit(
            RunEvent(
                "step_skipped",
                self.run_id,
                step.name,
                key,
                agent,
                {"cause": error, "error": error, "errorKind": "budget"},
            )
        )

    def _retry(
        self, step: Step, key: str | None, agent: str | None, error: str | None, attempt: int
    ) -> bool:
        """Announce that attempt ``attempt`` failed with ``error`` and another follows: True."""
        self.recorder.emit(
            RunEvent(
                "step_retry",
                self.run_id,
                step.name,
                key,
                agent,
                {"error": error, "attempt": attempt},
            )
        )
        return True

    async def _attempt(
        self,
        state: StepState,
        branch: Branch,
        args: Mapping[str, Any],
        name: str,
        key: str | None,
        agent: str | None,
        item: Any,
        attempt: int,
        feedback: CheckResult | None = None,
    ) -> Any:
        step = state.step
        ctx = StepContext(
            run_id=self.run_id,
            step=step.name,
            key=key,
            agent=agent,
            workspace=self.workspace,
            inputs=self.inputs,
            attempt=attempt,
        )
        call_args = {k: v for k, v in args.items() if k in step.params}
        if "ctx" in step.params:
            call_args["ctx"] = ctx
        if "item" in step.params:
            call_args["item"] = item
        needs_dir = agent is not None or step.wants_workdir
        if not needs_dir:
            return await call(step.fn, call_args)
        if agent is not None and self.remote is not None:
            return await self._remote_turn(
                step, branch, call_args, name, key, agent, item, attempt, feedback
            )
        workdir = await self.dirs.materialize(
            branch, name, attempt, max_file_size=step.max_file_size
        )
        try:
            if "workdir" in step.params:
                call_args["workdir"] = Path(workdir.root)
            if agent is None:
                value = await call(step.fn, call_args)
                await self.dirs.harvest(workdir)
                return value
            prompt = await call(step.fn, call_args, inline=True)
            return await self.turns.turn(
                step, name, key, agent, item, prompt, workdir, attempt, feedback=feedback
            )
        finally:
            # removed in the background: nothing the step reports depends on it
            self.dirs.remove(workdir)

    async def _remote_turn(
        self,
        step: Step,
        branch: Branch,
        call_args: dict[str, Any],
        name: str,
        key: str | None,
        agent: str,
        item: Any,
        attempt: int,
        feedback: CheckResult | None,
    ) -> StepResult:
        """The agent turn of an instance, run by :attr:`remote` on a copy of ``branch``; the
        branch takes what it changed. A failure is raised as a local turn's would be, what the
        turn did before it kept (see :meth:`AgentTurns.take_interrupted`)."""
        assert self.remote is not None
        turns = self.turns
        spec = turns.specs[agent]
        sandbox = turns.sandboxes.get((step.name, agent))
        prompt = None
        if "workdir" not in step.params:  # else the node calls the step function there
            prompt = await call(step.fn, call_args, inline=True)
        request = RemoteTurn(
            run_id=self.run_id,
            step=step,
            name=name,
            key=key,
            agent=agent,
            spec=spec,
            policy=turns.policy_for(step, spec),
            sandbox=sandbox,
            mcp_servers=tuple(turns.mcp_servers.get((step.name, agent), ())),
            verify=turns.verify.get(step.name),
            item=item if item is not MISSING else None,
            no_item=item is MISSING,
            prompt=prompt,
            call_args=call_args if prompt is None else {},
            attempt=attempt,
            feedback=feedback,
            max_file_size=step.max_file_size
            if step.max_file_size is not None
            else self.dirs.max_file_size,
            max_turn_record_bytes=self.recorder.max_turn_bytes,
        )

        def take(reply: RemoteReply) -> tuple[StepResult | None, RemoteTurnFailed | None]:
            result, failure = run_remote(reply, branch, self.recorder)
            budget = self.budget
            if budget is not None:  # what the sessions used counts here too
                for session, used, cost in reply.usage:
                    budget.observe(session, used, cost, run=self.run_id)
                    budget.settle(session, run=self.run_id)
            return result, failure

        def cancelled(reply: RemoteReply) -> None:
            # what a cancelled turn did is kept, as a local one's is
            result, _ = take(reply)
            if result is not None:
                turns.keep_interrupted(name, result)

        reply = await self.remote.run_turn(request, branch, on_cancelled=cancelled)
        if reply.not_started is not None:
            raise NotStarted(reply.not_started)
        result, failure = take(reply)
        if failure is not None:
            if result is not None:
                turns.keep_interrupted(name, result)
            raise failure
        assert result is not None
        return result


def _going_on(
    continued: tuple[StepRecord, Branch] | None, has_check: bool
) -> tuple[Branch, CheckResult] | None:
    """The branch and last check an instance's new loop of rounds goes on from, if any."""
    if continued is None or not has_check:
        return None
    record, branch = continued
    result = StepResult.from_json(record.result) if record.result is not None else None
    if result is None or not result.rounds or result.rounds[-1].check is None:
        return None
    return branch, result.rounds[-1].check


def reuse_branch(
    base: Branch | MergeResult | Snapshot, recorded: Branch, *, close: bool = True
) -> Branch:
    """The branch of a reused instance: forked from what the instance starts from in this
    attempt, as a fresh run's would be, holding what ``recorded`` holds.

    ``recorded`` is the instance's branch rebuilt from the run store, over the run's snapshot
    (an instance's changes are stored relative to it). Merged as it is, it would share no base
    but the snapshot with its parents' and siblings' branches: what they changed in common
    (a file their ancestor created) would conflict with itself.
    """
    branch = fork_from(base, recorded.name)
    # what its parents changed is in the fork already; where the instance's content differs
    # (its own changes, or a parent's change it undid) it takes the recorded one
    for path in recorded.changes.keys() | branch.net_changes().keys():
        branch.set_state(path, recorded.state(path))
    if close:  # finished: it no longer counts for early warnings
        branch.close()
    return branch


def fork_from(base: Branch | MergeResult | Snapshot, name: str) -> Branch:
    """A new branch ``name`` over what a step starts from (its parents' branch, merge or none)."""
    if isinstance(base, Branch):
        return base.fork(name)
    if isinstance(base, MergeResult):
        return base.fork(name)
    return Branch.from_tree(base, name)
