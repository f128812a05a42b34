"""MCP servers given with ``--mcp-server``, end to end with real agents, offline.

A real agent (Qwen Code, Claude Code's adapter) gets a real stdio MCP server
(``mcp_lookup_server.py``, written with the ``mcp`` package) through the console script; the
scripted model calls the server's tool, and the tool's answer must reach the model in the
next request. Skipped with the reason when node or an agent is missing (a failure under
``$CI`` with npm present, as for ``test_real_agents.py``).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from mcp_lookup_server import ANSWER
from real_agents import AGENTS, CLAUDE, Project, RealAgent, make_project, require_installed

from orchestrator.testing.model_server import Reply, Scenario, Tool, open_model_server

pytestmark = [pytest.mark.real_agent, pytest.mark.slow]

LIMIT = 180.0
ORCHESTRATOR = Path(sys.executable).parent / "orchestrator"
SERVER = Path(__file__).with_name("mcp_lookup_server.py")
#: a secret-looking variable for the MCP server: its value reaches the server, never a record
TOKEN = "tok-mcp-5521"


#: the name Claude Code and Qwen Code give the server's tool: ``mcp__SERVER__TOOL``
TOOL_NAME = "mcp__lookup__lookup"
#: Gemini CLI's name for it: ``mcp_SERVER_TOOL``
GEMINI_TOOL_NAME = "mcp_lookup_lookup"


def mcp_call(agent: RealAgent, server: str, tool: str, arguments: dict[str, Any]) -> Tool:
    """The model's call of ``tool`` of MCP server ``server``, as ``agent`` takes it.

    Claude Code offers the tool to the model as ``mcp__SERVER__TOOL``; Gemini CLI (0.61) as
    ``mcp_SERVER_TOOL``; Qwen Code (0.24) names it as Claude Code does but defers MCP tools
    (``DiscoveredMCPTool``'s ``shouldDefer``): the model calls them through its ``tool_call``
    bridge, ``{"name": TOOL, "arguments": {...}}``.
    """
    if agent.name == "gemini":
        return Tool(f"mcp_{server}_{tool}", arguments)
    name = f"mcp__{server}__{tool}"
    if agent.name == "qwen":
        return Tool("tool_call", {"name": name, "arguments": arguments})
    return Tool(name, arguments)


@pytest.fixture(params=AGENTS, ids=[a.name for a in AGENTS])
def agent(request: pytest.FixtureRequest) -> RealAgent:
    """Each real agent, skipped (or failed under CI) when it is not installed."""
    real: RealAgent = request.param
    require_installed(real)
    return real


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """The small project the turn runs in."""
    return make_project(tmp_path / "project")


async def test_agent_calls_a_tool_of_a_stdio_mcp_server(
    agent: RealAgent, project: Project, tmp_path: Path, state_dir: Path
) -> None:
    """The model calls ``lookup`` of ``--mcp-server lookup=...``; its answer is in the next
    model request, and the run records the server with its secret redacted."""
    call = mcp_call(agent, "lookup", "lookup", {"key": "alpha"})
    scenario = Scenario("RA-MCP", (call, Reply("Looked it up.")))
    transcript = tmp_path / "wire.ndjson"
    async with open_model_server([scenario]) as server:
        home = tmp_path / "home"
        agent.prepare_home(home)
        env = {**os.environ, **agent.environment(server, home)}
        if agent.name == "qwen":
            # Qwen Code discovers MCP servers in the background by default: the scripted
            # model's first request could come before the tool is there. This makes
            # session/new wait for the discovery (Qwen Code's own switch)
            env["QWEN_CODE_LEGACY_MCP_BLOCKING"] = "1"
        policy = tmp_path / "policy.toml"
        # the agents ask before calling an MCP tool, of kind "other" (Claude Code titles the
        # request after the tool, Qwen Code with its arguments)
        policy.write_text(
            '[[rules]]\nname = "mcp tools"\nverdict = "allow"\nkinds = ["other"]\n', "utf-8"
        )
        command = [
            str(ORCHESTRATOR),
            "prompt",
            "--agent",
            f"{agent.name}={' '.join(agent.command())}",
            "--mcp-server",
            f"lookup={sys.executable} {SERVER}",
            "--mcp-env",
            f"lookup:LOOKUP_TOKEN={TOKEN}",
            "--policy",
            str(policy),
            "--json",
            "--cwd",
            str(project.root),
            "--state-dir",
            str(state_dir),
            "--transcript",
            str(transcript),
            "Please do RA-MCP now.",
        ]
        with trio.fail_after(LIMIT):
            done = await trio.run_process(
                command, env=env, capture_stdout=True, capture_stderr=True, check=False
            )
    stderr = done.stderr.decode(errors="replace")[-3000:]
    assert done.returncode == 0, stderr
    result = json.loads(done.stdout)
    assert result["stopReason"] == "end_turn", result
    played = [r for r in server.requests if r.scenario == "RA-MCP"]
    assert len(played) == 2, (result["permissions"], result["toolCalls"])
    # the tool was offered and called by its name, and its answer (with the environment the
    # orchestrator gave the server) came back to the model in the next request
    assert played[0].tool_call is not None, played[0].tool_names
    assert played[0].tool_call.name in call.names
    assert (
        TOOL_NAME in json.dumps(played[0].tool_call.arguments)
        or TOOL_NAME in call.names
        or GEMINI_TOOL_NAME in call.names
    )
    assert played[1].step == 1
    results = played[1].tool_results()
    assert any(f"{ANSWER} key=alpha token={TOKEN[::-1]}" in r for r in results), results
    # what the run keeps: the server, its secret redacted, in the record and the transcript
    shown = await trio.run_process(
        [str(ORCHESTRATOR), "show", result["runId"], "--json", "--state-dir", str(state_dir)],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert TOKEN not in shown.stdout.decode()
    assert TOKEN not in transcript.read_text("utf-8")
    assert '"LOOKUP_TOKEN":"<redacted>"' in transcript.read_text("utf-8").replace(" ", "") or (
        '"value":"<redacted>"' in transcript.read_text("utf-8")
    )


async def test_claude_calls_a_tool_of_an_http_mcp_server_with_its_header(
    project: Project, tmp_path: Path, state_dir: Path
) -> None:
    """``--mcp-server lookup=http://...`` with ``--mcp-header``: Claude Code's adapter (which
    advertises mcpCapabilities.http) connects with the header, and the answer reaches the
    model; the header's secret value is in no record."""
    require_installed(CLAUDE)
    key = "key-http-8812"
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(16)
    port = listener.getsockname()[1]
    env_server = {**os.environ, "LOOKUP_KEY": key, "LOOKUP_TOKEN": TOKEN}
    call = mcp_call(CLAUDE, "lookup", "lookup", {"key": "beta"})
    scenario = Scenario("RA-MCP-HTTP", (call, Reply("Looked it up.")))
    async with trio.open_nursery() as nursery:
        mcp_process = await nursery.start(
            functools.partial(
                trio.run_process,
                [sys.executable, str(SERVER), "--http-fd", str(listener.fileno())],
                env=env_server,
                pass_fds=(listener.fileno(),),
                check=False,
            )
        )
        listener.close()  # the server holds it now
        try:
            async with open_model_server([scenario]) as server:
                home = tmp_path / "home"
                CLAUDE.prepare_home(home)
                env = {**os.environ, **CLAUDE.environment(server, home)}
                policy = tmp_path / "policy.toml"
                policy.write_text(
                    '[[rules]]\nname = "mcp"\nverdict = "allow"\nkinds = ["other"]\n', "utf-8"
                )
                command = [
                    str(ORCHESTRATOR),
                    "prompt",
                    "--agent",
                    f"claude={' '.join(CLAUDE.command())}",
                    "--mcp-server",
                    f"lookup=http://127.0.0.1:{port}/mcp",
                    "--mcp-header",
                    f"lookup:X-Lookup-Key={key}",
                    "--policy",
                    str(policy),
                    "--json",
                    "--cwd",
                    str(project.root),
                    "--state-dir",
                    str(state_dir),
                    "Please do RA-MCP-HTTP now.",
                ]
                with trio.fail_after(LIMIT):
                    done = await trio.run_process(
                        command, env=env, capture_stdout=True, capture_stderr=True, check=False
                    )
        finally:
            mcp_process.kill()
    assert done.returncode == 0, done.stderr.decode(errors="replace")[-3000:]
    played = [r for r in server.requests if r.scenario == "RA-MCP-HTTP"]
    assert len(played) == 2, json.loads(done.stdout)["toolCalls"]
    results = played[1].tool_results()
    assert any(f"{ANSWER} key=beta token={TOKEN[::-1]}" in r for r in results), results
    # the header's value (its name looks secret: *KEY*) is kept out of the output
    assert key.encode() not in done.stdout + done.stderr
