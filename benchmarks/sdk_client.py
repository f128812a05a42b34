"""The client benchmark's reference: a client written with the official Python SDK (``acp``).

It uses the SDK as its documentation shows: ``spawn_agent_process`` with a client object whose
``session_update`` receives each typed (pydantic) update and whose ``read_text_file`` answers
the agent. Run by ``bench_client.py`` in a fresh process; it prints one JSON result line, or for
``--scenario cli`` the reply as JSON like ``orchestrator prompt --json`` does.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any, cast

import acp
from acp.schema import (
    AgentMessageChunk,
    ClientCapabilities,
    DeniedOutcome,
    FileSystemCapabilities,
    Implementation,
    ReadTextFileResponse,
    RequestPermissionResponse,
    TextContentBlock,
    WriteTextFileResponse,
)
from bare_client import AGENT, FILE_CONTENT, Probe

__all__ = ["BenchClient", "main"]


class BenchClient:
    """Counts typed message chunks and their text; answers fs reads with fixed content."""

    def __init__(self, keep_text: bool = False) -> None:
        self.updates = 0
        self.chars = 0
        self.round_trips = 0
        self.texts: list[str] | None = [] if keep_text else None

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        """Count one update (a typed pydantic value)."""
        if isinstance(update, AgentMessageChunk) and isinstance(update.content, TextContentBlock):
            self.updates += 1
            self.chars += len(update.content.text)
            if self.texts is not None:
                self.texts.append(update.content.text)

    async def read_text_file(
        self,
        session_id: str,
        path: str,
        line: int | None = None,
        limit: int | None = None,
        **kwargs: Any,
    ) -> ReadTextFileResponse:
        """Answer every read with the same small file."""
        self.round_trips += 1
        return ReadTextFileResponse(content=FILE_CONTENT)

    async def write_text_file(
        self, session_id: str, path: str, content: str, **kwargs: Any
    ) -> WriteTextFileResponse:
        """Accept and drop writes (the flood agent sends none)."""
        return WriteTextFileResponse()

    async def request_permission(
        self, session_id: str, tool_call: Any, options: list[Any], **kwargs: Any
    ) -> RequestPermissionResponse:
        """Reject: the flood agent never asks."""
        return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))


def _capabilities() -> ClientCapabilities:
    return ClientCapabilities(
        fs=FileSystemCapabilities(read_text_file=True, write_text_file=True), terminal=False
    )


async def _one(
    python: str,
    agent: Path,
    text: str,
    client: BenchClient,
    probe: Probe,
    ready: asyncio.Event | None = None,
    go: asyncio.Event | None = None,
) -> str:
    """One agent, one turn; returns the stop reason."""
    async with acp.spawn_agent_process(cast(acp.Client, client), python, str(agent)) as (conn, _):
        await conn.initialize(
            protocol_version=acp.PROTOCOL_VERSION,
            client_capabilities=_capabilities(),
            client_info=Implementation(name="sdk-bench", version="0"),
        )
        session = await conn.new_session(cwd=os.getcwd(), mcp_servers=[])
        if ready is not None and go is not None:
            ready.set()
            await go.wait()
        else:
            probe.mark("sent")
        response = await conn.prompt(
            session_id=session.session_id, prompt=[TextContentBlock(type="text", text=text)]
        )
        probe.mark("end")  # with many agents, the last one to finish leaves its mark
        return str(response.stop_reason)


async def run_one(
    python: str, agent: Path, text: str, probe: Probe, keep_text: bool
) -> dict[str, Any]:
    """One agent, one turn."""
    client = BenchClient(keep_text)
    stop_reason = await _one(python, agent, text, client, probe)
    return {
        "updates": client.updates,
        "chars": client.chars,
        "round_trips": client.round_trips,
        "stop_reason": stop_reason,
        "text": "".join(client.texts or []),
    }


async def run_many(
    python: str, agents: int, agent: Path, text: str, probe: Probe
) -> dict[str, Any]:
    """``agents`` SDK connections in one asyncio process, flooding at once."""
    clients = [BenchClient() for _ in range(agents)]
    readies = [asyncio.Event() for _ in range(agents)]
    go = asyncio.Event()
    tasks = [
        asyncio.create_task(_one(python, agent, text, client, probe, ready, go))
        for client, ready in zip(clients, readies, strict=True)
    ]
    await asyncio.gather(*(ready.wait() for ready in readies))
    probe.mark("sent")
    go.set()
    await asyncio.gather(*tasks)
    return {
        "updates": sum(c.updates for c in clients),
        "chars": sum(c.chars for c in clients),
    }


def main(argv: list[str] | None = None) -> int:
    """Run one scenario and print its result."""
    parser = argparse.ArgumentParser(description="ACP client built on the official Python SDK")
    parser.add_argument("--scenario", choices=["flood", "rtt", "multi", "cli"], required=True)
    parser.add_argument("--count", type=int, default=200_000)
    parser.add_argument("--agents", type=int, default=50)
    parser.add_argument("--agent", type=Path, default=AGENT, help="the flood agent script")
    parser.add_argument("--python", default=sys.executable, help="interpreter for the agent")
    args = parser.parse_args(argv)
    probe = Probe(track_gc=args.scenario != "cli")  # the CLI case: nothing but the client
    if args.scenario == "multi":
        text = f"flood {args.count}"
        result = asyncio.run(run_many(args.python, args.agents, args.agent, text, probe))
    else:
        mode = "rtt" if args.scenario == "rtt" else "flood"
        text = f"{mode} {args.count}"
        cli = args.scenario == "cli"
        result = asyncio.run(run_one(args.python, args.agent, text, probe, keep_text=cli))
        reply = result.pop("text")
        if cli:  # like `orchestrator prompt --json`: the reply as JSON
            out = {"stopReason": result["stop_reason"], "text": reply}
            sys.stdout.write(json.dumps(out, indent=2) + "\n")
            return 0 if result["stop_reason"] == "end_turn" else 1
    result.update(probe.report())
    sys.stdout.write(json.dumps({"client": "sdk", "scenario": args.scenario, **result}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
