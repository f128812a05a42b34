"""One ACP connection, as the client: handshake, sessions, turns, and the services we serve.

The client is three modules, one per concern, re-exported here:

- :mod:`orchestrator.agent.launch`: :func:`open_agent` starts an agent process and completes
  ``initialize``; :func:`open_agent_on_stream` does the same over any :class:`trio.abc.Stream`;
- :mod:`orchestrator.agent.connection`: the :class:`AgentConnection` they return (handshake,
  authentication, sessions, and the requests the agent sends us);
- :mod:`orchestrator.agent.session`: each :class:`AcpSession`, whose :meth:`AcpSession.prompt`
  runs one turn and returns its :class:`~orchestrator.agent.turn.TurnResult`.

Inbound requests (permission, fs, terminal, elicitation) run concurrently with the pending
``session/prompt``, as agents expect. A prompt's result is delivered only after every update
that preceded its response on the wire.
"""

from __future__ import annotations

from .connection import AgentConnection
from .launch import open_agent, open_agent_on_stream
from .session import CLIENT_INFO, AcpSession, ClientOptions, Turn

__all__ = [
    "CLIENT_INFO",
    "AcpSession",
    "AgentConnection",
    "ClientOptions",
    "Turn",
    "open_agent",
    "open_agent_on_stream",
]
