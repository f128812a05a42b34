"""Ctrl-C on ``orchestrator run`` and ``compare`` as subprocesses, then ``resume``.

The agents are scripted agents run as subprocesses (``python -m
orchestrator.testing.scripted_agent SCRIPT.json``). Each script file has a fixed path, so a test
swaps an agent's behaviour between the interrupted run and its resume by rewriting that file.
Each agent records every frame it receives (``NAME.jsonl`` beside its script): the order of
``session/cancel`` and the end of its stdin is read from there.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from conftest import pid_gone
from run_helpers import (
    CLI,
    CLI_LIMIT,
    agent_command,
    as_json,
    project_config,
    prompts,
    record_events,
    run_cli,
    snapshot,
    timeline,
    write_script,
)

from orchestrator.store import open_run_store
from orchestrator.testing import (
    AgentScript,
    AskPermission,
    PermissionToolCall,
    Say,
    Stall,
    Terminal,
    ToolCall,
    ToolUpdate,
    Turn,
    WriteDisk,
    WriteFile,
)

NAMES = ("a", "b", "c")
EXIT_OK, EXIT_INTERRUPTED = 0, 130

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed"),
]


# --------------------------------------------------------------------------- helpers


def stalling_turn(name: str) -> Turn:
    """A turn that edits its branch directory, then never ends, even when cancelled."""
    return Turn(
        steps=(WriteDisk(path=f"partial-{name}.txt", content="half done\n"), Stall()),
        ignore_cancel=True,
    )


def answering_turn(name: str) -> Turn:
    """A turn that writes ``NAME.txt`` through the client and ends."""
    return Turn(steps=(WriteFile(path=f"{name}.txt", content=f"from {name}\n"), Say(text="done")))


def blocked_turn(name: str) -> Turn:
    """A turn that says something, edits README.md on disk, then runs ``sleep 60`` in a
    terminal (allowed by the ``trusted`` policy) and never ends, even when cancelled."""
    return Turn(
        steps=(
            Say(text=f"partial from {name}"),
            ToolCall(id="edit-1", title="Edit README.md", kind="edit", status="in_progress"),
            WriteDisk(path="README.md", content=f"# edited by {name}\n"),
            ToolUpdate(id="edit-1", status="completed"),
            # announced before the terminal starts, so the client has it when the test sees
            # the terminal running
            ToolCall(id="run-1", title="sleep 60", kind="execute", status="in_progress"),
            AskPermission(
                tool_call=PermissionToolCall(
                    id="run-1", title="sleep 60", kind="execute", raw_input={"command": "sleep 60"}
                )
            ),
            Terminal(command="sleep", args=("60",)),
            Stall(),
        ),
        ignore_cancel=True,
    )


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (from /proc/PID/task/*/children)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        parent = todo.pop()
        for children in Path(f"/proc/{parent}/task").glob("*/children"):
            try:
                kids = [int(k) for k in children.read_text().split()]
            except OSError:
                continue  # the thread or process ended meanwhile
            for kid in kids:
                if kid not in found:
                    found.add(kid)
                    todo.append(kid)
    return found


def events(script: Path) -> list[dict[str, Any]]:
    """The events the agent of ``script`` recorded so far."""
    return record_events(script.with_suffix(".jsonl"))


def recorded(event: str) -> Callable[[Path], bool]:
    """Whether the agent of a script recorded ``event`` (``recv METHOD`` for a message)."""
    return lambda script: event in timeline(script.with_suffix(".jsonl"))


def prompted(script: Path) -> bool:
    """Whether the agent of ``script`` got its prompt."""
    return prompts(script) > 0


def in_terminal(script: Path) -> bool:
    """Whether the agent of ``script`` has a command running (the client created its terminal)."""
    for e in events(script):
        message = e.get("message") if e["event"] == "recv" else None
        result = message.get("result") if isinstance(message, dict) else None
        if isinstance(result, dict) and "terminalId" in result:
            return True
    return False


async def interrupt(
    argv: list[str],
    *,
    cwd: Path,
    state: Path,
    scripts: list[Path],
    out: Path,
    ready: Callable[[Path], bool] = prompted,
    again: Callable[[Path], bool] | None = None,
) -> tuple[int, set[int], str, str]:
    """Start the CLI, wait until every agent is ``ready``, send SIGINT, wait for the exit.

    With ``again``, a second SIGINT follows once every agent satisfies it. Returns the exit
    code, the pids of the CLI's descendants just before the signal, stdout and stderr.
    """
    stdout_path, stderr_path = out / "stdout.txt", out / "stderr.txt"
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    with (
        trio.fail_after(CLI_LIMIT),
        stdout_path.open("wb") as stdout,
        stderr_path.open("wb") as stderr,
    ):
        cli = await trio.lowlevel.open_process(
            [str(CLI), *argv], cwd=cwd, env=env, stdout=stdout, stderr=stderr
        )
        try:
            while not all(ready(s) for s in scripts):
                assert cli.poll() is None, stderr_path.read_text()
                await trio.sleep(0.05)
            pids = descendants(cli.pid)
            cli.send_signal(signal.SIGINT)
            if again is not None:
                while not all(again(s) for s in scripts):
                    assert cli.poll() is None, stderr_path.read_text()
                    await trio.sleep(0.05)
                cli.send_signal(signal.SIGINT)
            code = await cli.wait()
        finally:
            if cli.returncode is None:
                cli.kill()
                with trio.CancelScope(shield=True):
                    await cli.wait()
    return code, pids, stdout_path.read_text(), stderr_path.read_text()


def last_line(text: str) -> str:
    """The last line of a command's output."""
    return text.rstrip("\n").rsplit("\n", 1)[-1]


async def run_ids(state: Path) -> list[str]:
    """The recorded run ids, newest first (read from the store)."""
    async with open_run_store(state) as store:
        return [r.run_id for r in await store.list_runs(limit=None)]


# --------------------------------------------------------------------------- fixtures


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """The workspace: two small files."""
    root = tmp_path / "project"
    (root / "src").mkdir(parents=True)
    (root / "README.md").write_text("# project\n")
    (root / "src" / "main.py").write_text("print('hi')\n")
    return root


@pytest.fixture
def scripts(tmp_path: Path) -> list[Path]:
    """Script files of three stalling agents a, b and c (outside the workspace)."""
    directory = tmp_path / "agents"
    directory.mkdir()
    paths = [directory / f"{name}.json" for name in NAMES]
    for name, path in zip(NAMES, paths, strict=True):
        write_script(path, stalling_turn(name))
    return paths


def answer_now(scripts: list[Path]) -> None:
    """Rewrite every agent's script: the next prompt is answered."""
    for name, path in zip(NAMES, scripts, strict=True):
        write_script(path, answering_turn(name))


# --------------------------------------------------------------------------- run PIPELINE


def fan_out(path: Path, commands: Mapping[str, Sequence[str]], options: str = "") -> Path:
    """Write a pipeline fanning out over the agents (NAME=COMMAND), then a Python step.

    ``options`` are more arguments of the agent step's ``@step`` (``", budget=1000"``).
    """
    agents = [f"{name}={shlex.join(command)}" for name, command in commands.items()]
    path.write_text(
        "from orchestrator import step\n\n"
        f"AGENTS = {agents!r}\n\n\n"
        f"@step(agent=AGENTS{options})\n"
        "def work(task: str) -> str:\n"
        "    return f'work on {task}'\n\n\n"
        "@step()\n"
        "def after(work: object) -> str:\n"
        "    return 'after'\n"
    )
    return path


@pytest.fixture
def pipeline(tmp_path: Path, scripts: list[Path]) -> Path:
    """A pipeline fanning out over the three agents, then a Python step."""
    commands = {n: agent_command(s) for n, s in zip(NAMES, scripts, strict=True)}
    return fan_out(tmp_path / "fan_out.py", commands)


async def test_sigint_interrupts_a_pipeline_then_resume_completes_it(
    tmp_path: Path, project: Path, scripts: list[Path], pipeline: Path, state_dir: Path
) -> None:
    """SIGINT: 130, no agent left, run/steps interrupted, workspace untouched; resume ends it."""
    before = snapshot(project)
    argv = [
        "run", str(pipeline), "--cwd", str(project), "--set", "task=x",
        "--policy", "trusted", "--json",
    ]  # fmt: skip
    code, pids, stdout, stderr = await interrupt(
        argv, cwd=tmp_path, state=state_dir, scripts=scripts, out=tmp_path
    )
    assert code == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert json.loads(stdout)["error"]["type"] == "Interrupted"
    assert len(pids) >= len(NAMES)  # one process per agent at least
    assert all(pid_gone(pid) for pid in pids), [p for p in pids if not pid_gone(p)]
    assert snapshot(project) == before

    [run_id] = await run_ids(state_dir)
    listed = as_json(await run_cli("runs", "--json", cwd=tmp_path, state=state_dir))
    assert [(r["runId"], r["status"]) for r in listed["runs"]] == [(run_id, "interrupted")]
    shown = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir))
    assert shown["status"] == "interrupted"
    work = shown["steps"]["work"]
    assert work["status"] == "interrupted"
    assert {k: i["status"] for k, i in work["instances"].items()} == dict.fromkeys(
        NAMES, "interrupted"
    )
    # never started: the run was interrupted before it got there
    assert (shown["steps"]["after"]["status"], shown["steps"]["after"]["instances"]) == (
        "interrupted",
        {},
    )

    answer_now(scripts)
    resumed = await run_cli(
        "resume", run_id, "--policy", "trusted", "--json", cwd=tmp_path, state=state_dir
    )
    assert resumed.returncode == EXIT_OK, resumed.stderr.decode()
    result = as_json(resumed)
    assert result["runId"] == run_id
    assert result["status"] == "succeeded"
    assert {name: s["status"] for name, s in result["steps"].items()} == {
        "work": "succeeded",
        "after": "succeeded",
    }
    # the interrupted attempts' half-done edits are not part of the resumed run
    assert sorted(c["path"] for c in result["changes"]) == ["a.txt", "b.txt", "c.txt"]
    assert [prompts(s) for s in scripts] == [2, 2, 2]
    assert snapshot(project) == before  # resume without --apply writes nothing
    [listed_run] = as_json(await run_cli("runs", "--json", cwd=tmp_path, state=state_dir))["runs"]
    assert listed_run["status"] == "succeeded"


async def test_an_interrupted_run_and_resume_end_with_how_to_go_on(
    tmp_path: Path, project: Path, scripts: list[Path], pipeline: Path, state_dir: Path
) -> None:
    """SIGINT without --json: the last line on stderr names the run and its resume command."""
    argv = ["run", str(pipeline), "--cwd", str(project), "--set", "task=x"]
    argv += ["--policy", "trusted", "--no-progress"]
    code, _, _, stderr = await interrupt(
        argv, cwd=tmp_path, state=state_dir, scripts=scripts, out=tmp_path
    )
    assert code == EXIT_INTERRUPTED, stderr
    [run_id] = await run_ids(state_dir)
    hint = f"run {run_id} interrupted; orchestrator resume {run_id} goes on"
    assert last_line(stderr) == hint
    # a resume interrupted in its turn: the same run, the same way on
    code, _, _, stderr = await interrupt(
        ["resume", run_id, "--no-progress"],
        cwd=tmp_path,
        state=state_dir,
        scripts=scripts,
        out=tmp_path,
        ready=lambda script: prompts(script) == 2,
    )
    assert code == EXIT_INTERRUPTED, stderr
    assert last_line(stderr) == hint


async def test_an_interrupted_prompt_ends_with_how_to_run_it_again(
    tmp_path: Path, project: Path, scripts: list[Path], state_dir: Path
) -> None:
    """SIGINT of a prompt without --json: the last line says its resume runs the prompt again."""
    argv = ["prompt", "--cwd", str(project)]
    argv += ["--agent", f"a={shlex.join(agent_command(scripts[0]))}", "go"]
    code, _, _, stderr = await interrupt(
        argv, cwd=tmp_path, state=state_dir, scripts=scripts[:1], out=tmp_path
    )
    assert code == EXIT_INTERRUPTED, stderr
    [run_id] = await run_ids(state_dir)
    expected = f"run {run_id} interrupted; orchestrator resume {run_id} runs the prompt again"
    assert last_line(stderr) == expected
    # show says the same way on, not the command just run
    shown = await run_cli("show", run_id, cwd=tmp_path, state=state_dir)
    assert shown.returncode == EXIT_OK, shown.stderr.decode()
    assert shown.stdout.decode().endswith(
        f"\nrun {run_id}: interrupted\nnothing was written to the workspace; "
        f"orchestrator resume {run_id} runs the prompt again\n"
    )


# ------------------------------------------------------------------------ ending turns the ACP way


def cancellable_turn(name: str) -> Turn:
    """A turn that says something, edits its branch directory, then stalls until cancelled."""
    return Turn(
        steps=(
            Say(text=f"partial from {name}"),
            WriteDisk(path=f"partial-{name}.txt", content="half done\n"),
            Stall(),
        )
    )


def stubborn(script: Path) -> list[str]:
    """The agent of ``script`` in a shell that ignores SIGTERM and outlives the agent's stdin."""
    return ["/bin/sh", "-c", 'trap "" TERM; "$@"; sleep 60', "sh", *agent_command(script)]


def run_argv(pipeline: Path, project: Path) -> list[str]:
    """``orchestrator run`` of ``pipeline`` on ``project``, printing JSON."""
    return [
        "run", str(pipeline), "--cwd", str(project), "--set", "task=x",
        "--policy", "trusted", "--json",
    ]  # fmt: skip


async def test_sigint_ends_each_turn_with_session_cancel_before_stopping_its_agent(
    tmp_path: Path, project: Path, scripts: list[Path], pipeline: Path, state_dir: Path
) -> None:
    """SIGINT: session/cancel (no $/cancel_request), the turn ends cancelled, then stdin closes."""
    for name, script in zip(NAMES, scripts, strict=True):
        write_script(script, cancellable_turn(name))
    code, pids, _, stderr = await interrupt(
        run_argv(pipeline, project),
        cwd=tmp_path,
        state=state_dir,
        scripts=scripts,
        out=tmp_path,
        ready=recorded("disk_write"),
    )
    assert code == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert all(pid_gone(pid) for pid in pids), [p for p in pids if not pid_gone(p)]
    for script in scripts:
        seen = timeline(script.with_suffix(".jsonl"))
        assert "recv $/cancel_request" not in seen, seen
        # the turn ended by the agent's answer, and only then was its stdin closed: it exited
        # by itself at the first rung of the ladder, never signalled
        assert seen.index("recv session/cancel") < seen.index("turn_end") < seen.index("eof")
        ends = [e["stopReason"] for e in events(script) if e["event"] == "turn_end"]
        assert ends == ["cancelled"]
    assert "SIGTERM" not in stderr
    assert "SIGKILL" not in stderr


async def test_sigint_records_what_each_interrupted_turn_did(
    tmp_path: Path, project: Path, scripts: list[Path], pipeline: Path, state_dir: Path
) -> None:
    """The run store keeps each interrupted instance with its partial text and its changes."""
    before = snapshot(project)
    for name, script in zip(NAMES, scripts, strict=True):
        write_script(script, cancellable_turn(name))
    code, _, _, stderr = await interrupt(
        run_argv(pipeline, project),
        cwd=tmp_path,
        state=state_dir,
        scripts=scripts,
        out=tmp_path,
        ready=recorded("disk_write"),
    )
    assert code == EXIT_INTERRUPTED, stderr
    [run_id] = await run_ids(state_dir)
    shown = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir))
    assert shown["status"] == "interrupted"
    instances = shown["steps"]["work"]["instances"]
    assert sorted(instances) == sorted(NAMES)
    for name in NAMES:
        instance = instances[name]
        assert instance["status"] == "interrupted"
        assert (instance["text"], instance["stopReason"]) == (f"partial from {name}", "cancelled")
        assert instance["changes"] == [{"path": f"partial-{name}.txt", "change": "added"}]
        assert instance["sessionId"] == "sess-1"
    assert snapshot(project) == before
    # before any final changes, the run's diff is what its instances did so far
    diff = (await run_cli("diff", run_id, cwd=tmp_path, state=state_dir)).stdout.decode()
    assert [f"+++ b/partial-{name}.txt" in diff for name in NAMES] == [True] * len(NAMES)
    # the whole run is refused, naming the instances to apply instead; one of them applies
    whole = await run_cli("apply", run_id, cwd=tmp_path, state=state_dir)
    assert whole.returncode == 2
    assert "work[a] interrupted" in whole.stderr.decode()
    one = await run_cli("apply", run_id, "--step", "work[a]", cwd=tmp_path, state=state_dir)
    assert one.returncode == EXIT_OK, one.stderr.decode()
    assert snapshot(project) == {**before, "partial-a.txt": b"half done\n"}


def round_turn(name: str, n: int) -> Turn:
    """Round ``n`` of agent ``name``: says so, writes ``round-N.txt`` under a tool call and
    asks to run a command (allowed by the ``trusted`` policy)."""
    return Turn(
        steps=(
            Say(text=f"{name} round {n}"),
            ToolCall(id=f"edit-{n}", title=f"Edit round-{n}.txt", kind="edit", status="pending"),
            WriteFile(path=f"round-{n}.txt", content=f"{name} {n}\n"),
            ToolUpdate(id=f"edit-{n}", status="completed"),
            AskPermission(
                tool_call=PermissionToolCall(
                    id=f"run-{n}", title=f"run {n}", kind="execute", raw_input={"command": "ls"}
                )
            ),
        )
    )


async def test_sigint_during_a_pipelines_check_keeps_every_round_so_far(
    tmp_path: Path, project: Path, scripts: list[Path], state_dir: Path
) -> None:
    """Ctrl-C while a fan-out's checks run in round 2: each instance is recorded interrupted
    with both turns' text, tool calls, permission audit and changes, and round 1's check."""
    hung = tmp_path / "hung"
    hung.mkdir()
    for name, script in zip(NAMES[:2], scripts[:2], strict=True):
        body = AgentScript(
            name=name,
            turns=(round_turn(name, 1), round_turn(name, 2)),
            record_path=str(script.with_suffix(".jsonl")),
        )
        script.write_bytes(orjson.dumps(body.to_json()))
    # round 1's check fails; round 2's says so outside the branch directory and hangs
    check = f"if [ -e round-2.txt ]; then mktemp -p {hung}; sleep 60; fi; exit 1"
    pipeline = fan_out(
        tmp_path / "rounds.py",
        {n: agent_command(s) for n, s in zip(NAMES[:2], scripts[:2], strict=True)},
        f", check={check!r}, rounds=3",
    )
    code, _, _, stderr = await interrupt(
        run_argv(pipeline, project),
        cwd=tmp_path,
        state=state_dir,
        scripts=[hung],
        out=tmp_path,
        ready=lambda directory: len(list(directory.iterdir())) == 2,
    )
    assert code == EXIT_INTERRUPTED, stderr
    [run_id] = await run_ids(state_dir)
    shown = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir))
    instances = shown["steps"]["work"]["instances"]
    assert sorted(instances) == ["a", "b"]
    for name, one in instances.items():
        assert one["status"] == "interrupted"
        assert one["text"] == f"{name} round 2"
        assert [c["toolCallId"] for c in one["toolCalls"]] == ["edit-1", "edit-2"]
        assert [(p["title"], p["verdict"]) for p in one["permissions"]] == [
            ("run 1", "allow"),
            ("run 2", "allow"),
        ]
        assert [(r["turn"], r["check"] and r["check"]["exitCode"]) for r in one["rounds"]] == [
            (1, 1),
            (2, None),
        ]
        assert one["changes"] == [
            {"path": "round-1.txt", "change": "added"},
            {"path": "round-2.txt", "change": "added"},
        ]
    # an interrupted instance's work is in the run's diff (it has no final changes)
    diff = (await run_cli("diff", run_id, cwd=tmp_path, state=state_dir)).stdout.decode()
    assert [diff.count(f"+{name} {n}\n") for name in ("a", "b") for n in (1, 2)] == [1] * 4


async def test_sigint_stops_an_agent_ignoring_session_cancel_after_the_grace(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """An agent that ignores session/cancel (and SIGTERM) is killed once the grace is over."""
    script = write_script(tmp_path / "a.json", stalling_turn("a"))
    pipeline = fan_out(tmp_path / "one.py", {"a": stubborn(script)})
    code, pids, _, stderr = await interrupt(
        run_argv(pipeline, project),
        cwd=tmp_path,
        state=state_dir,
        scripts=[script],
        out=tmp_path,
        ready=recorded("disk_write"),
    )
    assert code == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert all(pid_gone(pid) for pid in pids), [p for p in pids if not pid_gone(p)]
    seen = timeline(script.with_suffix(".jsonl"))
    assert "recv $/cancel_request" not in seen, seen
    assert "turn_end" not in seen  # it never ended the turn
    assert seen.index("recv session/cancel") < seen.index("eof")
    assert "the agent did not end it after session/cancel" in stderr
    assert "sending SIGKILL" in stderr  # the shell ignored stdin's end and SIGTERM
    [run_id] = await run_ids(state_dir)
    shown = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir))
    [instance] = shown["steps"]["work"]["instances"].values()
    assert (instance["status"], instance["stopReason"]) == ("interrupted", None)
    assert instance["changes"] == [{"path": "partial-a.txt", "change": "added"}]


async def test_sigint_keeps_the_turn_of_a_step_with_a_token_budget(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A step with a token budget: its interrupted turn is kept as any other step's."""
    script = write_script(tmp_path / "a.json", cancellable_turn("a"))
    pipeline = fan_out(tmp_path / "budget.py", {"a": agent_command(script)}, ", budget=1000")
    code, _, _, stderr = await interrupt(
        run_argv(pipeline, project),
        cwd=tmp_path,
        state=state_dir,
        scripts=[script],
        out=tmp_path,
        ready=recorded("disk_write"),
    )
    assert code == EXIT_INTERRUPTED, stderr
    [run_id] = await run_ids(state_dir)
    shown = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir))
    [instance] = shown["steps"]["work"]["instances"].values()
    assert (instance["status"], instance["stopReason"]) == ("interrupted", "cancelled")
    assert instance["text"] == "partial from a"
    assert instance["changes"] == [{"path": "partial-a.txt", "change": "added"}]


async def test_second_sigint_goes_straight_to_the_shutdown_ladder(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A second SIGINT while a turn has its grace ends the grace: the agent is stopped."""
    script = write_script(tmp_path / "a.json", stalling_turn("a"))
    pipeline = fan_out(tmp_path / "one.py", {"a": stubborn(script)})
    code, pids, _, stderr = await interrupt(
        run_argv(pipeline, project),
        cwd=tmp_path,
        state=state_dir,
        scripts=[script],
        out=tmp_path,
        ready=recorded("disk_write"),
        again=recorded("recv session/cancel"),
    )
    assert code == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert "interrupted again: stopping the agents now" in stderr
    assert all(pid_gone(pid) for pid in pids), [p for p in pids if not pid_gone(p)]
    [run_id] = await run_ids(state_dir)
    listed = as_json(await run_cli("runs", "--json", cwd=tmp_path, state=state_dir))
    assert [(r["runId"], r["status"]) for r in listed["runs"]] == [(run_id, "interrupted")]


# --------------------------------------------------------------------------- compare


@pytest.fixture
def configured(project: Path, scripts: list[Path]) -> Path:
    """The workspace with a ``.orchestrator.toml`` naming the three agents."""
    lines = []
    for name, script in zip(NAMES, scripts, strict=True):
        lines += [f"[agents.{name}]", f"command = {json.dumps(agent_command(script))}", ""]
    project_config(project, "\n".join(lines))
    return project


async def interrupt_compare(
    tmp_path: Path,
    project: Path,
    scripts: list[Path],
    state: Path,
    *,
    ready: Callable[[Path], bool] = prompted,
) -> tuple[str, dict[str, bytes]]:
    """Interrupt a comparison of the configured agents a, b, c; check it; its id and workspace."""
    before = snapshot(project)
    argv = ["compare", "--cwd", str(project), "--no-progress", "--policy", "trusted"]
    for name in NAMES:
        argv += ["--agent", name]
    code, pids, _, stderr = await interrupt(
        [*argv, "write your name"],
        cwd=tmp_path,
        state=state,
        scripts=scripts,
        out=tmp_path,
        ready=ready,
    )
    assert code == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert len(pids) >= len(NAMES)
    assert all(pid_gone(pid) for pid in pids), [p for p in pids if not pid_gone(p)]
    assert snapshot(project) == before
    [run_id] = await run_ids(state)
    assert last_line(stderr) == f"run {run_id} interrupted; orchestrator resume {run_id} goes on"
    shown = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state))
    assert shown["kind"] == "compare"
    assert shown["status"] == "interrupted"
    assert shown["task"] == "write your name"
    assert [(a["name"], a["status"]) for a in shown["agents"]] == [
        (name, "interrupted") for name in NAMES
    ]
    return run_id, before


async def test_sigint_interrupts_a_compare(
    tmp_path: Path, configured: Path, scripts: list[Path], state_dir: Path
) -> None:
    """SIGINT during compare: 130, no agent left, all agents interrupted, workspace untouched."""
    await interrupt_compare(tmp_path, configured, scripts, state_dir)


async def test_sigint_keeps_each_compared_agents_turn_to_apply_one(
    tmp_path: Path, configured: Path, scripts: list[Path], state_dir: Path
) -> None:
    """Agents ignoring session/cancel in terminal commands: each keeps its turn; one applies."""
    for name, script in zip(NAMES, scripts, strict=True):
        write_script(script, blocked_turn(name))
    run_id, before = await interrupt_compare(
        tmp_path, configured, scripts, state_dir, ready=in_terminal
    )
    shown = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir))
    for name, agent in zip(NAMES, shown["agents"], strict=True):
        assert (agent["stopReason"], agent["text"]) == (None, f"partial from {name}")
        assert [c["toolCallId"] for c in agent["toolCalls"]] == ["edit-1", "run-1"]
        # the permission the agent asked for, then the terminal command the policy allowed
        assert [(p["toolCallId"], p["verdict"]) for p in agent["permissions"]] == [
            ("run-1", "allow"),
            ("terminal/create", "allow"),
        ]
        assert agent["changes"] == [{"path": "README.md", "change": "modified"}]
    diff = await run_cli("diff", run_id, cwd=tmp_path, state=state_dir)
    assert [f"+# edited by {n}" in diff.stdout.decode() for n in NAMES] == [True] * len(NAMES)
    applied = await run_cli(
        "apply", run_id, "--step", "compare[b]", "--json", cwd=tmp_path, state=state_dir
    )
    assert applied.returncode == EXIT_OK, applied.stderr.decode()
    assert snapshot(configured) == {**before, "README.md": b"# edited by b\n"}


async def test_resume_completes_an_interrupted_compare(
    tmp_path: Path, configured: Path, scripts: list[Path], state_dir: Path
) -> None:
    """resume of an interrupted compare runs the agents again and succeeds."""
    run_id, before = await interrupt_compare(tmp_path, configured, scripts, state_dir)
    answer_now(scripts)
    resumed = await run_cli("resume", run_id, "--json", cwd=tmp_path, state=state_dir)
    assert resumed.returncode == EXIT_OK, resumed.stderr.decode()
    result = as_json(resumed)
    assert result["status"] == "succeeded"
    assert [(a["name"], a["status"]) for a in result["agents"]] == [
        (name, "succeeded") for name in NAMES
    ]
    assert snapshot(configured) == before


# --------------------------------------------------------------------------- prompt


async def test_sigint_interrupts_a_prompt_and_it_is_recorded(
    tmp_path: Path, project: Path, scripts: list[Path], state_dir: Path
) -> None:
    """SIGINT during prompt --json: 130, the error names the run, the store lists it interrupted."""
    before = snapshot(project)
    argv = ["prompt", "--json", "--cwd", str(project)]
    argv += ["--agent", f"a={shlex.join(agent_command(scripts[0]))}", "go"]
    code, pids, out, err = await interrupt(
        argv, cwd=tmp_path, state=state_dir, scripts=scripts[:1], out=tmp_path
    )
    assert code == EXIT_INTERRUPTED, err
    assert pids, "the agent was running when the signal came"
    assert all(pid_gone(p) for p in pids)
    error = json.loads(out)
    [run_id] = await run_ids(state_dir)
    assert error["runId"] == run_id
    assert "orchestrator resume" not in err  # with --json, the error object names the run
    assert error["error"]["type"] == "Interrupted"
    shown = await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir)
    assert as_json(shown)["kind"] == "prompt"
    assert as_json(shown)["status"] == "interrupted"
    # nothing of the branch is left behind, and the workspace was never written
    assert not list((state_dir / "runs" / run_id).glob("branches/*"))
    assert snapshot(project) == before
    # the interrupted prompt resumes like any run
    answer_now(scripts)
    resumed = await run_cli("resume", run_id, "--json", cwd=tmp_path, state=state_dir)
    assert resumed.returncode == EXIT_OK, resumed.stderr.decode()
    assert as_json(resumed)["status"] == "succeeded"
    # a resumed prompt reads like a prompt
    assert (as_json(resumed)["kind"], as_json(resumed)["stopReason"]) == ("prompt", "end_turn")
    assert as_json(resumed)["text"] == "done"


async def test_a_run_whose_process_was_killed_resumes(
    tmp_path: Path, project: Path, scripts: list[Path], state_dir: Path
) -> None:
    """SIGKILL of the command mid-turn: the run stays "running"; resume ends it all the same."""
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state_dir)}
    argv = [str(CLI), "prompt", "--json", "--cwd", str(project)]
    argv += ["--agent", f"a={shlex.join(agent_command(scripts[0]))}", "go"]
    with trio.fail_after(CLI_LIMIT):
        cli = await trio.lowlevel.open_process(argv, cwd=tmp_path, env=env)
        try:
            while not prompts(scripts[0]):
                assert cli.poll() is None
                await trio.sleep(0.05)
            pids = descendants(cli.pid)
            cli.kill()
            await cli.wait()
        finally:
            # the killed command's watchdog ends them; this keeps a failure from leaving them
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    [run_id] = await run_ids(state_dir)
    shown = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir))
    # recorded running, but its process is gone: it reads interrupted
    assert (shown["status"], shown["statusReason"]) == ("interrupted", "its process is gone")
    assert shown["steps"]["prompt"]["status"] == "interrupted"
    # its branch directory is still there: the resume must not trip over it
    assert list((state_dir / "runs" / run_id).glob("branches/*"))
    answer_now(scripts)
    resumed = await run_cli("resume", run_id, "--json", cwd=tmp_path, state=state_dir)
    assert resumed.returncode == EXIT_OK, resumed.stderr.decode()
    assert "process is gone" in resumed.stderr.decode()
    assert as_json(resumed)["status"] == "succeeded"


async def test_sigint_keeps_a_prompt_turn_the_agent_never_ended(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """An agent ignoring session/cancel in a terminal command: its turn is kept, to apply."""
    before = snapshot(project)
    script = write_script(tmp_path / "a.json", blocked_turn("a"))
    argv = ["prompt", "--json", "--policy", "trusted", "--cwd", str(project)]
    argv += ["--agent", f"a={shlex.join(agent_command(script))}", "go"]
    code, _, out, err = await interrupt(
        argv, cwd=tmp_path, state=state_dir, scripts=[script], out=tmp_path, ready=in_terminal
    )
    assert code == EXIT_INTERRUPTED, err
    assert "Traceback" not in err
    assert "turn_end" not in timeline(script.with_suffix(".jsonl"))  # it never ended the turn
    run_id = json.loads(out)["runId"]
    shown = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir))
    assert (shown["status"], shown["steps"]["prompt"]["status"]) == ("interrupted", "interrupted")
    instance = shown["steps"]["prompt"]["instances"]["prompt"]
    assert (instance["status"], instance["stopReason"]) == ("interrupted", None)
    assert instance["text"] == "partial from a"
    assert [c["toolCallId"] for c in instance["toolCalls"]] == ["edit-1", "run-1"]
    assert [(p["toolCallId"], p["verdict"]) for p in instance["permissions"]] == [
        ("run-1", "allow"),
        ("terminal/create", "allow"),
    ]
    assert instance["changes"] == [{"path": "README.md", "change": "modified"}]
    assert "+# edited by a" in instance["diff"]
    # the run never had final changes: its diff is the interrupted instance's
    for diff_argv in (["diff", run_id], ["diff", run_id, "--step", "prompt"]):
        shown_diff = await run_cli(*diff_argv, cwd=tmp_path, state=state_dir)
        assert shown_diff.returncode == EXIT_OK, shown_diff.stderr.decode()
        assert shown_diff.stdout.decode() == instance["diff"]
    assert snapshot(project) == before
    # the whole run is refused (it never had final changes); its one step, asked by name, is
    # applied as far as it got
    whole = await run_cli("apply", run_id, cwd=tmp_path, state=state_dir)
    assert whole.returncode == 2
    assert "prompt interrupted" in whole.stderr.decode()
    assert snapshot(project) == before
    applied = await run_cli(
        "apply", run_id, "--step", "prompt", "--json", cwd=tmp_path, state=state_dir
    )
    assert applied.returncode == EXIT_OK, applied.stderr.decode()
    assert as_json(applied)["written"] == ["README.md"]
    assert snapshot(project) == {**before, "README.md": b"# edited by a\n"}


async def kill_mid_turn(argv: list[str], *, cwd: Path, state: Path, scripts: list[Path]) -> None:
    """Start the CLI, wait until every agent got its prompt, then SIGKILL the CLI (not its
    agents: its watchdog ends them)."""
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state)}
    with trio.fail_after(CLI_LIMIT):
        cli = await trio.lowlevel.open_process([str(CLI), *argv], cwd=cwd, env=env)
        pids: set[int] = set()
        try:
            while not all(prompted(s) for s in scripts):
                assert cli.poll() is None
                await trio.sleep(0.05)
            pids = descendants(cli.pid)
            cli.kill()
            await cli.wait()
        finally:
            if cli.returncode is None:
                cli.kill()
            for pid in pids:  # a failure must not leave them
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


async def test_a_killed_compare_reads_interrupted_and_resumes(
    tmp_path: Path, configured: Path, scripts: list[Path], state_dir: Path
) -> None:
    """SIGKILL of compare: runs and show say interrupted (its process is gone); resume ends it."""
    argv = ["compare", "--cwd", str(configured), "--no-progress", "--policy", "trusted"]
    for name in NAMES:
        argv += ["--agent", name]
    await kill_mid_turn([*argv, "write your name"], cwd=tmp_path, state=state_dir, scripts=scripts)
    [run_id] = await run_ids(state_dir)
    async with open_run_store(state_dir) as store:  # the record itself still says running
        assert (await store.get_run(run_id)).status == "running"

    listed = as_json(await run_cli("runs", "--json", cwd=tmp_path, state=state_dir))
    assert [(r["runId"], r["status"], r["statusReason"]) for r in listed["runs"]] == [
        (run_id, "interrupted", "its process is gone")
    ]
    text = (await run_cli("runs", cwd=tmp_path, state=state_dir)).stdout.decode()
    assert "interrupted (its process is gone)" in text
    shown = as_json(await run_cli("show", run_id, "--json", cwd=tmp_path, state=state_dir))
    assert (shown["status"], shown["statusReason"]) == ("interrupted", "its process is gone")
    assert [(a["name"], a["status"]) for a in shown["agents"]] == [
        (name, "interrupted") for name in NAMES
    ]
    assert shown["winner"] is None
    done = await run_cli("show", run_id, cwd=tmp_path, state=state_dir)
    out = done.stdout.decode() + done.stderr.decode()
    assert f"run {run_id} (compare) in {configured}\n" in out
    assert f"\nrun {run_id}: interrupted (its process is gone)\n" in out
    assert "no agent succeeded)" not in out  # it never finished: nobody failed to win
    assert "winner: none (interrupted before any agent succeeded)" in out
    # how to go on with it, not the command just run
    assert out.endswith(
        f"\nrun {run_id}: interrupted (its process is gone)\n"
        f"nothing was written to the workspace; orchestrator resume {run_id} goes on\n"
    )

    answer_now(scripts)
    resumed = await run_cli("resume", run_id, "--json", cwd=tmp_path, state=state_dir)
    assert resumed.returncode == EXIT_OK, resumed.stderr.decode()
    assert as_json(resumed)["status"] == "succeeded"
    assert as_json(resumed)["statusReason"] is None


async def test_an_interrupted_pipeline_shows_how_to_go_on_and_diffs_each_step_labelled(
    tmp_path: Path, configured: Path, scripts: list[Path], state_dir: Path
) -> None:
    """SIGINT of a pipeline whose second step builds on the first: show ends with how to go
    on (resume); diff RUN prints each step's diff under a `# STEP: STATUS, ...` line (the
    second holds the first's change again), and a step's alone applies cleanly."""
    write_script(scripts[0], answering_turn("a"))
    write_script(scripts[1], stalling_turn("b"))
    pipeline = tmp_path / "chain.py"
    pipeline.write_text(
        "from orchestrator import step\n\n\n"
        '@step(agent="a")\n'
        "def first(task: str) -> str:\n"
        "    return task\n\n\n"
        '@step(agent="b")\n'
        "def second(first: object) -> str:\n"
        "    return 'go on'\n"
    )
    argv = ["run", str(pipeline), "--cwd", str(configured), "--no-progress"]
    argv += ["--policy", "trusted", "--set", "task=go"]
    code, _, _, stderr = await interrupt(
        argv,
        cwd=tmp_path,
        state=state_dir,
        scripts=[scripts[1]],
        out=tmp_path,
        ready=recorded("disk_write"),
    )
    assert code == EXIT_INTERRUPTED, stderr
    [run_id] = await run_ids(state_dir)
    shown = await run_cli("show", run_id, cwd=tmp_path, state=state_dir)
    assert shown.returncode == EXIT_OK, shown.stderr.decode()
    assert shown.stdout.decode().endswith(
        f"\nrun {run_id}: interrupted\n"
        f"nothing was written to the workspace; orchestrator resume {run_id} goes on\n"
    )
    done = await run_cli("diff", run_id, cwd=tmp_path, state=state_dir)
    assert done.returncode == EXIT_OK, done.stderr.decode()
    text = done.stdout.decode()
    first = "# first: succeeded, 1 file changed, +1 -0\n"
    second = "# second: interrupted, 2 files changed, +2 -0\n"
    assert text.startswith(first + "--- /dev/null\n+++ b/a.txt\n")
    assert "\n" + second in text
    # the second step's branch holds the first's change too: each diff is one to apply alone
    assert "+from a\n" in text.split(second)[1] and "+half done\n" in text.split(second)[1]
    # one step's diff, as --step prints it, applies by itself
    alone = await run_cli("diff", run_id, "--step", "second", cwd=tmp_path, state=state_dir)
    check = await trio.run_process(
        ["git", "apply", "--check", "-"],
        cwd=configured,
        stdin=alone.stdout,
        capture_stderr=True,
        check=False,
    )
    assert check.returncode == 0, check.stderr.decode()


# --------------------------------------------------------------------------- other moments


async def test_sigint_while_the_agents_start(
    tmp_path: Path, project: Path, scripts: list[Path], pipeline: Path, state_dir: Path
) -> None:
    """SIGINT while every agent of the fan-out holds its answer to initialize: exit 130, no
    process left, the run recorded interrupted."""
    for name, script in zip(NAMES, scripts, strict=True):
        record = script.with_suffix(".jsonl")
        slow = AgentScript(
            name=name, initialize_delay=600, turns=(stalling_turn(name),), record_path=str(record)
        )
        script.write_bytes(orjson.dumps(slow.to_json()))
    code, pids, _, stderr = await interrupt(
        run_argv(pipeline, project),
        cwd=tmp_path,
        state=state_dir,
        scripts=scripts,
        out=tmp_path,
        ready=recorded("recv initialize"),
    )
    assert code == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert all(pid_gone(pid) for pid in pids), [p for p in pids if not pid_gone(p)]
    assert all(prompts(s) == 0 for s in scripts)
    [run_id] = await run_ids(state_dir)
    listed = as_json(await run_cli("runs", "--json", cwd=tmp_path, state=state_dir))
    assert [(r["runId"], r["status"]) for r in listed["runs"]] == [(run_id, "interrupted")]


async def test_sigint_while_instances_wait_for_a_session_slot(
    tmp_path: Path, project: Path, scripts: list[Path], pipeline: Path, state_dir: Path
) -> None:
    """SIGINT mid-turn of the one instance ``--max-sessions 1`` lets run, the others queued,
    every agent deaf to session/cancel: exit 130, no process left, the run interrupted."""
    code, pids, _, stderr = await interrupt(
        [*run_argv(pipeline, project), "--max-sessions", "1"],
        cwd=tmp_path,
        state=state_dir,
        scripts=scripts[:1],
        out=tmp_path,
        ready=lambda _: any(recorded("disk_write")(s) for s in scripts),
    )
    assert code == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert all(pid_gone(pid) for pid in pids), [p for p in pids if not pid_gone(p)]
    assert sorted(prompts(s) for s in scripts) == [0, 0, 1]  # two were queued on the limit
    [run_id] = await run_ids(state_dir)
    listed = as_json(await run_cli("runs", "--json", cwd=tmp_path, state=state_dir))
    assert [(r["runId"], r["status"]) for r in listed["runs"]] == [(run_id, "interrupted")]
