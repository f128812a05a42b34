"""Agent steps of a run: which agents they name, under which policy, and one turn of a session."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
from attrs import define, field

from .._util import single_error
from .._words import count
from ..agent.branch_services import BranchServices, open_branch_services
from ..agent.client import AcpSession
from ..agent.content import PromptInput
from ..agent.permissions import Escalate
from ..agent.services import ClientServices
from ..agent.turn import TurnResult
from ..agents import AgentSpec, label_agents
from ..errors import ErrorKind, TurnTimeout, UsageError
from ..mcp import McpServer
from ..policy import PolicySet
from ..protocol import types as t
from ..sandbox import Sandbox
from ..vfs import Branch, Workdir
from ._branchio import BranchDirs
from ._branchstate import state_of
from ._budget import RunBudget
from ._calls import jsonable, prompt_input, run_verify, update_event
from ._recording import Recorder, call_listener
from ._rounds import feedback_prompt, run_check, with_feedback
from ._state import AgentPool, LeaseLike
from .branches import change_kinds, symlink_targets
from .results import (
    CheckResult,
    RoundResult,
    RunEvent,
    StepResult,
    StepStatus,
    VerifyResult,
    agent_failure,
    check_failure,
)
from .spec import Pipeline, Step

__all__ = ["AgentTurns", "label_run_agents"]


def label_run_agents(
    pipeline: Pipeline,
    resolve: Callable[[str], AgentSpec],
    *,
    base: str | os.PathLike[str] | None = None,
) -> dict[str, AgentSpec]:
    """Every agent the steps name, by how they name it, under its label for the run.

    Labels are given in definition order (:func:`~orchestrator.agents.label_agents`), so a
    pipeline gets the same labels on every run whatever order its steps run in. A step that
    names one agent twice (``demo`` and the demo agent's command line) is refused: its
    branches are keyed by label.
    """
    texts = list(dict.fromkeys(a for s in pipeline.steps.values() for a in s.agents))
    agents = dict(zip(texts, label_agents(texts, resolve, base=base), strict=True))
    for s in pipeline.steps.values():
        seen: dict[str, str] = {}
        for text in s.agents:
            label = agents[text].name
            if label in seen:
                raise UsageError(
                    f"step {s.name}: {seen[label]!r} and {text!r} are the same agent ({label});"
                    " label them with NAME=COMMAND to run it twice"
                )
            seen[label] = text
    return agents


async def _within_budget(
    lease: LeaseLike,
    exceeded: trio.Event,
    prompt: PromptInput,
    *,
    timeout: float | None,
    idle_timeout: float | None,
    on_update: Callable[[t.SessionUpdate], None],
    watch: Callable[[], Awaitable[None]] | None = None,
) -> TurnResult:
    """One turn of ``lease``'s session, cancelled the ACP way once ``exceeded`` is set;
    ``watch`` runs beside it (it sets ``exceeded`` when the run's budget is spent)."""
    # Ctrl-C cancels both tasks: the caller's ``except trio.Cancelled`` must see one Cancelled
    with single_error():
        async with trio.open_nursery() as nursery:

            async def cancel_on_budget() -> None:
                await exceeded.wait()
                await lease.session.cancel()

            nursery.start_soon(cancel_on_budget)
            if watch is not None:
                nursery.start_soon(watch)
            turn = await lease.prompt(
                prompt, timeout=timeout, idle_timeout=idle_timeout, on_update=on_update
            )
            nursery.cancel_scope.cancel()
    return turn


def _time_left(step: Step, agent: str, timeout: float, started: float, number: int) -> float:
    """What is left of the step's ``timeout`` for round ``number``: the step's time (and its
    budget's) spans every round; none left is a :class:`TurnTimeout`."""
    left = timeout - (time.monotonic() - started)
    if left <= 0:
        raise TurnTimeout(
            f"step {step.name} ran out of its {timeout:g}s after {count(number - 1, 'round')}",
            agent=agent,
        )
    return left


@define(eq=False)
class AgentTurns:
    """The agents of one run and their turns: a session leased from :attr:`pool` per turn."""

    run_id: str
    pool: AgentPool
    #: every agent of the run under its label, by how steps name it (:func:`label_run_agents`)
    agents: Mapping[str, AgentSpec]
    recorder: Recorder
    dirs: BranchDirs
    #: the run's policy, for agents and steps that name none
    policy: PolicySet
    load_policy: Callable[[str], PolicySet]
    escalate: Escalate | None
    #: verify commands by step name
    verify: Mapping[str, str]
    #: the specs of the agents in use, by label ("alice=demo" runs the demo agent as alice)
    specs: dict[str, AgentSpec] = field(factory=dict)
    #: a callback for every session update of every turn (the prompt command streams them)
    on_update: Callable[[t.SessionUpdate], None] | None = None
    #: the session services' replacement (permission, terminal, elicitation), if any
    services: ClientServices | None = None
    #: the sandbox of each (step, agent label) whose agent runs confined
    sandboxes: Mapping[tuple[str, str], Sandbox] = field(factory=dict)
    #: the MCP servers of each (step, agent label) whose sessions get some
    mcp_servers: Mapping[tuple[str, str], tuple[McpServer, ...]] = field(factory=dict)
    #: the budget the run shares with others, if any: every usage update of every turn counts
    #: against it; once spent, no turn starts (nor a round), and with ``on_spent="cancel"``
    #: running turns are cancelled
    budget: RunBudget | None = None
    #: policies by name, loaded once per run
    _policies: dict[str, PolicySet] = field(init=False, factory=dict)
    #: the policy of each (step, agent), narrowed once per run
    _scoped: dict[tuple[str, str], PolicySet] = field(init=False, factory=dict)
    #: results of turns cut short by cancellation or an error, by instance name (see
    #: take_interrupted)
    _interrupted: dict[str, StepResult] = field(init=False, factory=dict)

    def use(self, names: Sequence[str]) -> list[str]:
        """The labels of the agents a step names."""
        specs = [self.agents[a] for a in names]
        self.specs.update((spec.name, spec) for spec in specs)
        return [spec.name for spec in specs]

    def policy_for(self, step: Step, spec: AgentSpec) -> PolicySet:
        """The policy a turn of ``spec`` in ``step`` runs under.

        One mechanism: the step's policy and the agent's narrow the run's as scopes of it
        (:meth:`PolicySet.narrowed`), tried step first, then agent, then the run's own rules.
        """
        key = (step.name, spec.name)
        policy = self._scoped.get(key)
        if policy is None:
            policy = self.policy
            if spec.policy:
                policy = policy.narrowed(f"agent:{spec.name}", self._named(spec.policy))
            if step.policy:
                policy = policy.narrowed(f"step:{step.name}", self._named(step.policy))
            self._scoped[key] = policy
        return policy

    def _named(self, name: str) -> PolicySet:
        # loaded once per run: every step of the run sees the same rules
        policy = self._policies.get(name)
        if policy is None:
            policy = self._policies[name] = self.load_policy(name)
        return policy

    def take_interrupted(self, name: str) -> StepResult | None:
        """The result of instance ``name``'s turns if cancellation or an error cut them short,
        forgotten here.

        When :meth:`turn` is cancelled (Ctrl-C) or fails (a timeout, a check or feedback
        function that raises) after a turn ran, a turn in flight is ended the ACP way first;
        then the branch directory is harvested and what the turns did (text, tool calls,
        permission audit, rounds so far, changes) is kept as a result with status
        ``interrupted``, before the exception goes on. The caller that records the instance
        takes it here (and makes it ``failed`` with the error's kind for an error).
        """
        return self._interrupted.pop(name, None)

    def keep_interrupted(self, name: str, result: StepResult) -> None:
        """Keep ``result`` as instance ``name``'s turns cut short (a turn that ran elsewhere:
        see :meth:`take_interrupted`)."""
        self._interrupted[name] = result

    async def turn(
        self,
        step: Step,
        name: str,
        key: str | None,
        agent: str,
        item: Any,
        prompt: Any,
        workdir: Workdir,
        attempt: int,
        *,
        feedback: CheckResult | None = None,
    ) -> StepResult:
        """The work of ``agent`` (a label from :meth:`use`) in ``workdir``, harvested after.

        One turn; with a check, up to ``step.rounds`` turns of the same session, each
        harvested and checked, the next prompted with what the failed check said
        (:mod:`._rounds`). The step's timeout and budget span them all. ``feedback``: the
        last check of an earlier loop on this branch (a resume), told with the first prompt.
        """
        spec = self.specs[agent]
        policy = self.policy_for(step, spec)
        sandbox = self.sandboxes.get((step.name, agent))
        if sandbox is not None:
            # the agent's processes start in it (a pool of their own), as do its terminals
            spec = attrs.evolve(spec, sandbox=sandbox)
        started = time.monotonic()
        budget = step.budget
        timeout = step.timeout
        if budget is not None and budget.max_seconds is not None:
            timeout = min(timeout or budget.max_seconds, budget.max_seconds)
        limit = budget.max_tokens if budget is not None else None
        over_budget: list[int] = []
        check = step.check
        if feedback is not None:
            with _in_time(step, agent, timeout, started, "while its feedback ran"):
                more = await feedback_prompt(step.feedback, feedback, 1)
            prompt = with_feedback(prompt, more)
        # the rounds so far (a step with a check), and the turns before the last one
        rounds: list[RoundResult] = []
        earlier: list[TurnResult] = []
        async with open_branch_services(
            workdir,
            policy,
            escalate=self.escalate,
            replace=self.services,
            env_passthrough=spec.terminal_env,
            sandbox=sandbox,
        ) as made:
            services = made.services
            # the session's step is the step's name, not the instance's (``plan[a]``): what
            # policies scope by (``step:plan``, a rule's ``steps``) in every fan-out alike
            servers = self.mcp_servers.get((step.name, agent), ())
            # the session/new names the instance: what a replay agent picks its recorded
            # session by
            async with self.pool.lease(
                spec,
                cwd=workdir.root,
                services=services,
                step=step.name,
                mcp_servers=[server.to_protocol() for server in servers],
                instance=name,
            ) as lease:
                session = lease.session
                # which session served this attempt, on which process (the transcript's source;
                # a pool that does not say serves the agent from one): what a replay plays
                process = getattr(lease, "process", None)
                source = process if isinstance(process, str) else spec.name
                self.recorder.session(name, attempt, agent, source, session.session_id)
                # the agent's own choice (``claude:sonnet``) is more specific than the step's
                mode = spec.mode or step.mode
                model = spec.model or step.model
                if mode:
                    await session.set_mode(mode)
                if model:
                    await session.set_model(model)
                exceeded = trio.Event()
                # the run's budget, spent: what it said when it cancelled the turn
                # (``cancel``), or when it left a check's next round unstarted
                shared = self.budget
                cancels = shared is not None and shared.on_spent == "cancel"
                run_spent: list[str] = []
                no_round: list[str] = []

                def budget_spent() -> None:
                    # the run's budget cancels the turn, as the step's own does
                    assert shared is not None
                    spent = shared.spent
                    if spent is not None and not exceeded.is_set():
                        run_spent.append(spent)
                        exceeded.set()

                async def watch_budget() -> None:
                    assert shared is not None
                    await shared.wait_spent()
                    budget_spent()

                recorder = self.recorder
                # a listener may decline per-update events (``wants_updates = False``): they
                # cost the typed decoding of every update
                listener = recorder.on_event
                if listener is not None and not getattr(listener, "wants_updates", True):
                    listener = None
                hook = self.on_update

                def on_update(update: t.SessionUpdate) -> None:
                    if hook is not None:
                        # the caller's callback, as on_event's: one that fails is logged and
                        # costs neither the listener, the token budget nor the turn
                        call_listener(hook, update, event_type="session_update")
                    if listener is not None:
                        recorder.notify(update_event(self.run_id, step.name, key, agent, update))
                    if shared is not None and isinstance(update, t.UsageUpdate):
                        cost = update.cost.amount if update.cost is not None else None
                        shared.observe(session, update.used, cost, run=self.run_id)
                        if cancels:
                            # at once, not when the watcher runs: the update that spends the
                            # budget cancels its own turn, whatever else the loop does first
                            budget_spent()
                    if (
                        limit is not None
                        and isinstance(update, t.UsageUpdate)
                        and update.used > limit
                        and not exceeded.is_set()
                    ):
                        over_budget.append(update.used)
                        exceeded.set()

                # updates are only for the listener and the budgets: without them, the turn
                # need not call back at all
                wants_updates = (
                    listener is not None
                    or limit is not None
                    or hook is not None
                    or shared is not None
                )
                number = 0
                # the branch as the round starts: what the round changed is against it
                previous = state_of(workdir.branch) if check is not None else None
                # for a loop ended by an error or cancellation: the last turn that ran, the
                # round it belongs to if not in ``rounds`` yet, and whether its work is harvested
                latest: TurnResult | None = None
                open_round: RoundResult | None = None
                harvested = False
                try:
                    while True:
                        number += 1
                        if number == 1 and shared is not None:
                            # spent since the instance took its slot: the agent is not asked
                            # to start (the instance is recorded skipped)
                            shared.check_within()
                        left = timeout
                        if timeout is not None and number > 1:
                            left = _time_left(step, agent, timeout, started, number)
                        try:
                            if limit is None and not cancels:
                                turn = await lease.prompt(
                                    prompt_input(prompt),
                                    timeout=left,
                                    idle_timeout=step.idle_timeout,
                                    on_update=on_update if wants_updates else None,
                                )
                            else:
                                turn = await _within_budget(
                                    lease,
                                    exceeded,
                                    prompt_input(prompt),
                                    timeout=left,
                                    idle_timeout=step.idle_timeout,
                                    on_update=on_update,
                                    watch=watch_budget if cancels else None,
                                )
                        except BaseException:
                            # what the turn did, whether the agent ended it after
                            # session/cancel or not (stop reason None); None if the prompt
                            # was never sent
                            cut_short = session.last_result
                            if cut_short is not None:
                                latest, harvested = cut_short, False
                                if check is not None:
                                    open_round = RoundResult(number, cut_short.stop_reason)
                            raise
                        latest, harvested = turn, False
                        if check is None:
                            break
                        # the round's work, harvested while the session is kept for the next
                        await self.dirs.harvest(workdir)
                        self._permission_events(step, key, agent, turn)
                        harvested = True
                        assert previous is not None
                        diff = await self.dirs.changes_since(previous, workdir.branch)
                        previous = state_of(workdir.branch)
                        open_round = RoundResult(number, turn.stop_reason, diff=diff)
                        if over_budget or run_spent or turn.stop_reason != "end_turn":
                            # cut short (the budget, the agent's cancel or refusal): no check,
                            # and no next round
                            rounds.append(open_round)
                            open_round = None
                            break
                        outcome = await self._check(
                            step, key, agent, item, turn, lease.session, made, started,
                            attempt, workdir, previous, sandbox, timeout,
                            number=number, last=number == step.rounds, earlier=earlier,
                        )  # fmt: skip
                        rounds.append(RoundResult(number, turn.stop_reason, outcome, diff))
                        open_round = None
                        self.recorder.emit(
                            RunEvent(
                                "step_round",
                                self.run_id,
                                step.name,
                                key,
                                agent,
                                {
                                    "round": number,
                                    "rounds": step.rounds,
                                    "passed": outcome.passed,
                                    "attempt": attempt,
                                },
                            )
                        )
                        if outcome.passed or number >= step.rounds:
                            break
                        spent = shared.spent if shared is not None else None
                        if spent is not None:
                            # no new round once the run's budget is spent
                            no_round.append(spent)
                            break
                        earlier.append(turn)
                        with _in_time(step, agent, timeout, started, "while its feedback ran"):
                            prompt = await feedback_prompt(step.feedback, outcome, number + 1)
                except BaseException:
                    # an error or Ctrl-C after a turn ran (in a turn, a check, a feedback
                    # function): what the turns did so far is kept (see take_interrupted);
                    # what a check wrote is not in it
                    if latest is not None:
                        with trio.CancelScope(shield=True):
                            if not harvested:
                                # what fits is kept; the error goes on whatever is left
                                await self.dirs.harvest(workdir, enforce=False)
                                self._permission_events(step, key, agent, latest)
                        self._interrupted[name] = self._result(
                            step, key, agent, item, latest, lease.session, made, started,
                            attempt, status="interrupted",
                            earlier=[t_ for t_ in earlier if t_ is not latest],
                            rounds=(*rounds, *([open_round] if open_round else [])),
                        )  # fmt: skip
                    raise
                finally:
                    if shared is not None:
                        # the session's turns are over: its figures stay counted
                        shared.settle(session, run=self.run_id)
        if check is None:
            await self.dirs.harvest(workdir)
            self._permission_events(step, key, agent, turn)
        verify = None
        command = self.verify.get(step.name)
        last_check = rounds[-1].check if rounds else None
        if command is not None and command == check and last_check is not None:
            # the verify command is the step's check (a comparison's rounds): it is not run
            # again, its last round says what it would
            assert last_check.exit_code is not None  # a shell command's
            verify = VerifyResult(
                command, last_check.exit_code, last_check.output, last_check.timed_out
            )
        elif command is not None:
            verify = await run_verify(command, Path(workdir.root), sandbox=sandbox)
        error: str | None
        kind: ErrorKind | None = None
        if run_spent:
            error = f"cancelled: the budget is spent ({run_spent[0]})"
            kind = "budget"
        elif over_budget:
            error = f"budget exceeded: {over_budget[0]} tokens > {step.budget.max_tokens}"  # type: ignore[union-attr]
            kind = "budget"
        elif no_round and last_check is not None:
            error = (
                f"{check_failure(last_check, len(rounds))}; round {len(rounds) + 1} not "
                f"started: the budget is spent ({no_round[0]})"
            )
            kind = "budget"
        elif last_check is not None and not last_check.passed:
            error = check_failure(last_check, len(rounds))
            kind = "check"
        else:
            error = agent_failure(turn.stop_reason, verify)
            if error is not None:
                kind = "stopped" if turn.stop_reason != "end_turn" else "verify"
        return self._result(
            step, key, agent, item, turn, lease.session, made, started, attempt,
            status="failed" if error else "succeeded", verify=verify, error=error,
            error_kind=kind, earlier=earlier, rounds=tuple(rounds),
        )  # fmt: skip

    async def _check(
        self,
        step: Step,
        key: str | None,
        agent: str,
        item: Any,
        turn: TurnResult,
        session: AcpSession,
        made: BranchServices,
        started: float,
        attempt: int,
        workdir: Workdir,
        before: Branch,
        sandbox: Sandbox | None,
        timeout: float | None,
        *,
        number: int,
        last: bool,
        earlier: Sequence[TurnResult],
    ) -> CheckResult:
        """Run the step's check on the harvested branch directory, then undo what it wrote
        there (``before`` holds the branch as harvested): it is the pipeline's code, never the
        agent's work.

        A shell check that runs out of the step's time is killed and says it timed out; a
        Python one is abandoned (its thread, if sync, finishes in the background) and the
        instance fails as a timeout: nothing it writes after is harvested, as nothing of a
        failed instance is merged."""
        assert step.check is not None
        result = self._result(
            step, key, agent, item, turn, session, made, started, attempt,
            status="succeeded", earlier=earlier,
        )  # fmt: skip
        left = None if timeout is None else timeout - (time.monotonic() - started)
        if isinstance(step.check, str):
            outcome = await run_check(
                step.check, Path(workdir.root), result, timeout=left, sandbox=sandbox
            )
        else:
            with _in_time(step, agent, timeout, started, f"in round {number}'s check"):
                outcome = await run_check(
                    step.check, Path(workdir.root), result, timeout=None, sandbox=sandbox
                )
        if not last or self.verify.get(step.name, step.check) != step.check:
            # the next round (or a verify command other than the check) sees the agent's
            # work alone
            await self.dirs.discard_writes(workdir, before)
        return outcome

    def _permission_events(self, step: Step, key: str | None, agent: str, turn: TurnResult) -> None:
        for record in turn.permissions:
            self.recorder.emit(
                RunEvent(
                    "permission",
                    self.run_id,
                    step.name,
                    key,
                    agent,
                    {"verdict": record.verdict, "title": record.title, "rule": record.rule},
                )
            )

    def _result(
        self,
        step: Step,
        key: str | None,
        agent: str,
        item: Any,
        turn: TurnResult,
        session: AcpSession,
        made: BranchServices,
        started: float,
        attempt: int,
        *,
        status: StepStatus,
        verify: VerifyResult | None = None,
        error: str | None = None,
        error_kind: ErrorKind | None = None,
        earlier: Sequence[TurnResult] = (),
        rounds: tuple[RoundResult, ...] = (),
    ) -> StepResult:
        """The instance's result from its turn, once its branch is harvested.

        With rounds, ``turn`` is the last one's and ``earlier`` the ones before: the tool
        calls and notices are those of every round, the text and usage the last turn's.
        """
        info = session.connection.agent_info
        branch = made.fs.workdir.branch
        # computed once at the harvest and reused when the instance is recorded
        diffs = self.dirs.diffs(branch)
        audit = made.permission.records if made.permission else turn.permissions
        own = branch.changes
        return StepResult(
            step=step.name,
            key=key,
            agent=agent,
            status=status,
            text=turn.text,
            stop_reason=turn.stop_reason,
            item=jsonable(item),
            agent_info={"name": info.name, "version": info.version} if info else None,
            quirks=session.connection.quirks.ids,
            session_id=session.session_id,
            # what the session ran, as the agent last reported it (chosen or its default)
            model=session.current_choice("model"),
            mode=session.current_choice("mode"),
            tool_calls=tuple(
                c.to_json() for t_ in (*earlier, turn) for c in t_.tool_calls.values()
            ),
            permissions=tuple(p.to_json() for p in audit),
            notices=tuple(n for t_ in (*earlier, turn) for n in t_.notices_json()),
            usage=turn.usage_json(),
            changes=change_kinds(branch.base, own),
            symlinks=symlink_targets(own),
            diff=diffs[2],
            verify=verify,
            error=error,
            error_kind=error_kind,
            wall_seconds=time.monotonic() - started,
            attempt=attempt,
            rounds=rounds,
            turn=turn,
        )


@contextlib.contextmanager
def _in_time(
    step: Step, agent: str, timeout: float | None, started: float, what: str
) -> Iterator[None]:
    """Bound the block by the step's time (``timeout`` seconds from ``started``; None: none),
    raising :class:`TurnTimeout` when it runs out, as a turn that does."""
    if timeout is None:
        yield
        return
    # ``started`` is of time.monotonic(), not of trio's clock
    with trio.move_on_after(max(started + timeout - time.monotonic(), 0)) as scope:
        yield
    if scope.cancelled_caught:
        raise TurnTimeout(f"step {step.name} ran out of its {timeout:g}s {what}", agent=agent)
