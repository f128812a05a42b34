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
from typing import Any

import trio
from attrs import frozen

from .agent.client import ClientOptions, open_agent
from .agent.elicitation import PolicyElicitationService
from .agent.permissions import Escalate, PolicyPermissionService
from .agent.services import ClientServices, PermissionRecord
from .agent.terminals import open_terminal_service
from .agent.transcript import TranscriptWriter
from .agent.turn import TurnResult
from .agents import AgentSpec, resolve_agent
from .errors import UsageError
from .policy import PolicySet
from .protocol import types as t

__all__ = ["PromptRun", "load_policy", "prompt", "prompt_sync"]


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
) -> PromptRun:
    """Start ``agent``, open a session in ``cwd``, run one turn with ``text``, shut it down.

    Permission requests are answered by ``policy`` (a preset name, a TOML file or a
    :class:`PolicySet`; default: reject everything), with ``escalate`` called for ``ask``
    verdicts. The agent gets real terminals whose commands the same policy vets. Passing
    ``services`` replaces all of that.
    """
    spec = resolve_agent(agent) if isinstance(agent, str) else agent
    root = Path(cwd).absolute()
    if not root.is_dir():
        raise UsageError(f"--cwd {root} is not a directory")
    policy_set = load_policy(policy)
    writer = TranscriptWriter(transcript, agent=spec.name) if transcript else None
    started = time.monotonic()
    permission = PolicyPermissionService(policy_set, escalate=escalate)
    # the terminal vets commands with the same service, so a command a human approved runs
    async with open_terminal_service(command_check=permission.check_command) as terminals:
        if services is None:
            services = ClientServices(
                terminal=terminals,
                permission=permission,
                elicitation=PolicyElicitationService.from_policy(policy_set),
            )
        return await _prompt_with(
            spec, text, root, services, options, writer, timeout, idle_timeout, on_update, started
        )


async def _prompt_with(
    spec: AgentSpec,
    text: str,
    root: Path,
    services: ClientServices,
    options: ClientOptions | None,
    writer: TranscriptWriter | None,
    timeout: float | None,
    idle_timeout: float | None,
    on_update: Callable[[t.SessionUpdate], None] | None,
    started: float,
) -> PromptRun:
    async with open_agent(
        list(spec.command),
        name=spec.name,
        cwd=root,
        env=dict(spec.env) or None,
        services=services,
        options=options,
        transcript=writer,
    ) as conn:
        session = await conn.new_session(root)
        result = await session.prompt(
            text, timeout=timeout, idle_timeout=idle_timeout, on_update=on_update
        )
        return PromptRun(
            run_id=uuid.uuid4().hex[:12],
            agent=spec,
            agent_info=conn.agent_info,
            session_id=session.session_id,
            turn=result,
            wall_seconds=time.monotonic() - started,
        )


def prompt_sync(agent: str | AgentSpec, text: str, **kwargs: Any) -> PromptRun:
    """:func:`prompt` for scripts: runs its own trio loop."""

    async def run() -> PromptRun:
        return await prompt(agent, text, **kwargs)

    return trio.run(run)
