"""What the runner's parts share: the session pool it leases from and a step's progress."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

import trio
from attrs import define, field

from ..agent.client import AcpSession
from ..agent.content import PromptInput
from ..agent.services import ClientServices
from ..agent.turn import TurnResult
from ..agents import AgentSpec
from ..errors import ErrorKind
from ..protocol import types as t
from ..vfs import Branch
from .results import Results, StepStatus
from .spec import Step

__all__ = ["AgentPool", "LeaseLike", "StepState"]


class LeaseLike(Protocol):
    """What the runner needs of a leased session."""

    @property
    def session(self) -> AcpSession: ...

    async def prompt(
        self,
        prompt: PromptInput,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        on_update: Callable[[t.SessionUpdate], None] | None = None,
    ) -> TurnResult: ...


class AgentPool(Protocol):
    """Where agent steps get their sessions (the supervisor satisfies it)."""

    def lease(
        self,
        spec: AgentSpec,
        *,
        cwd: str | os.PathLike[str],
        services: ClientServices | None = None,
        step: str | None = None,
        mcp_servers: Sequence[t.McpServer] = (),
        instance: str | None = None,
    ) -> AbstractAsyncContextManager[LeaseLike]: ...


@define(eq=False)
class StepState:
    """A step's progress in one run."""

    step: Step
    status: StepStatus = "pending"
    done: trio.Event = field(factory=trio.Event)
    #: instance key (None for a single instance) -> its result or value
    outputs: dict[str | None, Any] = field(factory=dict)
    #: the branches of the succeeded instances, for the step's dependents
    branches: list[Branch] = field(factory=list)
    error: str | None = None
    #: why it failed, as a kind (see :data:`~orchestrator.errors.ErrorKind`)
    error_kind: ErrorKind | None = None
    cause: str | None = None
    started: float | None = None
    finished: float | None = None
    #: instances failed (for the summary)
    failures: dict[str | None, str] = field(factory=dict)
    #: the kind of each failure in :attr:`failures`
    failure_kinds: dict[str | None, ErrorKind] = field(factory=dict)
    #: the failed step a skip comes from (through skipped steps), if any
    root_failure: str | None = None
    #: conflicts found merging the parents: (conflict JSON)
    conflicts: list[dict[str, Any]] = field(factory=list)
    #: each instance's last outcome in this process, failed ones too: its result or value,
    #: or the exception it raised (what a caller of a one-step run re-raises)
    last: dict[str | None, Any] = field(factory=dict)

    def value(self) -> Any:
        """What a dependent receives."""
        if self.step.fans_out:
            return Results(self.step.name, {str(k): v for k, v in self.outputs.items()})
        return self.outputs.get(None)
