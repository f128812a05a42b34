"""Starting an agent: a process (or any stream) and its initialized connection.

:func:`open_agent` starts an agent process and completes ``initialize``;
:func:`open_agent_on_stream` does the same over any :class:`trio.abc.Stream` (tests, or an agent
reached another way). Leaving the block stops the agent (the shutdown ladder for a process).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import trio

from .._log import get_logger
from .._util import single_error
from ..errors import (
    AgentExited,
    AgentStartError,
    JsonRpcError,
)
from ..jsonrpc.connection import JsonRpcConnection
from ..protocol.codec import StructureError
from ..sandbox import Sandbox
from .connection import AgentConnection
from .process import open_agent_process
from .services import (
    ClientServices,
)
from .session import ClientOptions
from .transcript import TranscriptWriter

__all__ = ["open_agent", "open_agent_on_stream"]

log = get_logger(__name__)


@asynccontextmanager
async def open_agent_on_stream(
    stream: trio.abc.Stream,
    *,
    name: str = "agent",
    services: ClientServices | None = None,
    options: ClientOptions | None = None,
    transcript: TranscriptWriter | None = None,
    extensions: Mapping[str, Callable[[Any], Any]] | None = None,
    close_error: Callable[[str], Any] | None = None,
    max_message_size: int = 64 * 2**20,
) -> AsyncIterator[AgentConnection]:
    """An initialized connection to an agent reached over ``stream``."""
    options = options or ClientOptions()
    rpc = JsonRpcConnection(
        stream,
        name=name,
        max_message_size=max_message_size,
        max_requests_in_flight=options.max_requests_in_flight,
        max_unsent_bytes=options.max_unsent_bytes,
        frame_observer=transcript,
        close_error=close_error,
    )
    conn = AgentConnection(name, rpc, options, services or ClientServices())
    conn.install_handlers(extensions)
    # The read loop (and the agent's requests it serves) is shielded until the block is left:
    # a turn whose caller is cancelled (Ctrl-C) must still hear the agent end it. Shielded
    # only once started: trio leaves a task started under a caller cancelled meanwhile where
    # it is (``started()`` does nothing), and a shielded read loop there would never end.
    serving = trio.CancelScope()

    async def serve(*, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with serving:
            await rpc.serve(task_status=task_status)

    # The transcript's lines reach the file as they come for as long as the read loop runs
    # (shielded alike: a cancelled turn's end is written live too).
    flushing = trio.CancelScope(shield=True)

    async def write_transcript(transcript: TranscriptWriter) -> None:
        with flushing:
            await transcript.run()

    try:
        with single_error():
            async with trio.open_nursery() as nursery:
                await nursery.start(serve)
                serving.shield = True
                try:
                    if transcript is not None:  # within the try: its end cancels it
                        nursery.start_soon(write_transcript, transcript)
                    try:
                        with trio.fail_after(options.init_timeout):
                            await conn.initialize()
                    except trio.TooSlowError:
                        raise AgentStartError(
                            f"no answer to initialize within {options.init_timeout:g}s",
                            agent=name,
                        ) from None
                    except JsonRpcError as e:
                        raise AgentStartError(_init_failure(e), agent=name) from e
                    yield conn
                finally:
                    serving.cancel()
                    flushing.cancel()
                    nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            for session in list(conn.sessions.values()):
                await session.release()
            await rpc.aclose()


def _init_failure(error: JsonRpcError) -> str:
    """What went wrong with ``initialize``: an answer that does not fit the protocol, or the
    error the agent answered with."""
    if isinstance(error.__cause__, StructureError):  # ours: its answer did not fit
        return f"its answer to initialize is not an InitializeResponse: {error.__cause__}"
    return f"it answered initialize with an error: {error}"


@asynccontextmanager
async def open_agent(
    command: Sequence[str] | str,
    *,
    name: str | None = None,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    services: ClientServices | None = None,
    options: ClientOptions | None = None,
    transcript: TranscriptWriter | None = None,
    extensions: Mapping[str, Callable[[Any], Any]] | None = None,
    term_grace: float = 2.0,
    max_message_size: int = 64 * 2**20,
    sandbox: Sandbox | None = None,
) -> AsyncIterator[AgentConnection]:
    """Start an agent process and yield its initialized connection.

    On exit, normal or not, the agent gets the shutdown ladder (stdin closed, SIGTERM, SIGKILL
    to its process group), so no process outlives the block. With ``sandbox`` the process runs
    confined by Landlock (see :func:`~orchestrator.agent.process.open_agent_process`).
    """
    label = name or _label(command)
    async with open_agent_process(
        command,
        name=label,
        env=env,
        cwd=cwd,
        stdin_close_grace=term_grace,
        term_grace=term_grace,
        sandbox=sandbox,
    ) as proc:
        initialized = False
        try:
            async with open_agent_on_stream(
                proc.stream,
                name=label,
                services=services,
                options=options,
                transcript=transcript,
                extensions=extensions,
                close_error=proc.exit_error,
                max_message_size=max_message_size,
            ) as conn:
                initialized = True
                conn.pid = proc.pid
                conn.process = proc
                if conn.quirks.has("skip-stdin-grace"):
                    proc.skip_stdin_grace()
                yield conn
        except AgentExited as e:
            if initialized:
                raise
            raise AgentStartError(f"exited before completing initialize: {e}", agent=label) from e
        finally:
            if transcript is not None:
                transcript.close()


def _label(command: Sequence[str] | str) -> str:
    first = command.split()[0] if isinstance(command, str) else command[0]
    return os.path.basename(first) or "agent"
