"""Client-side services an agent can call: file system, terminals, permission, elicitation.

Each service is an object satisfying a small Protocol; a :class:`ClientServices` bundle is
installed per connection and may be overridden per session. The client advertises exactly the
capabilities of the services installed on the connection (``fs``, ``terminal``,
``elicitation``). Permission requests are always answered: by the permission service if one is
installed, otherwise by :class:`RejectAllPermissions`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, Protocol, runtime_checkable

from attrs import field, frozen

from .._log import get_logger
from ..protocol import types as t

__all__ = [
    "ClientServices",
    "DeclineElicitation",
    "ElicitationService",
    "FileSystemService",
    "NowaitFileSystemService",
    "PermissionDecision",
    "PermissionRecord",
    "PermissionService",
    "RejectAllPermissions",
    "SessionContext",
    "TerminalService",
    "Verdict",
    "reject_outcome",
]

log = get_logger(__name__)

Verdict = Literal["allow", "reject", "cancelled"]


@frozen
class SessionContext:
    """What a service knows about the session a request came from."""

    #: the agent's name
    agent: str
    #: the session id
    session_id: str
    #: the session's working directory (absolute)
    cwd: str
    #: the pipeline step that owns the session, if any
    step: str | None = None
    #: takes the audit record of a decision made outside a permission request (a terminal
    #: command the policy allowed), so the session's permissions list it; None: not audited
    audit: Callable[[PermissionRecord], None] | None = field(default=None, eq=False, repr=False)


@frozen
class PermissionRecord:
    """The audit record of one permission decision."""

    #: wall-clock time of the decision (seconds since the epoch)
    time: float
    #: the agent that asked
    agent: str
    #: the session it asked in
    session_id: str
    #: the tool call the request is about
    tool_call_id: str
    #: the tool kind (read, edit, execute, ...) if the agent said
    kind: str | None
    #: the tool call's title if the agent said
    title: str | None
    #: allow, reject, or cancelled (the turn was cancelled while the request was pending)
    verdict: Verdict
    #: the option id answered, None for a cancelled outcome
    option_id: str | None
    #: the rule that decided, or "default"
    rule: str
    #: the pipeline step, if any
    step: str | None = None
    #: paths the request touches, as the policy saw them
    paths: tuple[str, ...] = ()
    #: the command line, for execute requests
    command: str | None = None

    @classmethod
    def from_request(
        cls,
        request: t.RequestPermissionRequest,
        ctx: SessionContext,
        *,
        verdict: Verdict,
        option_id: str | None,
        rule: str,
    ) -> PermissionRecord:
        """The record of a decision on ``request``, now."""
        call = request.tool_call
        return cls(
            time=time.time(),
            agent=ctx.agent,
            session_id=ctx.session_id,
            step=ctx.step,
            tool_call_id=call.tool_call_id,
            kind=call.kind,
            title=call.title,
            verdict=verdict,
            option_id=option_id,
            rule=rule,
        )

    def to_json(self) -> dict[str, Any]:
        """The record as it appears in ``--json`` output and transcripts."""
        return {
            "time": self.time,
            "agent": self.agent,
            "sessionId": self.session_id,
            "step": self.step,
            "toolCallId": self.tool_call_id,
            "kind": self.kind,
            "title": self.title,
            "paths": list(self.paths),
            "command": self.command,
            "verdict": self.verdict,
            "optionId": self.option_id,
            "rule": self.rule,
        }


@frozen
class PermissionDecision:
    """A permission service's answer: the wire outcome and its audit record."""

    outcome: t.RequestPermissionOutcome
    record: PermissionRecord


class PermissionService(Protocol):
    """Decides ``session/request_permission`` requests."""

    async def request_permission(
        self, request: t.RequestPermissionRequest, ctx: SessionContext
    ) -> PermissionDecision: ...


class FileSystemService(Protocol):
    """Serves ``fs/read_text_file`` and ``fs/write_text_file``."""

    async def read_text_file(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse: ...

    async def write_text_file(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse: ...


class NowaitFileSystemService(FileSystemService, Protocol):
    """A :class:`FileSystemService` that can also answer at once, without a task of its own.

    The ``*_nowait`` methods run in the connection's read loop, so a round trip costs no task
    and no scheduler pass. They must not block: answer from memory or with a quick local read
    of a small file, and raise :class:`trio.WouldBlock` (before changing anything) to have the
    async method serve the request instead. Errors are answered as the async methods' are.
    """

    def read_text_file_nowait(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse: ...

    def write_text_file_nowait(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse: ...


class TerminalService(Protocol):
    """Serves ``terminal/*``."""

    async def create(
        self, request: t.CreateTerminalRequest, ctx: SessionContext
    ) -> t.CreateTerminalResponse: ...

    async def output(
        self, request: t.TerminalOutputRequest, ctx: SessionContext
    ) -> t.TerminalOutputResponse: ...

    async def wait_for_exit(
        self, request: t.WaitForTerminalExitRequest, ctx: SessionContext
    ) -> t.WaitForTerminalExitResponse: ...

    async def kill(
        self, request: t.KillTerminalRequest, ctx: SessionContext
    ) -> t.KillTerminalResponse: ...

    async def release(
        self, request: t.ReleaseTerminalRequest, ctx: SessionContext
    ) -> t.ReleaseTerminalResponse: ...


@runtime_checkable
class ElicitationService(Protocol):
    """Answers ``elicitation/create``."""

    async def create_elicitation(
        self, request: t.CreateElicitationRequest, ctx: SessionContext
    ) -> t.CreateElicitationResponse: ...


def reject_outcome(
    options: list[t.PermissionOption],
) -> tuple[t.RequestPermissionOutcome, str | None]:
    """The outcome that rejects: a ``reject_once`` option, else ``reject_always``, else cancelled.

    Never an allow option: when the agent offers no reject option at all the request is answered
    ``cancelled``, which every agent treats as "not allowed".
    """
    for kind in ("reject_once", "reject_always"):
        for option in options:
            if option.kind == kind:
                return t.SelectedPermissionOutcome(option_id=option.option_id), option.option_id
    return t.CancelledRequestPermissionOutcome(), None


@frozen
class RejectAllPermissions:
    """The permission service used when none is configured: reject everything, with a record."""

    rule: str = "default"

    async def request_permission(
        self, request: t.RequestPermissionRequest, ctx: SessionContext
    ) -> PermissionDecision:
        """Reject by choosing the agent's reject option (never an allow option)."""
        outcome, option_id = reject_outcome(request.options)
        record = PermissionRecord.from_request(
            request, ctx, verdict="reject", option_id=option_id, rule=self.rule
        )
        return PermissionDecision(outcome, record)


@frozen
class DeclineElicitation:
    """Declines every elicitation (the default when an agent asks without our advertising it)."""

    async def create_elicitation(
        self, request: t.CreateElicitationRequest, ctx: SessionContext
    ) -> t.CreateElicitationResponse:
        """Answer ``decline``."""
        return t.DeclineCreateElicitationResponse()


@frozen
class ClientServices:
    """The services installed on a connection or a session; ``None`` means not offered."""

    fs: FileSystemService | None = None
    terminal: TerminalService | None = None
    permission: PermissionService = field(factory=RejectAllPermissions)
    elicitation: ElicitationService | None = None

    def capabilities(self) -> t.ClientCapabilities:
        """The client capabilities these services support, for ``initialize``."""
        fs = (
            t.FileSystemCapabilities(read_text_file=True, write_text_file=True) if self.fs else None
        )
        elicitation = (
            t.ElicitationCapabilities(form=t.ElicitationFormCapabilities())
            if self.elicitation is not None
            else None
        )
        return t.ClientCapabilities(
            fs=fs or t.FileSystemCapabilities(read_text_file=False, write_text_file=False),
            terminal=self.terminal is not None,
            elicitation=elicitation,
            # notices are kept in every turn's result (TurnResult.notices), which the command
            # line shows and records, whatever the services
            session=t.ClientSessionCapabilities(notices=t.NoticeCapabilities()),
        )
