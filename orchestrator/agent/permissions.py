"""The permission service that answers ``session/request_permission`` by policy.

:class:`PolicyPermissionService` adapts the client's :class:`~.services.PermissionService`
Protocol to :class:`orchestrator.policy.PolicySet`: it turns the ACP request into a
:class:`~orchestrator.policy.PermissionQuery`, remembers "always" answers per session, escalates
``ask`` verdicts to an async callback (no answer within the timeout rejects), picks the agent's
option by kind, and keeps an audit trail with one log line per decision. Install it with
``ClientServices(permission=PolicyPermissionService(policy_set, escalate=...))``.

The command line's escalation (the question asked at the terminal) lives with the command line
(:mod:`orchestrator.cli.escalation`). For the terminal service's optional command check use
:meth:`PolicyPermissionService.check_command` (the policy, plus the commands this service
allowed in the session, so a command a human approved can run) or :func:`policy_command_check`
(the policy alone). Both decide on the command line and the variables the request sets, refuse
with :class:`~orchestrator.errors.CommandRefused` carrying the refusal's audit record, and hand
an allowed start's record to the session (:attr:`~.services.SessionContext.audit`). Paths are
placed through the filesystem (``os.path.realpath``): a symlink in the session directory that
leads outside it counts as the place it leads to; a command's globs are matched there
(``glob.iglob``), and one that matches, at any of its directory levels, a path leading
outside is outside.
"""

from __future__ import annotations

import glob
import os
import shlex
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Literal, get_args

import trio
from attrs import define, field, frozen

from orchestrator._env import is_free, is_switch
from orchestrator.errors import CommandRefused
from orchestrator.policy import (
    COMMAND_ENVIRONMENT,
    OUTSIDE_WORKSPACE,
    Answer,
    Evaluation,
    OfferedOption,
    PermissionQuery,
    PolicySet,
    choose_option,
    memory_key,
    parse_command,
)

from .._log import get_logger
from ..protocol import types as t
from .services import PermissionDecision, PermissionRecord, SessionContext, Verdict

__all__ = [
    "TERMINAL_CREATE",
    "CommandVerdict",
    "Escalate",
    "Escalation",
    "PolicyPermissionService",
    "command_key",
    "policy_command_check",
    "query_from_request",
]

log = get_logger(__name__)


@frozen
class Escalation:
    """A request whose rule said ``ask``: what the human (or program) decides about."""

    query: PermissionQuery
    evaluation: Evaluation
    ctx: SessionContext

    @property
    def rule(self) -> str:
        """The rule that asked."""
        return self.evaluation.rule

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths the request touches (absolute)."""
        return self.evaluation.facts.paths

    @property
    def command(self) -> str | None:
        """The command line, when there is one."""
        command = self.evaluation.facts.command
        return command.line if command is not None else None

    @property
    def env(self) -> tuple[str, ...]:
        """Names of the variables the command sets (in the request or in its line)."""
        return self.evaluation.facts.env


#: An escalation callback: answer ``allow``, ``allow_always``, ``reject``, ``reject_always``, or
#: None for "no answer" (which rejects). It must let ``trio.Cancelled`` through.
Escalate = Callable[[Escalation], Awaitable[Answer | None]]


def query_from_request(request: t.RequestPermissionRequest, ctx: SessionContext) -> PermissionQuery:
    """The policy's view of an ACP permission request."""
    call = request.tool_call
    locations = [location.path for location in call.locations or ()]
    locations += [item.path for item in call.content or () if isinstance(item, t.Diff)]
    return PermissionQuery(
        tool_call_id=call.tool_call_id,
        kind=call.kind,
        title=call.title,
        root=ctx.cwd,
        options=tuple(OfferedOption(o.option_id, o.kind, o.name) for o in request.options),
        agent=ctx.agent,
        session_id=ctx.session_id,
        step=ctx.step,
        locations=tuple(locations),
        raw_input=call.raw_input,
    )


@define
class PolicyPermissionService:
    """Answers permission requests by policy, with escalation, memory and an audit trail.

    An "always" answer (from a rule or an escalation) is remembered per session and answers
    later requests of the same kind (and, for ``execute``, the same command line) with rule
    ``remembered: <rule>``; memory never overrides a reject of the rules, nor the workspace
    boundary. ``ask_timeout`` overrides the policy set's. ``records`` is the audit trail of
    every decision this service made, in order (including requests cancelled while pending).
    """

    policy: PolicySet
    escalate: Escalate | None = None
    ask_timeout: float | None = None
    records: list[PermissionRecord] = field(factory=list)
    _memory: dict[str, dict[tuple[str, str | None], tuple[Answer, str]]] = field(
        factory=dict, init=False, repr=False
    )
    # Command lines allowed per session: once (a count) or always, for check_command.
    _approved_once: dict[str, Counter[str]] = field(factory=dict, init=False, repr=False)
    _approved_always: dict[str, set[str]] = field(factory=dict, init=False, repr=False)

    async def request_permission(
        self, request: t.RequestPermissionRequest, ctx: SessionContext
    ) -> PermissionDecision:
        """Decide one request (cancellable: a cancelled request is recorded, then re-raised)."""
        query = query_from_request(request, ctx)
        evaluation = self.policy.evaluate(query, realpath=_realpath, glob=_glob)
        try:
            answer, rule = await self._answer(query, evaluation, ctx)
        except trio.Cancelled:
            self._record(query, evaluation, "cancelled", None, "cancelled")
            raise
        if answer.endswith("_always") and not rule.startswith("remembered: "):
            remembered = self._memory.setdefault(ctx.session_id, {})
            remembered[memory_key(evaluation.facts)] = (answer, rule)
        choice = choose_option(answer, query.options)
        command = evaluation.facts.command
        if choice.verdict == "allow" and command is not None and query.kind == "execute":
            key, session = command_key(command.line), ctx.session_id
            if answer == "allow_always":
                self._approved_always.setdefault(session, set()).add(key)
            else:
                self._approved_once.setdefault(session, Counter())[key] += 1
        record = self._record(query, evaluation, choice.verdict, choice.option_id, rule)
        outcome: t.RequestPermissionOutcome = (
            t.SelectedPermissionOutcome(option_id=choice.option_id)
            if choice.option_id is not None
            else t.CancelledRequestPermissionOutcome()
        )
        return PermissionDecision(outcome, record)

    def cancelled_record(
        self, request: t.RequestPermissionRequest, ctx: SessionContext
    ) -> PermissionRecord | None:
        """The record this service made when ``request`` was cancelled while pending."""
        tool_call_id = request.tool_call.tool_call_id
        for record in reversed(self.records):
            if (
                record.verdict == "cancelled"
                and record.session_id == ctx.session_id
                and record.tool_call_id == tool_call_id
            ):
                return record
        return None

    def forget_session(self, session_id: str) -> None:
        """Drop what was remembered for a session (call when it ends)."""
        self._memory.pop(session_id, None)
        self._approved_once.pop(session_id, None)
        self._approved_always.pop(session_id, None)

    def check_command(
        self, command_line: str, env: Mapping[str, str], ctx: SessionContext
    ) -> CommandVerdict:
        """The terminal service's command check: the policy, or an approval given here.

        ``env`` is what the request sets on top of the terminal's environment. A command this
        service allowed in a permission request of the same session (by a rule, an escalation
        or from memory) may start: once per "allow once", any number of times after "allow
        always"; an approval never lets a command set a variable no rule allows (beyond
        :data:`~orchestrator.policy.FREE_ENV`). Returns ``"allow"``, and hands the audit record
        of the allowed start to ``ctx.audit``; a refusal raises
        :class:`~orchestrator.errors.CommandRefused` with its audit record. Either record is
        also kept in :attr:`records`. Install with ``open_terminal_service(command_check=...)``.
        """
        query, evaluation = _evaluate_command(self.policy, command_line, env, ctx)
        verdict: CommandVerdict = "allow" if evaluation.verdict.startswith("allow") else "reject"
        rule = evaluation.rule
        key, session = command_key(command_line), ctx.session_id
        once = self._approved_once.get(session, Counter())
        # an approval was given for the command line alone: not for what the request's env
        # changes, nor beyond the workspace
        binding = rule == OUTSIDE_WORKSPACE or rule.startswith(COMMAND_ENVIRONMENT)
        plain = all(is_free(name) or is_switch(name, value) for name, value in env.items())
        if verdict == "reject" and not binding and plain:
            if key in self._approved_always.get(session, ()):
                verdict, rule = "allow", "approved always in this session"
            elif once[key] > 0:
                once[key] -= 1
                verdict, rule = "allow", "approved once in this session"
        return _conclude(query, evaluation, ctx, verdict, rule, self.records)

    def audit_json(self) -> list[dict[str, object]]:
        """The audit trail as JSON values, for ``--json`` output."""
        return [record.to_json() for record in self.records]

    async def _answer(
        self, query: PermissionQuery, evaluation: Evaluation, ctx: SessionContext
    ) -> tuple[Answer, str]:
        await trio.lowlevel.checkpoint()  # a request arriving after session/cancel is cancelled
        if evaluation.rule != OUTSIDE_WORKSPACE:
            key = memory_key(evaluation.facts)
            remembered = self._memory.get(ctx.session_id, {}).get(key)
            # Memory saves a question or tightens; it never overrides a rule's reject.
            if remembered is not None and (
                remembered[0].startswith("reject") or not evaluation.verdict.startswith("reject")
            ):
                return remembered[0], f"remembered: {remembered[1]}"
        if evaluation.verdict != "ask":
            return evaluation.verdict, evaluation.rule
        return await self._escalate(Escalation(query, evaluation, ctx))

    async def _escalate(self, escalation: Escalation) -> tuple[Answer, str]:
        rule = escalation.rule
        if self.escalate is None:
            return "reject", f"{rule} (ask: no escalation configured)"
        timeout = self.ask_timeout if self.ask_timeout is not None else self.policy.ask_timeout
        answer: Answer | None = None
        with trio.move_on_after(timeout) as scope:
            try:
                answer = await self.escalate(escalation)
            except Exception as exc:
                log.warning("permission escalation failed", rule=rule, error=repr(exc))
                return "reject", f"{rule} (ask: escalation failed)"
        if scope.cancelled_caught:
            return "reject", f"{rule} (ask: no answer in {timeout:g}s)"
        if answer is None or answer not in get_args(Answer):
            return "reject", f"{rule} (ask: no answer)"
        return answer, f"{rule} (ask: {answer})"

    def _record(
        self,
        query: PermissionQuery,
        evaluation: Evaluation,
        verdict: Verdict,
        option_id: str | None,
        rule: str,
    ) -> PermissionRecord:
        record = _record_of(query, evaluation, verdict, option_id, rule)
        self.records.append(record)
        # debug: the record is the report (the session's decisions, a run's progress event)
        log.debug("permission decision", **record.to_json())
        return record


def _realpath(path: str) -> str:
    """``path`` with its symlinks followed as far as they exist (lexical if it cannot be
    looked up at all, e.g. it holds a NUL byte)."""
    try:
        return os.path.realpath(path)
    except ValueError:
        return path


def _glob(pattern: str) -> Iterator[str]:
    """What an absolute glob matches now, hidden names included (a shell may set dotglob)."""
    try:
        return glob.iglob(pattern, include_hidden=True)
    except ValueError:  # a NUL byte
        return iter(())


# --------------------------------------------------------------------------- terminal check

CommandVerdict = Literal["allow", "reject"]
#: the tool call id of the audit record of a terminal command the check decided
TERMINAL_CREATE = "terminal/create"


def _split(line: str) -> list[str] | None:
    try:
        return shlex.split(line)
    except ValueError:
        return None


def command_key(line: str) -> str:
    """A command line normalized for comparison: re-quoted, ``sh -c`` wrappers removed."""
    argv = _split(line)
    if not argv:
        return line
    inner = parse_command(argv).line
    return inner if inner == shlex.join(argv) else command_key(inner)


def _evaluate_command(
    policy: PolicySet, line: str, env: Mapping[str, str], ctx: SessionContext
) -> tuple[PermissionQuery, Evaluation]:
    argv = _split(line)
    # A wrapper (``bash -lc "..."``) as argv so the policy sees the inner line; anything else
    # stays a shell line, whose operators the policy understands.
    wrapped = argv is not None and parse_command(argv).line != shlex.join(argv)
    query = PermissionQuery(
        tool_call_id=TERMINAL_CREATE,
        kind="execute",
        title=line,
        root=ctx.cwd,
        agent=ctx.agent,
        session_id=ctx.session_id,
        step=ctx.step,
        raw_input={"command": argv if wrapped else line},
        # a plain switch (CLAUDECODE=1) cannot change what runs: the policy decides the rest
        env=tuple(name for name, value in env.items() if not is_switch(name, value)),
    )
    return query, policy.evaluate(query, realpath=_realpath, glob=_glob)


def _record_of(
    query: PermissionQuery,
    evaluation: Evaluation,
    verdict: Verdict,
    option_id: str | None,
    rule: str,
) -> PermissionRecord:
    """The audit record of a decision on ``query``, now."""
    facts = evaluation.facts
    return PermissionRecord(
        time=time.time(),
        agent=query.agent,
        session_id=query.session_id,
        step=query.step,
        tool_call_id=query.tool_call_id,
        kind=query.kind,
        title=query.title,
        verdict=verdict,
        option_id=option_id,
        rule=rule,
        paths=facts.paths,
        command=facts.command.line if facts.command is not None else None,
    )


def _conclude(
    query: PermissionQuery,
    evaluation: Evaluation,
    ctx: SessionContext,
    verdict: CommandVerdict,
    rule: str,
    records: list[PermissionRecord] | None = None,
) -> CommandVerdict:
    """A command check's end: logged, audited (in ``records`` too), a refusal raised."""
    log.info(
        "terminal command checked",
        agent=ctx.agent,
        sessionId=ctx.session_id,
        command=query.title,
        verdict=verdict,
        rule=rule,
    )
    record = _record_of(query, evaluation, verdict, None, rule)
    if records is not None:
        records.append(record)
    if verdict == "reject":
        raise CommandRefused(f"terminal command rejected by policy: {query.title}", record=record)
    if ctx.audit is not None:
        ctx.audit(record)
    return verdict


def policy_command_check(
    policy: PolicySet,
) -> Callable[[str, Mapping[str, str], SessionContext], CommandVerdict]:
    """A command check for the terminal service: the policy's verdict on an ``execute``.

    ``ask`` counts as reject here (the check is synchronous); a refusal raises
    :class:`~orchestrator.errors.CommandRefused` with its audit record, an allowed command's
    record goes to ``ctx.audit``. Prefer
    :meth:`PolicyPermissionService.check_command`, which also honours what a human approved.
    """

    def check(command_line: str, env: Mapping[str, str], ctx: SessionContext) -> CommandVerdict:
        query, evaluation = _evaluate_command(policy, command_line, env, ctx)
        verdict: CommandVerdict = "allow" if evaluation.verdict.startswith("allow") else "reject"
        return _conclude(query, evaluation, ctx, verdict, evaluation.rule)

    return check
