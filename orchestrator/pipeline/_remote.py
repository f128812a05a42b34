"""Agent step instances whose turns run elsewhere (a cluster node): what goes, what comes back.

The runner keeps everything but the turn: it forks the instance's branch, builds the prompt,
records the outcome and merges. A :class:`RemoteTurns` (the cluster's executor satisfies it)
runs the turn where the agent runs, on a copy of the branch's tree, and gives back what the
turn changed in the branch (:attr:`RemoteReply.states`), its result and the events it emitted;
:func:`run_remote` puts them into the driver's branch and recorder as a local turn would have.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from attrs import frozen

from ..agents import AgentSpec
from ..errors import ErrorKind, RemoteTurnFailed
from ..mcp import McpServer
from ..policy import PolicySet
from ..sandbox import Sandbox
from ..vfs import Branch, FileState
from ._recording import Recorder
from .results import CheckResult, RunEvent, StepResult
from .spec import Step

__all__ = ["RemoteReply", "RemoteTurn", "RemoteTurns", "run_remote"]


@frozen
class RemoteTurn:
    """One attempt of one agent step instance, as a node runs it (picklable)."""

    run_id: str
    #: the step, with its check and feedback functions (a node pickles them by value)
    step: Step
    #: the instance's name (``plan[a]``) and key
    name: str
    key: str | None
    #: the agent's label in the run, and its spec (with its sandbox, if confined)
    agent: str
    spec: AgentSpec
    #: the policy the turn runs under (the run's, narrowed by the agent's and the step's)
    policy: PolicySet
    sandbox: Sandbox | None
    mcp_servers: tuple[McpServer, ...]
    #: the step's verify command, if any
    verify: str | None
    #: the instance's item (a fan-out's), and whether it has none (not the same as None)
    item: Any
    no_item: bool
    #: the prompt built on the driver; None when the step function wants the branch
    #: directory (``workdir``): the node calls it there with :attr:`call_args`
    prompt: Any
    call_args: Mapping[str, Any]
    attempt: int
    feedback: CheckResult | None
    max_file_size: int | None
    max_turn_record_bytes: int | None
    #: the request rate its prompts count against (the cluster's), if any
    rate_key: str | None = None


@frozen
class RemoteReply:
    """What a node gives back for a :class:`RemoteTurn` (picklable)."""

    #: the instance's result; None when the turn failed before one (see :attr:`error`)
    result: StepResult | None
    #: what the turn changed in the branch: path -> its state now (None: deleted)
    states: Mapping[str, FileState | None]
    #: the events the turn emitted (permissions, rounds), in order
    events: Sequence[RunEvent]
    #: an error that ended the turn: (message, kind, traceback or None)
    error: tuple[str, ErrorKind, str | None] | None = None
    #: whether the turn was cancelled (Ctrl-C on the driver)
    cancelled: bool = False
    #: the run's budget was spent before the first prompt was sent: how (nothing ran)
    not_started: str | None = None
    #: each session's final usage: (session, tokens, cost), for the driver's budget
    usage: Sequence[tuple[str, int | None, float | None]] = ()
    #: the sessions that served the turn's attempt: (instance, attempt, agent, transcript
    #: source, session id), recorded by the driver (what a replay plays); the driver names
    #: the source as its transcript is kept there (``LABEL@NODE``)
    sessions: Sequence[tuple[str, int, str, str, str]] = ()


class RemoteTurns(Protocol):
    """Runs agent turns elsewhere (see the module docstring)."""

    async def run_turn(
        self,
        turn: RemoteTurn,
        branch: Branch,
        *,
        on_cancelled: Callable[[RemoteReply], None],
    ) -> RemoteReply:
        """Run ``turn`` on a copy of ``branch``'s tree; never raises for the turn's own
        failures (they come back in :attr:`RemoteReply.error`). Cancelled, it cancels the
        remote turn, gives ``on_cancelled`` what the turn did, and raises the cancellation."""
        ...


def run_remote(
    reply: RemoteReply, branch: Branch, recorder: Recorder
) -> tuple[StepResult | None, RemoteTurnFailed | None]:
    """Put ``reply`` into the driver's ``branch`` and ``recorder``: the branch takes the
    node's changes, the events are emitted (and stored) here. Returns the result, and the
    failure to raise (with the result of what the turn did before it, if any)."""
    for path, state in reply.states.items():
        branch.set_state(path, state)
    for event in reply.events:
        recorder.emit(event)
    for name, attempt, agent, source, session_id in reply.sessions:
        recorder.session(name, attempt, agent, source, session_id)
    result = reply.result
    if reply.error is None:
        return result, None
    message, kind, traceback = reply.error
    return result, RemoteTurnFailed(message, kind, traceback)
