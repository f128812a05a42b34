"""Connectors for the supervisor that serve agents in this process (no subprocess).

``memory_connector(script_for)`` starts, for each agent process the supervisor asks for, a
scripted agent on an in-memory stream pair, with the script ``script_for(spec)`` returns.
:class:`InProcessAgents` serves the built-in demo agent (:mod:`orchestrator.demo`) the same
way, and scripted agents by name: a pipeline that names ``demo`` runs with no agent process.
An agent to be confined by a sandbox is refused by both: it would run in this process. They
are what the pipeline benchmark, fast unit tests and the pytest plugin
(:mod:`orchestrator.testing.pytest_plugin`) use; integration tests use real subprocesses
(:func:`~orchestrator.testing.scripted_agent_command`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING

import trio
import trio.testing
from attrs import define, field

from orchestrator.agent.client import AgentConnection, open_agent_on_stream
from orchestrator.demo.agent import serve_demo_agent
from orchestrator.errors import AgentStartError, SandboxUnavailable
from orchestrator.testing.script import AgentScript
from orchestrator.testing.scripted_agent import AgentRecord, serve_scripted_agent

if TYPE_CHECKING:
    from orchestrator.agents import AgentSpec
    from orchestrator.supervisor import ConnectArgs

__all__ = ["InProcessAgents", "is_demo_agent", "memory_connector"]

#: how the built-in demo agent is started (after the interpreter): ``python -m orchestrator.demo``
_DEMO_ARGS = ("-m", "orchestrator.demo")


def is_demo_agent(spec: AgentSpec) -> bool:
    """Whether ``spec`` starts the built-in demo agent (``demo``, ``a=demo``, ``demo:MODEL``)."""
    return tuple(spec.command[1:]) == _DEMO_ARGS


@asynccontextmanager
async def _serve_in_memory(
    serve: Callable[[trio.abc.Stream], Awaitable[object]], args: ConnectArgs
) -> AsyncIterator[AgentConnection]:
    """Run ``serve`` on one end of an in-memory stream pair; yield the client on the other."""
    if args.sandbox is not None:
        raise SandboxUnavailable("an agent served in memory cannot be confined")
    ours, theirs = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:

        async def run() -> None:
            await serve(theirs)

        nursery.start_soon(run)
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


def memory_connector(
    script_for: Callable[[AgentSpec], AgentScript],
    *,
    records: list[AgentRecord] | None = None,
) -> Callable[[AgentSpec, ConnectArgs], AbstractAsyncContextManager[AgentConnection]]:
    """A supervisor connector serving ``script_for(spec)`` in memory; records go to ``records``."""

    def connect(spec: AgentSpec, args: ConnectArgs) -> AbstractAsyncContextManager[AgentConnection]:
        record = AgentRecord()
        if records is not None:
            records.append(record)
        script = script_for(spec)

        async def serve(stream: trio.abc.Stream) -> None:
            await serve_scripted_agent(stream, script, record=record)

        return _serve_in_memory(serve, args)

    return connect


@define(eq=False)
class InProcessAgents:
    """A supervisor connector that serves every agent in this process, on in-memory streams.

    Pass it as ``connector=`` to :func:`~orchestrator.runs.run_pipeline`,
    :func:`~orchestrator.runs.prompt` or :func:`~orchestrator.runs.compare`. An agent whose
    name (its label in the run, or the one word it is started as: ``y=reviewer`` is the agent
    ``reviewer`` labelled ``y``) was given a script with :meth:`add` is that scripted agent; an
    agent that is the built-in demo agent (``demo``, ``alice=demo``, ``demo:demo-slow``) is the
    demo agent, following the instructions of :mod:`orchestrator.demo.instructions` exactly as
    ``python -m orchestrator.demo`` does. Any other agent is refused
    (:class:`~orchestrator.errors.AgentStartError`): nothing here starts a process.

    A pipeline names a scripted agent by a name of its own (``agent="reviewer"``): with a
    connector given, a run only needs the name to resolve, and a word that is no known agent
    resolves as a command line labelled with that word (never run: this connector serves it).
    """

    #: the scripted agents, by name
    scripts: dict[str, AgentScript] = field(factory=dict)
    #: what each scripted agent process received and decided, by name, one record per process
    records: dict[str, list[AgentRecord]] = field(factory=dict)
    #: how many demo agent processes were served
    demo_started: int = 0

    def add(self, name: str, script: AgentScript) -> None:
        """Serve the agent called ``name`` with ``script`` (its records go to ``records[name]``)."""
        self.scripts[name] = script
        self.records.setdefault(name, [])

    def update(self, scripts: Mapping[str, AgentScript]) -> None:
        """:meth:`add` each of ``scripts``."""
        for name, script in scripts.items():
            self.add(name, script)

    def __call__(
        self, spec: AgentSpec, args: ConnectArgs
    ) -> AbstractAsyncContextManager[AgentConnection]:
        """Start the agent ``spec`` names, in memory (the connector protocol of the supervisor)."""
        return self._connect(spec, args)

    @asynccontextmanager
    async def _connect(self, spec: AgentSpec, args: ConnectArgs) -> AsyncIterator[AgentConnection]:
        # by its label, else by the one word it was started as (`y=reviewer` is `reviewer`)
        name = spec.name
        if name not in self.scripts and len(spec.command) == 1 and spec.command[0] in self.scripts:
            name = spec.command[0]
        script = self.scripts.get(name)
        if script is not None:
            record = AgentRecord()
            self.records.setdefault(name, []).append(record)

            async def serve_script(stream: trio.abc.Stream) -> None:
                await serve_scripted_agent(stream, script, record=record)

            async with _serve_in_memory(serve_script, args) as conn:
                yield conn
        elif is_demo_agent(spec):
            self.demo_started += 1
            async with _serve_in_memory(serve_demo_agent, args) as conn:
                yield conn
        else:
            if args.transcript is not None:
                args.transcript.close()
            served = ", ".join(["the demo agent", *sorted(self.scripts)])
            raise AgentStartError(
                f"agent {spec.name} is not served in this process (served: {served}); give it "
                "a script, or name the demo agent"
            )
