"""Peak memory of the client while an agent floods requests and never reads the answers.

A scripted agent (a real subprocess) stops reading its stdin, then sends ``--count``
``fs/read_text_file`` requests as fast as it can. The client answers each one; once the pipe
to the agent is full, the answers wait on the client's side. The script prints how far the
client's peak RSS rose over its RSS before the agent started, in all and per request read,
and how the turn ended: stopped by the client's bounds, or (bounds off, or an orchestrator
without them) still stuck when every request had been read. A script to run and read, never
a timed test::

    .venv/bin/python benchmarks/bench_unread.py              # 100,000 requests, default bounds
    .venv/bin/python benchmarks/bench_unread.py --no-bounds  # what each waiting answer costs
    .venv/bin/python benchmarks/bench_unread.py --tasks      # served in tasks, not in the read loop

Linux only (it reads ``/proc/self/status`` and resets the peak through ``/proc/self/clear_refs``).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import trio

from orchestrator.agent.client import ClientOptions, open_agent
from orchestrator.agent.services import ClientServices, SessionContext
from orchestrator.errors import OrchestratorError
from orchestrator.protocol import types as t
from orchestrator.testing import AgentScript, FloodRequests, Turn, scripted_agent_command

__all__ = ["main"]


def _status_kb(name: str) -> int:
    with open("/proc/self/status", "rb") as f:
        for line in f:
            if line.startswith(name.encode() + b":"):
                return int(line.split()[1])
    raise LookupError(name)


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")


@attrs.define
class _MemoryFs:
    """Answers every read with the same text, in the read loop unless ``tasks``."""

    content: str
    tasks: bool

    async def read_text_file(
        self, request: t.ReadTextFileRequest, ctx: SessionContext
    ) -> t.ReadTextFileResponse:
        return t.ReadTextFileResponse(content=self.content)

    async def write_text_file(
        self, request: t.WriteTextFileRequest, ctx: SessionContext
    ) -> t.WriteTextFileResponse:
        return t.WriteTextFileResponse()

    def __getattr__(self, name: str) -> Any:
        # the nowait form only when answers are served in the read loop
        if name == "read_text_file_nowait" and not self.tasks:
            return lambda request, ctx: t.ReadTextFileResponse(content=self.content)
        raise AttributeError(name)


async def _measure(args: argparse.Namespace, scratch: Path) -> dict[str, Any]:
    script = AgentScript(
        name="unread", turns=(Turn(steps=(FloodRequests(args.count, params={"path": "f.txt"}),)),)
    )
    argv = scripted_agent_command(script, scratch)
    bounds: dict[str, Any] = {}
    if args.no_bounds:
        bounds = {"max_requests_in_flight": None, "max_unsent_bytes": None}
    if args.max_requests_in_flight is not None:
        bounds["max_requests_in_flight"] = args.max_requests_in_flight
    if args.max_unsent_bytes is not None:
        bounds["max_unsent_bytes"] = args.max_unsent_bytes
    options = ClientOptions(**bounds)
    fs = _MemoryFs("x" * args.file_bytes, args.tasks)
    outcome = "?"
    gc.collect()
    _reset_peak()
    base_kb = _status_kb("VmRSS")
    started = time.monotonic()
    async with open_agent(
        argv, name="unread", services=ClientServices(fs=fs), options=options
    ) as conn:
        session = await conn.new_session(scratch)
        async with trio.open_nursery() as nursery:

            async def turn() -> None:
                nonlocal outcome
                try:
                    result = await session.prompt("flood")
                    outcome = f"turn ended {result.stop_reason}"
                except OrchestratorError as e:
                    outcome = f"stopped: {type(e).__name__}: {str(e).splitlines()[0]}"
                nursery.cancel_scope.cancel()

            async def watch() -> None:
                nonlocal outcome
                while conn.rpc.statistics().requests_received < args.count:  # noqa: ASYNC110
                    await trio.sleep(0.05)  # a measurement, not a test: polling is fine
                await trio.sleep(0.5)  # the last answers of the last read join the others
                outcome = "every request read; the agent still reads nothing (not stopped)"
                nursery.cancel_scope.cancel()

            nursery.start_soon(turn)
            nursery.start_soon(watch)
        received = conn.rpc.statistics().requests_received
        peak_kb = _status_kb("VmHWM")
        seconds = time.monotonic() - started
        # a client without bounds waits for ever to write its answers: end the agent, so
        # that the writes fail and the connection can close
        assert conn.pid is not None
        with contextlib.suppress(ProcessLookupError):
            os.kill(conn.pid, signal.SIGKILL)
    grown = max(0, peak_kb - base_kb)
    return {
        "requests": args.count,
        "received": received,
        "baseMB": round(base_kb / 1024, 1),
        "peakMB": round(peak_kb / 1024, 1),
        "grownMB": round(grown / 1024, 1),
        "bytesPerRequestRead": round(grown * 1024 / received) if received else None,
        "seconds": round(seconds, 2),
        "outcome": outcome,
    }


def main(argv: list[str] | None = None) -> int:
    """Run the measurement once and print its figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=100_000, help="requests the agent sends")
    parser.add_argument("--file-bytes", type=int, default=64, help="size of each answer's file")
    parser.add_argument("--tasks", action="store_true", help="serve each request in a task")
    parser.add_argument("--no-bounds", action="store_true", help="turn the client's bounds off")
    parser.add_argument("--max-requests-in-flight", type=int, default=None)
    parser.add_argument("--max-unsent-bytes", type=int, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-unread-") as scratch:
        figures = trio.run(_measure, args, Path(scratch))
    width = max(map(len, figures))
    for key, value in figures.items():
        print(f"{key:<{width}}  {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
