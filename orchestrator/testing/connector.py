"""Connectors for the supervisor that run scripted agents in memory (no subprocess).

``memory_connector(script_for)`` starts, for each agent process the supervisor asks for, a
scripted agent on an in-memory stream pair, with the script ``script_for(spec)`` returns (an
agent to be confined by a sandbox is refused: it would run in this process). It
is what the pipeline benchmark and fast unit tests use; integration tests use real
subprocesses (:func:`~orchestrator.testing.scripted_agent_command`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

import trio
import trio.testing

from orchestrator.agent.client import AgentConnection, open_agent_on_stream
from orchestrator.errors import SandboxUnavailable
from orchestrator.testing.script import AgentScript
from orchestrator.testing.scripted_agent import AgentRecord, serve_scripted_agent

if TYPE_CHECKING:
    from orchestrator.agents import AgentSpec
    from orchestrator.supervisor import ConnectArgs

__all__ = ["memory_connector"]


def memory_connector(
    script_for: Callable[[AgentSpec], AgentScript],
    *,
    records: list[AgentRecord] | None = None,
) -> Callable[[AgentSpec, ConnectArgs], AbstractAsyncContextManager[AgentConnection]]:
    """A supervisor connector serving ``script_for(spec)`` in memory; records go to ``records``."""

    @asynccontextmanager
    async def connect(spec: AgentSpec, args: ConnectArgs) -> AsyncIterator[AgentConnection]:
        if args.sandbox is not None:
            raise SandboxUnavailable("an agent served in memory cannot be confined")
        ours, theirs = trio.testing.memory_stream_pair()
        record = AgentRecord()
        if records is not None:
            records.append(record)
        async with trio.open_nursery() as nursery:
            script = script_for(spec)

            async def serve() -> None:
                await serve_scripted_agent(theirs, script, record=record)

            nursery.start_soon(serve)
            try:
                async with open_agent_on_stream(
                    ours,
                    name=args.label,
                    services=args.services,
                    options=args.options,
                    transcript=args.transcript,
                ) as conn:
                    yield conn
            finally:
                if args.transcript is not None:
                    args.transcript.close()
                with trio.CancelScope(shield=True):
                    await theirs.aclose()
                nursery.cancel_scope.cancel()

    return connect
