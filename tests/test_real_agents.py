"""End to end with real ACP agents from npm (Qwen Code, Claude Code's adapter), offline.

Each agent's model endpoint is the scripted model server on 127.0.0.1, which plays the same
task to both: read a file, edit it, write a new file, run a command. The proxy variables point
at the server too, which refuses to proxy: nothing leaves the machine. Skipped with the reason
when node or an agent is missing (``python tools/install_node_agents.py`` installs them); under
``$CI`` with npm present a missing agent fails instead.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import pid_gone
from real_agents import (
    AGENTS,
    CLAUDE,
    PIPELINE_EDITED,
    PIPELINE_FILES,
    QWEN,
    Project,
    RealAgent,
    SocketWatch,
    compare_scenario,
    edit_policy,
    edit_scenario,
    make_project,
    permission_requests,
    pipeline_marker,
    pipeline_scenarios,
    received_methods,
    require_installed,
    stall_scenario,
    tagged_processes,
    task_scenario,
    write_policy_toml,
)

from orchestrator.agent.client import open_agent
from orchestrator.agent.permissions import TERMINAL_CREATE
from orchestrator.agent.transcript import TranscriptWriter
from orchestrator.config import Config
from orchestrator.errors import TurnTimeout
from orchestrator.pipeline import Pipeline, step
from orchestrator.pipeline.results import StepContext
from orchestrator.runs import PromptRun, apply_run, compare, get_run_json, prompt, run_pipeline
from orchestrator.testing.model_server import ModelServer, open_model_server

pytestmark = [pytest.mark.real_agent, pytest.mark.slow]

#: a real agent starts in 1-3 s and plays the five-step task in 5-10 s; leave room
LIMIT = 180.0
TASK = "Please do RA-TASK in this project."
#: the console script installed with the package, next to this interpreter
ORCHESTRATOR = Path(sys.executable).parent / "orchestrator"

#: agents whose full task ran / passed in this session (for the count in the last test)
ATTEMPTED: set[str] = set()
EXERCISED: set[str] = set()


@pytest.fixture(params=AGENTS, ids=[a.name for a in AGENTS])
def agent(request: pytest.FixtureRequest) -> RealAgent:
    """Each real agent, skipped (or failed under CI) when it is not installed."""
    real: RealAgent = request.param
    require_installed(real)
    return real


@pytest.fixture
def tag() -> str:
    """A mark in the agent's environment that finds all its processes afterwards."""
    return uuid.uuid4().hex


@pytest.fixture
def project(tmp_path: Path) -> Project:
    """The small project the task runs on."""
    return make_project(tmp_path / "project")


def assert_no_orphans(tag: str) -> None:
    """No process of the agent run is left (the agent, its children, its shells)."""
    assert tagged_processes(tag) == [], "agent processes outlived the run"


def tool_results_with(server: ModelServer, text: str) -> list[str]:
    """Tool results, in any model request, that contain ``text``."""
    return [r for request in server.requests for r in request.tool_results() if text in r]


def check_task_run(run: PromptRun, server: ModelServer, transcript: Path, project: Project) -> None:
    """What the full task must have produced, whichever way the agent wrote its files."""
    assert run.turn.stop_reason == "end_turn", run.turn.text
    assert "Task complete." in run.turn.text
    assert {c.path: c.change for c in run.changes} == {
        "greet.py": "modified",
        Project.NEW_FILE: "added",
    }
    assert '+    return "Hi, " + name' in run.diff
    assert f"+{Project.NEW_CONTENT.splitlines()[0]}" in run.diff
    # the permission audit holds exactly one record per request on the wire, and one per
    # terminal command the policy vetted
    asked = permission_requests(transcript)
    wire = [p for p in run.permissions if p.tool_call_id != TERMINAL_CREATE]
    # (edit and write always ask; Qwen Code runs a harmless command like printf unasked)
    assert len(wire) == len(asked) >= 2, [p.title for p in run.permissions]
    assert {p.tool_call_id for p in wire} == {
        str(m["params"]["toolCall"]["toolCallId"])  # type: ignore[index]
        for m in asked
    }
    assert all(p.verdict == "allow" for p in run.permissions)
    # the command ran and its output went back to the model in the next request
    assert tool_results_with(server, Project.OUTPUT), "the command's output never reached the model"
    steps = [r.step for r in server.requests if r.scenario == "RA-TASK"]
    assert steps[:5] == [0, 1, 2, 3, 4]


# --------------------------------------------------------------------------- the task


async def test_task_through_the_library(
    agent: RealAgent, project: Project, tmp_path: Path, tag: str, state_dir: Path
) -> None:
    """The agent reads, edits, writes and runs a command; the changes come back, unapplied."""
    ATTEMPTED.add(agent.name)
    before = project.snapshot()
    transcript = tmp_path / "wire.ndjson"
    async with open_model_server([task_scenario()]) as server:
        spec = agent.spec(server, tmp_path / "home", tag=tag)
        with trio.fail_after(LIMIT):
            run = await prompt(
                spec,
                TASK,
                cwd=project.root,
                policy=edit_policy(),
                transcript=transcript,
                state_dir=state_dir,
            )
    check_task_run(run, server, transcript, project)
    assert not run.applied
    assert project.snapshot() == before, "the workspace changed without apply"
    assert Path(run.run_dir, "changes.patch").is_file()
    assert run.agent_info is not None and run.agent_info.version
    assert_no_orphans(tag)
    EXERCISED.add(agent.name)


async def test_task_applied(
    agent: RealAgent, project: Project, tmp_path: Path, tag: str, state_dir: Path
) -> None:
    """With apply=True the same task's changes land in the workspace, and nothing else."""
    async with open_model_server([task_scenario()]) as server:
        spec = agent.spec(server, tmp_path / "home", tag=tag)
        with trio.fail_after(LIMIT):
            run = await prompt(
                spec, TASK, cwd=project.root, policy=edit_policy(), apply=True, state_dir=state_dir
            )
    assert run.turn.stop_reason == "end_turn"
    assert run.applied and run.workspace_changed == ()
    assert project.snapshot() == {
        "README.md": Project.FILES["README.md"],
        "greet.py": Project.EDITED,
        Project.NEW_FILE: Project.NEW_CONTENT,
    }
    assert_no_orphans(tag)


async def test_task_through_the_command_line(
    agent: RealAgent, project: Project, tmp_path: Path, tag: str, state_dir: Path
) -> None:
    """``orchestrator prompt --agent NAME=COMMAND --json`` reports the same run."""
    before = project.snapshot()
    transcript = tmp_path / "wire.ndjson"
    policy = write_policy_toml(tmp_path / "policy.toml")
    async with open_model_server([task_scenario()]) as server:
        home = tmp_path / "home"
        agent.prepare_home(home)
        env = {**os.environ, **agent.environment(server, home, tag=tag)}
        command = [
            str(ORCHESTRATOR),
            "prompt",
            "--agent",
            f"{agent.name}={' '.join(agent.command())}",
            "--json",
            "--cwd",
            str(project.root),
            "--policy",
            str(policy),
            "--transcript",
            str(transcript),
            "--state-dir",
            str(state_dir),
            TASK,
        ]
        with trio.fail_after(LIMIT):
            done = await trio.run_process(
                command, env=env, capture_stdout=True, capture_stderr=True, check=False
            )
    stderr = done.stderr.decode(errors="replace")[-3000:]
    assert done.returncode == 0, stderr
    result = json.loads(done.stdout)
    assert result["stopReason"] == "end_turn"
    assert result["agent"]["name"] == agent.name
    changes = {c["path"]: c["change"] for c in result["changes"]}
    assert changes == {"greet.py": "modified", Project.NEW_FILE: "added"}
    wire = [p for p in result["permissions"] if p["toolCallId"] != TERMINAL_CREATE]
    assert len(wire) == len(permission_requests(transcript)) >= 2
    assert all(p["verdict"] == "allow" for p in result["permissions"])
    assert result["applied"] is False and result["patch"]
    assert tool_results_with(server, Project.OUTPUT)
    assert project.snapshot() == before
    assert_no_orphans(tag)


# --------------------------------------------------------------------------- reject, cancel


async def test_rejected_edit_ends_the_turn_cleanly(
    agent: RealAgent, project: Project, tmp_path: Path, tag: str, state_dir: Path
) -> None:
    """A read-only policy rejects the edit: one audit record, no change, a normal stop."""
    before = project.snapshot()
    transcript = tmp_path / "wire.ndjson"
    async with open_model_server([edit_scenario()]) as server:
        spec = agent.spec(server, tmp_path / "home", tag=tag)
        with trio.fail_after(LIMIT):
            run = await prompt(
                spec,
                "Please do RA-EDIT.",
                cwd=project.root,
                policy="read-only",
                transcript=transcript,
                state_dir=state_dir,
            )
    assert run.turn.stop_reason == "end_turn"
    assert [p.verdict for p in run.permissions] == ["reject"]
    assert len(permission_requests(transcript)) == 1
    assert run.changes == ()
    assert project.snapshot() == before
    assert "fs/write_text_file" not in received_methods(transcript)
    assert_no_orphans(tag)


async def test_cancel_mid_turn(
    agent: RealAgent, project: Project, tmp_path: Path, tag: str
) -> None:
    """session/cancel while the model stalls: stop reason cancelled, the request aborted."""
    async with open_model_server([stall_scenario()]) as server:
        spec = agent.spec(server, tmp_path / "home", tag=tag)
        pid = None
        with trio.fail_after(LIMIT):
            async with open_agent(
                list(spec.command),
                name=spec.name,
                cwd=project.root,
                env=dict(spec.env),
                transcript=TranscriptWriter(tmp_path / "wire.ndjson", agent=spec.name),
            ) as conn:
                pid = conn.pid
                session = await conn.new_session(str(project.root))
                async with session.open_turn("Please do RA-STALL.") as turn:
                    await server.wait_for_stall()
                    await session.cancel()
            assert turn.result is not None
            assert turn.result.stop_reason == "cancelled"
            # the agent gave up its model request (it did not just stop listening)
            ended = await trio.to_thread.run_sync(server.wait_stalls_ended, 1, 30.0)
            assert ended and server.stalls_ended == ["client closed"]
    assert pid is not None and pid_gone(pid)
    assert_no_orphans(tag)


async def test_turn_timeout_cancels(
    agent: RealAgent, project: Project, tmp_path: Path, tag: str, state_dir: Path
) -> None:
    """The turn timeout cancels a stalled turn; the agent answers the cancel and is gone; the
    prompt returns its failed run (a run that started returns its outcome)."""
    async with open_model_server([stall_scenario()]) as server:
        spec = agent.spec(server, tmp_path / "home", tag=tag)
        with trio.fail_after(LIMIT):
            run = await prompt(
                spec, "Please do RA-STALL.", cwd=project.root, timeout=10, state_dir=state_dir
            )
        assert server.wait_stalled(0), "the turn timed out before the model request stalled"
    assert (run.status, run.error_kind) == ("failed", "timeout")
    assert isinstance(run.exception, TurnTimeout)
    assert run.exception.unresponsive is False  # it answered session/cancel in time
    assert_no_orphans(tag)


# --------------------------------------------------------------------------- the network


async def test_no_traffic_leaves_the_machine(
    agent: RealAgent, project: Project, tmp_path: Path, tag: str, state_dir: Path
) -> None:
    """Every connection goes to 127.0.0.1: proxied attempts are refused, no other peer seen."""
    watch = SocketWatch(tag)
    async with open_model_server([task_scenario()]) as server:
        spec = agent.spec(server, tmp_path / "home", tag=tag)
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(watch.run)
                run = await prompt(
                    spec, TASK, cwd=project.root, policy=edit_policy(), state_dir=state_dir
                )
                nursery.cancel_scope.cancel()
    assert run.turn.stop_reason == "end_turn"
    assert server.requests, "the agent never reached the model server"
    assert watch.samples > 0 and watch.pids, "the watch never saw the agent's processes"
    print(f"{agent.name}: processes {sorted(watch.pids)}, TCP peers {sorted(watch.peers)}")
    assert watch.off_machine == set(), f"connections off the machine: {watch.off_machine}"
    # whatever went through the proxy variables was refused, and is listed here
    refused_hosts = sorted({r.host for r in server.refused})
    print(f"{agent.name}: {len(server.requests)} model requests, proxy refused {refused_hosts}")
    assert all(r.host not in ("127.0.0.1", "localhost") for r in server.refused)
    assert_no_orphans(tag)


# --------------------------------------------------------------------------- compare


#: run in each agent's branch after its turn: the module imports and no longer says Hello
COMPARE_VERIFY = (
    f"{shlex.quote(sys.executable)} -B -c "
    "\"import greet; assert not greet.greet('Ada').startswith('Hello')\" && test -f NOTES.md"
)


def wire_permissions(transcript: Path) -> dict[str, str | None]:
    """toolCallId -> the tool kind the agent sent (None: left out), per permission request."""
    out = {}
    for message in permission_requests(transcript):
        call: Any = message["params"]
        call = call["toolCall"]
        out[str(call["toolCallId"])] = call.get("kind")
    return out


def methods_count(transcript: Path, method: str) -> int:
    """How many requests of ``method`` the client sent (one ``initialize`` per process)."""
    count = 0
    for line in transcript.read_text("utf-8").splitlines():
        frame = json.loads(line) if line.strip() else {}
        msg = frame.get("msg")
        if frame.get("dir") == "send" and isinstance(msg, dict) and msg.get("method") == method:
            count += 1
    return count


async def test_compare_qwen_and_claude(project: Project, tmp_path: Path, state_dir: Path) -> None:
    """Both agents do the task on their own branch, verify passes in each, apply takes one."""
    for real in (QWEN, CLAUDE):
        require_installed(real)
    before = project.snapshot()
    tags = {real.name: uuid.uuid4().hex for real in (QWEN, CLAUDE)}
    transcript = tmp_path / "wire.ndjson"
    # one model per agent, each signing its edits, so the two branches differ
    async with (
        open_model_server([compare_scenario("qwen")]) as qwen_model,
        open_model_server([compare_scenario("claude")]) as claude_model,
    ):
        specs = [
            QWEN.spec(qwen_model, tmp_path / "home-qwen", tag=tags["qwen"]),
            CLAUDE.spec(claude_model, tmp_path / "home-claude", tag=tags["claude"]),
        ]
        with trio.fail_after(LIMIT):
            outcome = await compare(
                specs,
                "Please do RA-COMPARE in this project.",
                verify=COMPARE_VERIFY,
                cwd=project.root,
                policy=edit_policy(),
                config=Config(agents={}),
                state_dir=state_dir,
                transcript=transcript,
            )
    agents = {one["name"]: one for one in outcome.result["agents"]}
    assert outcome.status == "succeeded", {n: a["error"] for n, a in agents.items()}
    assert set(agents) == {"qwen", "claude"}
    asked = wire_permissions(transcript)
    for name, one in agents.items():
        assert one["status"] == "succeeded", one["error"]
        assert one["stopReason"] == "end_turn"
        assert f"{name} finished." in one["text"]
        assert one["agentInfo"]["version"]
        changes = {c["path"]: c["change"] for c in one["changes"]}
        assert changes == {"greet.py": "modified", Project.NEW_FILE: "added"}
        assert f'+    return "Hi from {name}, " + name' in one["diff"]
        assert f"+Written by {name}." in one["diff"]
        assert one["verify"]["exitCode"] == 0, one["verify"]["output"]
        # the edit and the write were asked for and allowed; every record is on the wire
        assert len(one["permissions"]) >= 2
        assert all(p["verdict"] == "allow" for p in one["permissions"])
        assert {p["toolCallId"] for p in one["permissions"]} <= {*asked, TERMINAL_CREATE}
    wire = {
        name: [p for p in one["permissions"] if p["toolCallId"] != TERMINAL_CREATE]
        for name, one in agents.items()
    }
    assert sum(len(records) for records in wire.values()) == len(asked)
    # each agent's own option ids, chosen by kind (allow_once)
    assert {p["optionId"] for p in wire["qwen"]} == {"proceed_once"}
    assert {p["optionId"] for p in wire["claude"]} == {"allow"}
    assert project.snapshot() == before, "the workspace changed without apply"
    for tag in tags.values():
        assert_no_orphans(tag)

    with trio.fail_after(LIMIT):
        applied = await apply_run(outcome.run_id, step="compare[qwen]", state_dir=state_dir)
    assert applied.applied
    assert sorted(applied.written) == sorted(["greet.py", Project.NEW_FILE])
    assert project.snapshot() == {
        "README.md": Project.FILES["README.md"],
        "greet.py": 'def greet(name):\n    return "Hi from qwen, " + name\n',
        Project.NEW_FILE: "# Notes\n\nWritten by qwen.\n",
    }


# --------------------------------------------------------------------------- a pipeline


#: run by the pipeline's last step in the merged files
PIPELINE_CHECK = "import mod_a, mod_b; assert mod_a.GREETING == mod_b.GREETING == 'Hi'; print('ok')"


def greeting_pipeline(agent: str) -> Pipeline:
    """files (Python) -> edit (``agent``, one branch per file) -> check (Python, in workdir)."""

    @step
    def files(pattern: str, ctx: StepContext) -> list[str]:
        """The modules to edit."""
        return sorted(p.name for p in ctx.workspace.glob(pattern))

    @step(agent=agent, over="files")
    def edit(item: str) -> str:
        """Say Hi instead of Hello in one module."""
        return f"Please do {pipeline_marker(item)} now."

    @step
    async def check(edit: Any, workdir: Path) -> int:
        """Import the edited modules; keep the output in check.log."""
        done = await trio.run_process(
            [sys.executable, "-B", "-c", PIPELINE_CHECK],
            cwd=workdir,
            capture_stdout=True,
            stderr=subprocess.STDOUT,
            check=False,
        )
        (workdir / "check.log").write_bytes(done.stdout)
        return done.returncode

    return Pipeline.from_steps([files, edit, check], name="greetings")


async def test_pipeline_fans_out_over_files(
    agent: RealAgent, tmp_path: Path, tag: str, state_dir: Path
) -> None:
    """One agent edits two files on two branches; a Python step checks the merged result."""
    root = tmp_path / "project"
    root.mkdir()
    for name, content in PIPELINE_FILES.items():
        (root / name).write_text(content, "utf-8")
    (root / "README.md").write_text("# Greetings\n", "utf-8")
    before = Project(root).snapshot()
    transcript = tmp_path / "wire.ndjson"
    async with open_model_server(pipeline_scenarios()) as server:
        spec = agent.spec(server, tmp_path / "home", tag=tag)
        with trio.fail_after(LIMIT):
            outcome = await run_pipeline(
                greeting_pipeline(agent.name),
                {"pattern": "mod_*.py"},
                cwd=root,
                policy="edit",
                config=Config(agents={agent.name: spec}),
                state_dir=state_dir,
                transcript=transcript,
            )
    steps = outcome.steps
    assert outcome.status == "succeeded", {n: s.error for n, s in steps.items()}
    assert {name: s.status for name, s in steps.items()} == dict.fromkeys(
        ("files", "edit", "check"), "succeeded"
    )
    assert steps["files"].instances["files"].value == sorted(PIPELINE_FILES)
    edits = steps["edit"].instances
    assert sorted(one.item for one in edits.values()) == sorted(PIPELINE_FILES)
    for one in edits.values():
        assert one.agent == agent.name and one.stop_reason == "end_turn"
        assert [(c.path, c.change) for c in one.changes] == [(one.item, "modified")]
        assert f"Edited {one.item}." in str(one.text)
    assert steps["check"].instances["check"].value == 0
    # the merged diff: both edits and the check's log, nothing else
    changes = {c["path"]: c["change"] for c in outcome.result["changes"]}
    assert changes == {"mod_a.py": "modified", "mod_b.py": "modified", "check.log": "added"}
    assert outcome.diff.count('+GREETING = "Hi"') == 2
    assert "+ok" in outcome.diff
    assert Project(root).snapshot() == before, "the workspace changed without apply"
    # the run store keeps one allowed audit record per permission request on the wire
    stored = await get_run_json(outcome.run_id, state_dir=state_dir)
    records = [
        p
        for one in stored["steps"]["edit"]["instances"].values()
        for p in one["permissions"]
        if p["toolCallId"] != TERMINAL_CREATE
    ]
    asked = wire_permissions(transcript)
    assert len(records) == len(asked) >= 2
    assert {p["toolCallId"] for p in records} == set(asked)
    assert all(p["verdict"] == "allow" for p in records)
    # the edit preset decides by kind: Claude's adapter leaves kind out of its requests, the
    # client fills it in from the tool call the turn already announced
    assert {p["kind"] for p in records} == {"edit"}
    assert {p["rule"] for p in records} == {"run/edit: edit in workspace"}
    assert set(asked.values()) == ({None} if agent is CLAUDE else {"edit"})
    # (the audit names the agent process that asked: NAME#N)
    assert {p["agent"].split("#")[0] for p in records} == {agent.name}
    # one agent process served both sessions, each in its own branch directory (the edits
    # landed on the right branches above)
    assert methods_count(transcript, "session/new") == 2
    assert methods_count(transcript, "initialize") == 1
    print(f"{agent.name}: permissions {[(p['title'], p['optionId']) for p in records]}")
    assert_no_orphans(tag)
    # applying the run writes the merged files
    with trio.fail_after(LIMIT):
        applied = await apply_run(outcome.run_id, state_dir=state_dir)
    assert applied.applied
    assert Project(root).snapshot() == {
        **before,
        **dict.fromkeys(PIPELINE_FILES, PIPELINE_EDITED),
        "check.log": "ok\n",
    }


# --------------------------------------------------------------------------- summary


def test_real_agents_exercised() -> None:
    """Every real agent whose task test ran passed it (the count is in the message)."""
    if not ATTEMPTED:
        pytest.skip("no real agent ran in this session")
    names = ", ".join(sorted(EXERCISED)) or "none"
    message = f"{len(EXERCISED)} real ACP agents exercised end to end: {names}"
    print(message)
    assert EXERCISED == ATTEMPTED, message
