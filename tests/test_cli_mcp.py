"""``--mcp-server``, ``--mcp-header``, ``--mcp-env`` through the console script.

Scripted agents (subprocesses) record the ``mcpServers`` of each ``session/new``; the
command's output and the run store must keep the servers' secrets out.
"""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
from run_helpers import CLI, agent_command, as_json, record_events, run_cli

from orchestrator.testing import AgentScript, Capabilities, Say, Turn

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
SECRET = "sekrit-4411"


def scripted(path: Path, *, http: bool = False) -> str:
    """A scripted agent's NAME=COMMAND for ``--agent``; it records what it receives."""
    script = AgentScript(
        name=path.stem,
        capabilities=Capabilities(mcp_http=http),
        turns=(Turn(steps=(Say("ok"),)),),
        record_path=str(path.with_suffix(".jsonl")),
    )
    path.write_bytes(orjson.dumps(script.to_json()))
    return f"{path.stem}={shlex.join(agent_command(path))}"


def sessions(path: Path) -> list[list[dict[str, Any]]]:
    """The mcpServers of each session/new the agent of ``path`` received."""
    events = record_events(path.with_suffix(".jsonl"))
    return [e["mcpServers"] for e in events if e["event"] == "session_new"]


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    """An empty workspace."""
    root = tmp_path / "ws"
    root.mkdir()
    return root


async def test_prompt_gives_the_stdio_server_with_its_env(
    tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``prompt --mcp-server NAME=COMMAND --mcp-env``: the agent gets it (``SERVER:VAR`` with
    the value ``$VAR`` has), the output hides the secret value, and ``show --json`` does too."""
    monkeypatch.setenv("DOCS_TOKEN", SECRET)
    agent = tmp_path / "alpha.json"
    done = await run_cli(
        "prompt",
        "--agent",
        scripted(agent),
        "--mcp-server",
        f"docs={sys.executable} -m docs_server --stdio",
        "--mcp-env",
        "docs:DOCS_TOKEN",
        "--mcp-env",
        "docs:MODE=fast",
        "--json",
        "hello",
        cwd=ws,
        state=tmp_path / "state",
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert sessions(agent) == [
        [
            {
                "name": "docs",
                "command": sys.executable,
                "args": ["-m", "docs_server", "--stdio"],
                "env": [
                    {"name": "DOCS_TOKEN", "value": SECRET},
                    {"name": "MODE", "value": "fast"},
                ],
            }
        ]
    ]
    assert SECRET.encode() not in done.stdout + done.stderr
    shown = await run_cli(
        "show", as_json(done)["runId"], "--json", cwd=ws, state=tmp_path / "state"
    )
    assert shown.returncode == EXIT_OK and SECRET.encode() not in shown.stdout


async def test_compare_refuses_http_for_the_agent_without_the_capability(
    tmp_path: Path, ws: Path
) -> None:
    """``compare --mcp-server api=https://...``: the agent advertising mcpCapabilities.http
    gets the server and its header; the other fails before its session starts (exit 1,
    error naming the server)."""
    takes, refuses = tmp_path / "takes.json", tmp_path / "refuses.json"
    done = await run_cli(
        "compare",
        "--agent",
        scripted(takes, http=True),
        "--agent",
        scripted(refuses),
        "--mcp-server",
        "api=https://mcp.example/api",
        "--mcp-header",
        f"api:Authorization=Bearer {SECRET}",
        "--json",
        "hello",
        cwd=ws,
        state=tmp_path / "state",
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert sessions(takes) == [
        [
            {
                "type": "http",
                "name": "api",
                "url": "https://mcp.example/api",
                "headers": [{"name": "Authorization", "value": f"Bearer {SECRET}"}],
            }
        ]
    ]
    assert sessions(refuses) == []
    result = as_json(done)
    entry = next(a for a in result["agents"] if a["name"] == "refuses")
    assert entry["status"] == "failed"
    assert "does not take http MCP servers" in entry["error"] and "api (http)" in entry["error"]
    assert SECRET.encode() not in done.stdout + done.stderr


async def test_prompt_refused_http_server_exits_2_with_one_line(tmp_path: Path, ws: Path) -> None:
    """``prompt`` to an agent that cannot take an HTTP server: exit 2, one line saying why,
    and no session was asked for."""
    agent = tmp_path / "plain.json"
    done = await run_cli(
        "prompt",
        "--agent",
        scripted(agent),
        "--mcp-server",
        "api=https://mcp.example/api",
        "hello",
        cwd=ws,
        state=tmp_path / "state",
    )
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_USAGE, stderr
    assert "does not take http MCP servers" in stderr
    assert sessions(agent) == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--mcp-server", "docs"], "expected NAME=COMMAND, NAME=URL, NAME=sse+URL"),
        (["--mcp-server", "api=ftp://host/x"], "needs an http:// or https:// url"),
        (["--mcp-server", "docs=python 'unclosed"], "cannot split"),
        (["--mcp-header", "api"], "expected SERVER:NAME=VALUE"),
        (["--mcp-env", "docs"], "expected SERVER:VAR=VALUE or SERVER:VAR"),
        (["--mcp-env", "docs:MCP_UNSET_VARIABLE_7"], "$MCP_UNSET_VARIABLE_7 is not set"),
        (["--mcp-server", "docs=prog", "--mcp-header", "nope:X=1"], "no --mcp-server nope"),
        (["--mcp-server", "docs=prog", "--mcp-header", "docs:X=1"], "not a url or headers"),
    ],
)
async def test_bad_mcp_options_are_one_line_usage_errors(
    tmp_path: Path, ws: Path, args: list[str], message: str
) -> None:
    """Each malformed option: exit 2, one line on stderr, no agent started."""
    agent = tmp_path / "never.json"
    done = await run_cli(
        "prompt", "--agent", scripted(agent), *args, "hello", cwd=ws, state=tmp_path / "state"
    )
    stderr = done.stderr.decode()
    assert done.returncode == EXIT_USAGE, stderr
    assert message in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert record_events(agent.with_suffix(".jsonl")) == []


async def test_run_and_config_servers(
    tmp_path: Path, ws: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run --mcp-server NAME`` takes a trusted config's [mcp_servers.NAME]; an agent's
    ``mcp_servers`` come first; the pipeline's step adds its own."""
    agent = tmp_path / "alpha.json"
    name, _, command = scripted(agent).partition("=")
    config = tmp_path / "user.toml"
    config.write_text(
        f"[mcp_servers.docs]\ncommand = {json.dumps([sys.executable, '-V'])}\n\n"
        f"[mcp_servers.own]\nurl = 'http://127.0.0.1:9/mcp'\n\n"
        f"[agents.{name}]\ncommand = {json.dumps(shlex.split(command))}\n"
        "mcp_servers = ['own']\n"
    )
    script = AgentScript(
        name=name,
        capabilities=Capabilities(mcp_http=True),
        turns=(Turn(steps=(Say("ok"),)),),
        record_path=str(agent.with_suffix(".jsonl")),
    )
    agent.write_bytes(orjson.dumps(script.to_json()))
    pipeline = tmp_path / "p.py"
    pipeline.write_text(
        "from orchestrator import step\n\n"
        f"@step(agent={name!r}, mcp_servers=['extra=prog --x'])\n"
        "def work() -> str:\n    return 'go'\n"
    )
    monkeypatch.setenv("ORCHESTRATOR_CONFIG", str(config))
    done = await run_cli(
        "run", str(pipeline), "--mcp-server", "docs", "--json", cwd=ws, state=tmp_path / "s"
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    [servers] = sessions(agent)
    assert [s["name"] for s in servers] == ["own", "docs", "extra"]
