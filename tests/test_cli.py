"""The installed ``orchestrator`` console script, run as a subprocess.

These runs are outside this process, so the autouse frame validator cannot see them: the
transcript test checks the wire with :func:`schema_check.validate_transcript` instead.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from conftest import is_process_watchdog, pid_gone
from schema_check import validate_transcript

from orchestrator.agents import KNOWN_AGENTS
from orchestrator.testing import AgentScript, Crash, Say, Stall, Turn, WriteDisk
from orchestrator.testing.scripted_agent import scripted_agent_command

CLI = Path(sys.executable).parent / "orchestrator"
SAMPLE = Path(__file__).resolve().parent.parent / "examples" / "sample-project"
LIMIT = 60.0
DEMO_EDIT = 'replace "colour" with "color" in **/*.md'
EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

pytestmark = pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")


async def run_cli(
    *args: str, cwd: Path, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Run the console script to its end and capture its output."""
    with trio.fail_after(LIMIT):
        return await trio.run_process(
            [str(CLI), *args],
            cwd=cwd,
            env={**os.environ, **(env or {})},
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` with its bytes."""
    return {
        str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()
    }


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A fresh copy of the sample project."""
    root = tmp_path / "sample-project"
    shutil.copytree(SAMPLE, root)
    return root


def stalling_agent(directory: Path, *, ignore_cancel: bool = False) -> str:
    """``--agent`` text for a scripted agent whose turn writes started.txt, then never ends."""
    script = AgentScript(
        name="stalling-agent",
        turns=(
            Turn(
                # an absolute path: the session runs in a branch directory, not in `directory`
                steps=(WriteDisk(path=str(directory / "started.txt"), content="started"), Stall()),
                ignore_cancel=ignore_cancel,
            ),
        ),
    )
    return "staller=" + shlex.join(scripted_agent_command(script, directory))


def children_of(pid: int) -> list[int]:
    """The pids whose parent is ``pid`` (from /proc), leaving out its process watchdog."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        child = int(entry.name)
        if int(stat.rsplit(")", 1)[1].split()[1]) == pid and not is_process_watchdog(child):
            found.append(child)
    return found


# --------------------------------------------------------------------------- help and usage


async def test_help_lists_the_commands(tmp_path: Path) -> None:
    """--help exits 0 and names every command."""
    done = await run_cli("--help", cwd=tmp_path)
    assert done.returncode == EXIT_OK
    out = done.stdout.decode()
    assert "usage: orchestrator" in out
    assert re.search(r"^\s+prompt\s", out, re.M)
    assert re.search(r"^\s+agents\s", out, re.M)


async def test_prompt_help_lists_its_options(tmp_path: Path) -> None:
    """prompt --help documents every option."""
    done = await run_cli("prompt", "--help", cwd=tmp_path)
    assert done.returncode == EXIT_OK
    out = done.stdout.decode()
    options = (
        "--agent",
        "--cwd",
        "--policy",
        "--transcript",
        "--json",
        "--timeout",
        "--idle-timeout",
    )
    for option in options:
        assert option in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["prompt", "--agent", "demo", "--bogus", "hi"], "unrecognized arguments: --bogus"),
        (["prompt", "hi"], "the following arguments are required: --agent"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["prompt", "--agent", "demo", "--timeout", "soon", "hi"], "expected a number of seconds"),
        (["prompt", "--agent", "demo", "--policy", "nonsense", "hi"], "policy nonsense: neither"),
    ],
)
async def test_bad_usage_exits_2(tmp_path: Path, args: list[str], message: str) -> None:
    """Unknown options, missing arguments and bad values exit 2 with a usage message."""
    done = await run_cli(*args, cwd=tmp_path)
    assert done.returncode == EXIT_USAGE
    assert message in done.stderr.decode()
    assert done.stdout == b""


async def test_missing_cwd_exits_2(tmp_path: Path) -> None:
    """A --cwd that does not exist is bad input: exit 2, and no agent is started."""
    missing = tmp_path / "nowhere"
    done = await run_cli("prompt", "--agent", "demo", "--cwd", str(missing), "hi", cwd=tmp_path)
    assert done.returncode == EXIT_USAGE
    assert f"{missing} is not a directory" in done.stderr.decode()


async def test_agent_command_not_found_exits_2(tmp_path: Path) -> None:
    """An agent command that does not exist is bad input: exit 2, naming the command."""
    done = await run_cli("prompt", "--agent", "no-such-agent-xyz --acp", "hi", cwd=tmp_path)
    assert done.returncode == EXIT_USAGE
    err = done.stderr.decode()
    assert "orchestrator: error:" in err
    assert "no-such-agent-xyz" in err


# --------------------------------------------------------------------------- prompt with the demo


async def test_prompt_json_reports_every_field(project: Path) -> None:
    """--json prints exactly one object with every field; the default policy rejects the edit."""
    before = snapshot(project)
    done = await run_cli(
        "prompt", "--agent", "demo", "--cwd", str(project), "--json", DEMO_EDIT, cwd=project.parent
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result: dict[str, Any] = orjson.loads(done.stdout)  # the whole stdout is one JSON document
    assert set(result) == {
        "schemaVersion",
        "kind",
        "runId",
        "status",
        "sessionId",
        "agent",
        "model",
        "mode",
        "stopReason",
        "text",
        "toolCalls",
        "cut",
        "permissions",
        "usage",
        "changes",
        "diff",
        "applied",
        "workspaceChanged",
        "patch",
        "patchLeftOut",
        "wallSeconds",
        "sandbox",
        "defaultRejections",
        "didNothing",
        "warnings",
        "notices",
        "error",
        "errorKind",
    }
    assert (result["error"], result["errorKind"]) == (None, None)  # it did not fail
    assert result["sandbox"] is None  # not confined unless asked
    assert result["defaultRejections"] == {
        "count": 1,
        "steps": {"prompt": 1},
        "reused": 0,
        "scoped": False,
    }
    assert result["cut"] is None  # the run store keeps the whole turn
    # the demo's edit was refused by the default policy: nothing changed anywhere
    assert (result["changes"], result["diff"], result["applied"]) == ([], "", False)
    assert (result["workspaceChanged"], result["patch"], result["patchLeftOut"]) == ([], None, [])
    assert re.fullmatch(r"[0-9a-f]{12}", result["runId"])
    assert result["sessionId"] == "demo-1"
    assert result["agent"] == {
        "name": "demo",
        "version": "1.0.0",
        "reportedName": "demo-agent",
        "quirks": [],
    }
    assert (result["model"], result["mode"]) == ("demo-fast", "edit")  # the agent's defaults
    assert result["stopReason"] == "end_turn"
    title = "Replace 'colour' with 'color' in **/*.md"
    assert result["text"] == f"Done.\n- {title}: README.md (permission refused)\n"
    # CHANGES.md matches too but has no "colour": no tool call
    assert result["toolCalls"] == [
        {
            "toolCallId": "call-0-README.md",
            "title": f"{title} (README.md)",
            "kind": "edit",
            "status": "failed",
        },
    ]
    (permission,) = result["permissions"]
    assert set(permission) == {"toolCallId", "kind", "title", "verdict", "optionId", "rule"}
    assert {k: v for k, v in permission.items() if k != "rule"} == {
        "toolCallId": "call-0-README.md",
        "kind": "edit",
        "title": f"{title} (README.md)",
        "verdict": "reject",
        "optionId": "reject",
    }
    assert permission["rule"]  # its exact name: test_default_policy_rule_is_default
    assert result["usage"]["size"] == 200_000
    assert result["usage"]["used"] > 0
    assert isinstance(result["wallSeconds"], float)
    assert 0 < result["wallSeconds"] < LIMIT
    assert snapshot(project) == before


async def test_default_policy_rule_is_default(project: Path) -> None:
    """Without --policy, a rejection is recorded under the rule "default"."""
    done = await run_cli(
        "prompt", "--agent", "demo", "--cwd", str(project), "--json", DEMO_EDIT, cwd=project
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    assert [p["rule"] for p in orjson.loads(done.stdout)["permissions"]] == ["default"]


@pytest.mark.parametrize("apply", [False, True])
async def test_policy_edit_lets_the_demo_edit(project: Path, apply: bool) -> None:
    """--policy edit allows the edit into the branch; the workspace changes only with --apply."""
    readme = (project / "README.md").read_text("utf-8")
    done = await run_cli(
        "prompt",
        "--agent",
        "demo",
        "--cwd",
        str(project),
        "--policy",
        "edit",
        "--json",
        *(["--apply"] if apply else []),
        DEMO_EDIT,
        cwd=project,
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = orjson.loads(done.stdout)
    assert [(p["verdict"], p["optionId"]) for p in result["permissions"]] == [("allow", "allow")]
    assert result["changes"] == [{"path": "README.md", "change": "modified"}]
    assert "+A tiny project" in result["diff"]
    assert result["applied"] is apply
    assert Path(result["patch"]).is_file()
    expected = readme.replace("colour", "color") if apply else readme
    assert (project / "README.md").read_text("utf-8") == expected
    assert [c["status"] for c in result["toolCalls"]] == ["completed"]


async def test_prompt_streams_text_without_json(project: Path) -> None:
    """Without --json the agent's text and the result (stop reason, run status) go to stdout;
    stderr holds no part of the result."""
    done = await run_cli("prompt", "--agent", "demo", "--cwd", str(project), "hello", cwd=project)
    assert done.returncode == EXIT_OK
    out = done.stdout.decode()
    assert out.startswith("I am the demo agent")
    assert "demo (demo-agent 1.0.0): end_turn, 0 tool calls" in out
    assert out.endswith("no file changed\n")
    assert "end_turn" not in done.stderr.decode()
    assert "run " not in done.stderr.decode()


async def test_transcript_is_schema_valid(project: Path, tmp_path: Path) -> None:
    """--transcript writes every frame as {dir, t, msg}; what we sent passes the schema."""
    wire = tmp_path / "wire.ndjson"
    done = await run_cli(
        "prompt",
        "--agent",
        "demo",
        "--cwd",
        str(project),
        "--transcript",
        str(wire),
        "--json",
        DEMO_EDIT,
        cwd=project,
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    validator = validate_transcript(wire)
    assert validator.validated > 0
    entries = [orjson.loads(line) for line in wire.read_bytes().splitlines()]
    times = []
    for entry in entries:
        assert {"dir", "t", "msg"} <= set(entry)
        assert entry["dir"] in ("send", "recv")
        times.append(entry["t"])
    assert times == sorted(times)
    sent = [e["msg"].get("method") for e in entries if e["dir"] == "send"]
    assert sent[:3] == ["initialize", "session/new", "session/prompt"]
    received = [e["msg"].get("method") for e in entries if e["dir"] == "recv"]
    assert "session/request_permission" in received
    assert orjson.loads(done.stdout)["sessionId"] == "demo-1"


# --------------------------------------------------------------------------- failures


async def test_crashing_agent_exits_1_naming_it(tmp_path: Path) -> None:
    """An agent that exits before initialize: exit 1, the error names the agent and its status."""
    crash = f"crasher={shlex.quote(sys.executable)} -c 'import sys; sys.exit(3)'"
    done = await run_cli("prompt", "--agent", crash, "hi", cwd=tmp_path)
    assert done.returncode == EXIT_FAILED
    err = done.stderr.decode()
    assert "orchestrator: error: agent 'crasher'" in err
    assert "exit status 3" in err


async def test_agent_crash_mid_turn_exits_1_with_its_stderr(tmp_path: Path) -> None:
    """An agent that dies during the turn: exit 1, its exit status and stderr tail reported."""
    script = AgentScript(
        turns=(Turn(steps=(Say(text="working"), Crash(exit_code=5, stderr="boom: no memory"))),)
    )
    agent = "crashy=" + shlex.join(scripted_agent_command(script, tmp_path))
    done = await run_cli("prompt", "--agent", agent, "--cwd", str(tmp_path), "go", cwd=tmp_path)
    assert done.returncode == EXIT_FAILED
    err = done.stderr.decode()
    assert "orchestrator: error: crashy" in err
    assert "exit status 5" in err
    assert "boom: no memory" in err


async def test_large_json_result_reaches_the_pipe_whole(tmp_path: Path) -> None:
    """A --json result far larger than a pipe buffer arrives whole before the script exits."""
    text = "".join(f"line {i:06d} of a long answer\n" for i in range(20_000))  # ~560 KB
    script = AgentScript(turns=(Turn(steps=(Say(text=text, chunks=200),)),))
    agent = "talker=" + shlex.join(scripted_agent_command(script, tmp_path))
    done = await run_cli(
        "prompt", "--agent", agent, "--cwd", str(tmp_path), "--json", "go", cwd=tmp_path
    )
    assert done.returncode == EXIT_OK, done.stderr.decode()
    result = json.loads(done.stdout)
    assert result["text"] == text and result["stopReason"] == "end_turn"


async def test_turn_not_ending_in_end_turn_exits_1(tmp_path: Path) -> None:
    """A turn that ends with another stop reason (refusal) exits 1; --json still prints it."""
    script = AgentScript(turns=(Turn(steps=(Say(text="no way"),), stop_reason="refusal"),))
    agent = "refuser=" + shlex.join(scripted_agent_command(script, tmp_path))
    done = await run_cli(
        "prompt", "--agent", agent, "--cwd", str(tmp_path), "--json", "go", cwd=tmp_path
    )
    assert done.returncode == EXIT_FAILED
    result = orjson.loads(done.stdout)
    assert (result["stopReason"], result["text"]) == ("refusal", "no way")
    assert result["agent"] == {
        "name": "refuser",
        "version": "0.1.0",
        "reportedName": "scripted-agent",
        "quirks": [],
    }


@pytest.mark.parametrize("option", ["--timeout", "--idle-timeout"])
async def test_turn_past_its_timeout_exits_1(tmp_path: Path, option: str) -> None:
    """A turn that does not end within --timeout / --idle-timeout is cancelled: exit 1."""
    agent = stalling_agent(tmp_path)
    start = trio.current_time()
    done = await run_cli(
        "prompt",
        "--agent",
        agent,
        "--cwd",
        str(tmp_path),
        option,
        "1",
        "--json",
        "go",
        cwd=tmp_path,
    )
    assert done.returncode == EXIT_FAILED
    err = done.stderr.decode()
    assert "orchestrator: error: agent 'staller'" in err
    assert "timeout" in err
    failure = json.loads(done.stdout)  # --json: one error object, even on failure
    assert failure["exitCode"] == EXIT_FAILED
    assert failure["error"]["type"] == "TurnTimeout"
    assert "timeout" in failure["error"]["message"]
    assert trio.current_time() - start < 20


async def test_sigint_during_a_stalled_turn_exits_130(tmp_path: Path) -> None:
    """SIGINT while a turn hangs: exit 130 and the agent process is gone."""
    agent = stalling_agent(tmp_path, ignore_cancel=True)
    started = tmp_path / "started.txt"
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    argv: Sequence[str] = [str(CLI), "prompt", "--agent", agent, "--cwd", str(tmp_path), "go"]
    with trio.fail_after(LIMIT), out.open("wb") as stdout, err.open("wb") as stderr:
        cli = await trio.lowlevel.open_process(argv, cwd=tmp_path, stdout=stdout, stderr=stderr)
        try:
            while not started.exists():
                assert cli.poll() is None, err.read_text()
                await trio.sleep(0.05)
            (agent_pid,) = children_of(cli.pid)
            assert not pid_gone(agent_pid)
            cli.send_signal(signal.SIGINT)
            code = await cli.wait()
        finally:
            if cli.returncode is None:
                cli.kill()
                with trio.CancelScope(shield=True):
                    await cli.wait()
    assert code == EXIT_INTERRUPTED, err.read_text()
    assert pid_gone(agent_pid)
    assert "Traceback" not in err.read_text()


# --------------------------------------------------------------------------- agents


async def test_agents_lists_the_known_agents(tmp_path: Path) -> None:
    """`agents` lists every known agent, the demo included."""
    done = await run_cli("agents", cwd=tmp_path)
    assert done.returncode == EXIT_OK
    table = done.stdout.decode().split("\n\n")[0]  # then the quirks of known agents
    # a row starts at the margin; what it needs is indented under it
    names = [line.split()[0] for line in table.splitlines() if line[:1].strip()]
    assert names == [*KNOWN_AGENTS, "demo"]
    assert {"claude", "codex", "gemini", "qwen", "opencode"} <= set(names)


async def test_agents_check_json_handshakes_with_the_demo(tmp_path: Path) -> None:
    """`agents --check --json`: the demo agent's handshake is ok; absent agents are not run."""
    # An empty PATH makes every npx/CLI agent "not installed", so only the demo is started.
    empty = tmp_path / "empty-bin"
    empty.mkdir()
    done = await run_cli("agents", "--check", "--json", cwd=tmp_path, env={"PATH": str(empty)})
    assert done.returncode == EXIT_OK, done.stderr.decode()
    rows = {row["name"]: row for row in orjson.loads(done.stdout)["agents"]}
    assert set(rows) == {*KNOWN_AGENTS, "demo"}
    demo = rows["demo"]
    assert demo["installed"] is True
    assert demo["check"]["status"] == "ok"
    assert (demo["agentName"], demo["version"], demo["sessionNew"]) == ("demo-agent", "1.0.0", "ok")
    assert demo["protocolVersion"] == 1
    assert demo["authMethods"] == []
    assert demo["capabilities"] == {"promptCapabilities": {"embeddedContext": True}}
    for name in KNOWN_AGENTS:
        assert rows[name]["installed"] is False
        assert "check" not in rows[name]
