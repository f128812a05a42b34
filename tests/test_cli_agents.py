"""``orchestrator agents`` through the console script: the table, ``--check`` and its exit code,
what a failed check keeps and says, agents run through npx, and mistyped agent names."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from run_helpers import CLI, CLI_LIMIT, agent_command, project_config

from orchestrator.cli.output import output_schema
from orchestrator.testing import AgentScript
from orchestrator.testing.script import AuthMethod, ExitAtStart

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

pytestmark = pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")

#: how Claude's adapter offers its login (a method whose description names the command)
CLAUDE_LOGIN = AuthMethod(
    id="claude-login",
    name="Log in with Claude Code",
    description="Run `claude /login` in the terminal",
)


async def agents(
    *args: str,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    unset: Sequence[str] = (),
) -> subprocess.CompletedProcess[bytes]:
    """Run ``orchestrator agents ARGS`` to its end and capture its output; ``env`` is added to
    this environment, and the variables named in ``unset`` are left out of it."""
    environ = {k: v for k, v in os.environ.items() if k not in unset}
    with trio.fail_after(CLI_LIMIT):
        return await trio.run_process(
            [str(CLI), "agents", *args],
            cwd=cwd,
            env={**environ, **(env or {})},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


def agent_table(project: Path, **scripts: AgentScript | str) -> None:
    """A trusted ``.orchestrator.toml`` in ``project`` naming each agent: a scripted agent
    (its script is written beside the file) or a command line."""
    lines: list[str] = []
    for name, script in scripts.items():
        if isinstance(script, str):
            command = json.dumps(script)
        else:
            path = project / f"{name}.json"
            path.write_text(json.dumps(script.to_json()))
            command = json.dumps(agent_command(path))
        lines += [f"[agents.{name}]", f"command = {command}", "startup_timeout = 20", ""]
    project_config(project, "\n".join(lines))


def rows(done: subprocess.CompletedProcess[bytes]) -> dict[str, Any]:
    """The agents of an ``agents --json`` output (valid under the shipped schema), by name."""
    document = json.loads(done.stdout)
    jsonschema.Draft202012Validator(output_schema()).validate(document)
    return {row["name"]: row for row in document["agents"]}


def text(done: subprocess.CompletedProcess[bytes]) -> str:
    """The command's standard output."""
    return done.stdout.decode()


# --------------------------------------------------------------------------- a passing check


async def test_check_of_the_demo_prints_what_it_offers_and_exits_0(tmp_path: Path) -> None:
    """`agents --check demo`: a block with name, version, protocol, capabilities, auth, session."""
    done = await agents("--check", "demo", cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    out = text(done)
    assert out.startswith("demo: ok\n")
    for line in (
        "  agent         demo-agent 1.0.0 (protocol version 1)",
        "  load session  no",
        "  prompt        image no, audio no, embedded context yes",
        "  MCP servers   http no, sse no",
        "  sessions      new and prompt only",
        "  auth methods  none",
        "  session/new   ok",
    ):
        assert line + "\n" in out
    assert out.endswith("checked 1: 1 ok\n")


# --------------------------------------------------------------------------- failed checks


async def test_a_check_that_needs_a_login_exits_1_with_the_login_to_run(tmp_path: Path) -> None:
    """session/new answers auth required: exit 1, the facts of initialize kept, the login named."""
    script = AgentScript(
        name="claude-agent-acp",
        version="0.31.0",
        auth_methods=(CLAUDE_LOGIN, AuthMethod(id="api-key", name="API key")),
        require_auth=True,
    )
    # the known name, run as this script: its API key variable is known too
    agent_table(tmp_path, claude=script)
    listed = await agents("--check", "--json", "claude", cwd=tmp_path, unset=["ANTHROPIC_API_KEY"])
    assert listed.returncode == EXIT_FAILED, listed.stderr.decode()
    row = rows(listed)["claude"]
    assert (row["agentName"], row["version"], row["protocolVersion"]) == (
        "claude-agent-acp",
        "0.31.0",
        1,
    )
    assert [m["id"] for m in row["authMethods"]] == ["claude-login", "api-key"]
    assert row["capabilities"]["promptCapabilities"] == {
        "image": False,
        "audio": False,
        "embeddedContext": False,
    }
    assert row["sessionNew"] == "needs login"
    check = row["check"]
    assert (check["status"], check["step"]) == ("needs login", "session/new")
    assert "needs a login" in check["cause"]
    assert "ANTHROPIC_API_KEY is not set" in check["cause"]
    assert check["nextStep"].startswith("run `claude /login`, or set ANTHROPIC_API_KEY")
    assert "auth_method = 'api-key' in [agents.claude]" in check["nextStep"]

    shown = await agents("--check", "claude", cwd=tmp_path, unset=["ANTHROPIC_API_KEY"])
    assert shown.returncode == EXIT_FAILED
    out = text(shown)
    assert out.startswith("claude: needs login at session/new\n")
    assert "  agent         claude-agent-acp 0.31.0 (protocol version 1)\n" in out
    assert (
        "  auth methods  claude-login (Log in with Claude Code: Run `claude /login` in the "
        "terminal); api-key (API key)\n" in out
    )
    assert "  session/new   needs login\n" in out
    assert "  next step     run `claude /login`, or set ANTHROPIC_API_KEY" in out
    assert out.endswith("checked 1: 1 needs login\n")


async def test_an_agent_that_exits_at_start_shows_its_stderr_tail(tmp_path: Path) -> None:
    """An agent that writes to stderr and exits: exit 1, the cause, and its last lines escaped."""
    noise = "".join(f"line {i}\n" for i in range(30))
    script = AgentScript(
        name="crasher",
        exit_at_start=ExitAtStart(exit_code=3, stderr=noise + "Error: \x1b[31mno model\x1b[0m\n"),
    )
    agent_table(tmp_path, crasher=script)
    done = await agents("--check", "--json", "crasher", cwd=tmp_path)
    assert done.returncode == EXIT_FAILED
    row = rows(done)["crasher"]
    assert row["agentName"] is None and row["sessionNew"] is None
    check = row["check"]
    assert (check["status"], check["step"]) == ("failed", "initialize")
    assert check["cause"] == "the agent exited (exit status 3) before answering initialize"
    assert "read its stderr" in check["nextStep"]
    tail = check["stderrTail"].splitlines()
    assert len(tail) == 10  # bounded: the last lines only
    assert tail[-2:] == ["line 29", "Error: \x1b[31mno model\x1b[0m"]

    shown = await agents("--check", "crasher", cwd=tmp_path)
    assert shown.returncode == EXIT_FAILED
    out = text(shown)
    assert out.startswith("crasher: failed at initialize\n")
    assert "  cause         the agent exited (exit status 3) before answering initialize\n" in out
    assert "  stderr        " in out
    assert "                Error: \\x1b[31mno model\\x1b[0m\n" in out
    assert "\x1b" not in out  # the agent's escape sequences never reach the terminal raw
    assert "line 19\n" not in out


async def test_a_failed_initialize_keeps_what_the_agent_said(tmp_path: Path) -> None:
    """initialize answered with another protocol version: failed, its answer kept in the JSON."""
    script = AgentScript(name="future-agent", version="9.0", protocol_version=2)
    agent_table(tmp_path, future=script)
    done = await agents("--check", "--json", "future", cwd=tmp_path)
    assert done.returncode == EXIT_FAILED
    row = rows(done)["future"]
    assert (row["agentName"], row["version"], row["protocolVersion"]) == ("future-agent", "9.0", 2)
    assert row["authMethods"] == [] and row["capabilities"]["loadSession"] is False
    assert row["sessionNew"] is None
    assert (row["check"]["status"], row["check"]["step"]) == ("failed", "initialize")
    assert "another version of ACP" in row["check"]["cause"]


async def test_an_agent_that_never_answers_initialize_is_a_timeout(tmp_path: Path) -> None:
    """No answer to initialize within startup_timeout: failed, naming the timeout and the key."""
    script = AgentScript(name="slow", initialize_delay=600)
    path = tmp_path / "slow.json"
    path.write_text(json.dumps(script.to_json()))
    project_config(
        tmp_path,
        f"[agents.slow]\ncommand = {json.dumps(agent_command(path))}\nstartup_timeout = 1\n",
    )
    done = await agents("--check", "--json", "slow", cwd=tmp_path)
    assert done.returncode == EXIT_FAILED
    check = rows(done)["slow"]["check"]
    assert check["step"] == "initialize"
    assert check["cause"] == "no answer to initialize within 1s (its startup_timeout)"
    assert "raise startup_timeout (now 1s)" in check["nextStep"]


async def test_a_named_agent_that_is_not_installed_fails_with_its_install_hint(
    tmp_path: Path,
) -> None:
    """`agents --check gemini` without gemini: exit 1, not installed, how to install it."""
    empty = tmp_path / "bin"
    empty.mkdir()
    done = await agents("--check", "--json", "gemini", cwd=tmp_path, env={"PATH": str(empty)})
    assert done.returncode == EXIT_FAILED
    check = rows(done)["gemini"]["check"]
    assert (check["status"], check["step"]) == ("failed", "start")
    assert check["cause"] == "not installed: gemini is not on PATH"
    assert check["nextStep"] == "install it: npm install -g @google/gemini-cli"


async def test_one_failed_agent_among_passing_ones_exits_1(tmp_path: Path) -> None:
    """Every installed agent is checked: one failure makes the exit 1, the rest still pass."""
    agent_table(tmp_path, crasher=AgentScript(name="crasher", exit_at_start=ExitAtStart()))
    empty = tmp_path / "bin"
    empty.mkdir()
    done = await agents("--check", cwd=tmp_path, env={"PATH": str(empty)})
    assert done.returncode == EXIT_FAILED
    out = text(done)
    assert "demo: ok\n" in out and "crasher: failed at initialize\n" in out
    assert out.endswith("checked 2: 1 ok, 1 failed\n")


# --------------------------------------------------------------------------- npx


def fake_npx(directory: Path) -> Path:
    """An ``npx`` on PATH that records being run (the check must not download anything)."""
    directory.mkdir()
    marker = directory / "npx-ran"
    npx = directory / "npx"
    npx.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    npx.chmod(npx.stat().st_mode | stat.S_IXUSR)
    return marker


async def test_an_npx_agent_is_shown_as_fetched_on_first_use(tmp_path: Path) -> None:
    """An agent run through npx is not "installed": it is "via npx", and not run unless named."""
    marker = fake_npx(tmp_path / "bin")
    agent_table(tmp_path, fetched="npx -y @example/some-agent --acp")
    env = {"PATH": str(tmp_path / "bin")}

    listed = await agents(cwd=tmp_path, env=env)
    assert listed.returncode == EXIT_OK
    line = next(x for x in text(listed).splitlines() if x.startswith("fetched "))
    assert line.split()[1:6] == ["via", "npx", "(downloads", "on", "first"]
    row = rows(await agents("--json", cwd=tmp_path, env=env))["fetched"]
    assert (row["installed"], row["launcher"], row["available"]) == (False, "npx", True)
    assert "check" not in row

    checked = await agents("--check", cwd=tmp_path, env=env)
    assert checked.returncode == EXIT_OK, checked.stdout.decode()
    assert "not checked, via npx (downloads on first use): claude, codex, fetched;" in text(checked)
    assert not marker.exists()  # nothing was fetched

    gone = rows(await agents("--json", "fetched", cwd=tmp_path, env={"PATH": str(tmp_path)}))
    assert (gone["fetched"]["installed"], gone["fetched"]["available"]) == (False, False)


# --------------------------------------------------------------------------- mistyped names


async def test_a_mistyped_agent_name_gets_a_did_you_mean(tmp_path: Path) -> None:
    """`--agent claud` (prompt, NAME=claud) and `agents claud`: exit 2, one line naming claude."""
    expected = "orchestrator: error: unknown agent 'claud'; did you mean 'claude'?\n"
    for argv in (
        ["prompt", "--agent", "claud", "hello"],
        ["prompt", "--agent", "fast=claud", "hello"],
        ["agents", "claud"],
        ["agents", "--check", "claud"],
    ):
        with trio.fail_after(CLI_LIMIT):
            done = await trio.run_process(
                [str(CLI), *argv], cwd=tmp_path, capture_stdout=True, capture_stderr=True,
                check=False,
            )  # fmt: skip
        assert done.returncode == EXIT_USAGE, argv
        assert done.stderr.decode() == expected, argv
        assert done.stdout == b""


async def test_any_one_api_key_variable_of_an_agent_serves(tmp_path: Path) -> None:
    """codex reads OPENAI_API_KEY or CODEX_API_KEY: both unset is named, one set is enough."""
    methods = (AuthMethod(id="chatgpt", name="ChatGPT"), AuthMethod(id="api-key", name="Key"))
    agent_table(tmp_path, codex=AgentScript(auth_methods=methods, require_auth=True))
    for extra, said in (({}, True), ({"CODEX_API_KEY": "x"}, False)):
        done = await agents(
            "--check", "--json", "codex", cwd=tmp_path, env=extra,
            unset=["OPENAI_API_KEY", "CODEX_API_KEY"],
        )  # fmt: skip
        check = rows(done)["codex"]["check"]
        assert check["status"] == "needs login"
        assert ("set OPENAI_API_KEY" in check["nextStep"]) is said
        assert ("API_KEY" in check["cause"]) is said
        if said:
            assert "set OPENAI_API_KEY or CODEX_API_KEY" in check["nextStep"]
            assert "none of OPENAI_API_KEY, CODEX_API_KEY is set" in check["cause"]
        assert "auth_method = 'chatgpt' in [agents.codex]" in check["nextStep"]


async def test_the_listing_says_what_each_known_agent_needs(tmp_path: Path) -> None:
    """Each of the eleven known agents says what it needs, in the table and in --json."""
    done = await agents("--json", cwd=tmp_path)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    listed = rows(done)
    eleven = [
        "claude",
        "codex",
        "gemini",
        "qwen",
        "opencode",
        "copilot",
        "auggie",
        "qoder",
        "kiro",
        "openclaw",
        "hermes",
    ]
    for name in eleven:
        needs = listed[name]["needs"]
        assert needs["login"] or needs["apiKeys"], name  # how to get it authorised
    assert listed["openclaw"]["needs"]["service"] == "a running OpenClaw Gateway"
    assert listed["openclaw"]["needs"]["runtime"] == "Node.js >= 24.16"
    assert listed["qoder"]["needs"]["login"] == "qodercli login"
    assert listed["hermes"]["needs"]["login"] == "hermes acp --setup"
    assert listed["codex"]["needs"]["apiKeys"] == ["OPENAI_API_KEY", "CODEX_API_KEY"]
    table = text(await agents(cwd=tmp_path)).splitlines()
    below = table[next(i for i, line in enumerate(table) if line.startswith("openclaw ")) + 1]
    assert below.split()[:1] == ["needs:"]
    assert "Node.js >= 24.16" in below and "a running OpenClaw Gateway" in below
