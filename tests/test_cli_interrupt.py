"""Ctrl-C on ``orchestrator run`` and ``compare`` as subprocesses, then ``resume``.

The agents are scripted agents run as subprocesses (``python -m
orchestrator.testing.scripted_agent SCRIPT.json``). Each script file has a fixed path, so a test
swaps an agent's behaviour between the interrupted run and its resume by rewriting that file.
Each agent records every frame it receives (``NAME.jsonl`` beside its script): the order of
``session/cancel`` and the end of its stdin is read from there.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import pid_gone
from run_helpers import (
    CLI,
    CLI_LIMIT,
    agent_command,
    as_json,
    prompts,
    record_events,
    run_cli,
    snapshot,
    timeline,
    write_script,
)

from orchestrator.store import open_run_store
from orchestrator.testing import Say, Stall, Turn, WriteDisk, WriteFile

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


def fan_out(path: Path, commands: Mapping[str, Sequence[str]]) -> Path:
    """Write a pipeline fanning out over the agents (NAME=COMMAND), then a Python step."""
    agents = [f"{name}={shlex.join(command)}" for name, command in commands.items()]
    path.write_text(
        "from orchestrator import step\n\n"
        f"AGENTS = {agents!r}\n\n\n"
        "@step(agent=AGENTS)\n"
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
    assert shown["steps"]["after"]["status"] in ("pending", "interrupted")

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
    (project / ".orchestrator.toml").write_text("\n".join(lines))
    return project


async def interrupt_compare(
    tmp_path: Path, project: Path, scripts: list[Path], state: Path
) -> tuple[str, dict[str, bytes]]:
    """Interrupt a comparison of the configured agents a, b, c; check it; its id and workspace."""
    before = snapshot(project)
    argv = ["compare", "--cwd", str(project), "--no-progress"]
    for name in NAMES:
        argv += ["--agent", name]
    code, pids, _, stderr = await interrupt(
        [*argv, "write your name"], cwd=tmp_path, state=state, scripts=scripts, out=tmp_path
    )
    assert code == EXIT_INTERRUPTED, stderr
    assert "Traceback" not in stderr
    assert len(pids) >= len(NAMES)
    assert all(pid_gone(pid) for pid in pids), [p for p in pids if not pid_gone(p)]
    assert snapshot(project) == before
    [run_id] = await run_ids(state)
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
