"""No descendant outlives its owner: processes that leave their process group, real processes.

Each escape is a double fork and ``setsid``: a subshell starts ``setsid sleep`` in the
background, writes its pid to a file and exits, so the sleeper is orphaned in a session of its
own, out of reach of any signal to the process group that started it.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
from conftest import pid_gone
from run_helpers import CLI, CLI_LIMIT, agent_command, as_json, run_cli, write_script

import orchestrator.agent.process as process_module
from orchestrator.agent.process import open_agent_process
from orchestrator.agent.services import SessionContext
from orchestrator.agent.terminals import open_terminal_service
from orchestrator.pipeline._calls import run_verify
from orchestrator.protocol import types as t
from orchestrator.testing import Say, Stall, Terminal, Turn

PY = sys.executable
#: generous: a poll that ends early when the condition holds, never a fixed wait
DEADLINE = 20.0


def escape(pidfile: Path) -> str:
    """A shell line that leaves an orphaned ``sleep`` in a session of its own, its pid in a file."""
    # The sleeper writes its own pid (setsid(1) forks once more when it leads its group); the
    # line ends once it did, so the pid is known before anything can kill the sleeper.
    sleeper = f"{write_pid(pidfile)}; exec sleep 300"
    launch = f"(setsid sh -c {shlex.quote(sleeper)} </dev/null >/dev/null 2>&1 &)"
    return f"{launch}; until [ -e {shlex.quote(str(pidfile))} ]; do sleep 0.01; done"


def write_pid(pidfile: Path, pid: str = "$$") -> str:
    """A shell line writing a pid (the shell's own by default) to ``pidfile``, in one step."""
    target = shlex.quote(str(pidfile))
    return f"echo {pid} > {target}.tmp && mv {target}.tmp {target}"


def shell_file(path: Path, line: str) -> str:
    """A command running ``line`` from the file ``path`` of the project (its branch holds a
    copy): a policy vets the command, not the file, so the line may write outside the branch
    directory (the tests' pid files), which an argument of the command could not."""
    path.write_text(line + "\n")
    return f"sh {shlex.quote(path.name)}"


async def until(condition: Callable[[], bool], within: float = DEADLINE) -> None:
    """Poll ``condition`` until it holds; fail after ``within`` seconds."""
    # Polling: nothing signals the death of a process that is not our child, or a file's write.
    with trio.move_on_after(within):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.02)
    assert condition(), f"not within {within} s"


async def pid_in(path: Path) -> int:
    """The pid written to ``path`` (waits for the file)."""
    await until(path.exists)
    return int(path.read_text())


def session_of(pid: int) -> int:
    """The session id of a live process."""
    return os.getsid(pid)


async def assert_gone(*pids: int) -> None:
    """Every pid is dead (or a zombie) within the deadline: SIGKILL lands asynchronously."""
    await until(lambda: all(pid_gone(pid) for pid in pids))


# --------------------------------------------------------------------------- in this process


@pytest.mark.parametrize("pidfd", [True, False])
async def test_an_agent_process_that_escapes_its_group_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, pidfd: bool
) -> None:
    """An agent that double-forks a setsid sleeper: the sleeper dies with the agent (also where
    pidfds are missing and the agent is reaped before its leftovers are killed)."""
    if not pidfd:
        monkeypatch.setattr(process_module, "_pidfd", lambda pid: None, raising=False)
    pidfile = tmp_path / "escaped.pid"
    command = f"{escape(pidfile)}; exec {shlex.quote(PY)} -c 'import sys; sys.stdin.read()'"
    with trio.fail_after(DEADLINE):
        async with open_agent_process(command, name="escaper", stdin_close_grace=5) as agent:
            escaped = await pid_in(pidfile)
            assert not pid_gone(escaped)
            assert session_of(escaped) not in (agent.pid, os.getsid(0))  # out of the group
        assert agent.returncode == 0  # it ended on stdin's close, no signal needed
        await assert_gone(escaped)


async def test_a_descendant_without_the_marker_dies_with_its_session(tmp_path: Path) -> None:
    """A descendant that leaves the group and drops the environment but stays in the session."""
    pidfile = tmp_path / "stripped.pid"
    move = "import os; os.setpgid(0, 0); os.execve('/bin/sleep', ['sleep', '300'], {})"
    line = f"(env -i {shlex.quote(PY)} -c {shlex.quote(move)} & {write_pid(pidfile, '$!')})"
    command = f"{line}; exec {shlex.quote(PY)} -c 'import sys; sys.stdin.read()'"
    with trio.fail_after(DEADLINE):
        async with open_agent_process(command, name="stripper") as agent:
            stripped = await pid_in(pidfile)
            await until(lambda: os.getpgid(stripped) == stripped)  # its own group by now
            assert os.getsid(stripped) == agent.pid
        await assert_gone(stripped)


async def test_a_terminal_escapee_lives_until_release(tmp_path: Path) -> None:
    """A terminal command's escaped sleeper outlives the command, as background children do,
    and dies on terminal/release."""
    root = tmp_path / "project"
    root.mkdir()
    ctx = SessionContext(agent="tester", session_id="s1", cwd=str(root))
    pidfile = tmp_path / "escaped.pid"
    with trio.fail_after(DEADLINE):
        async with open_terminal_service(kill_grace=0.2) as terminals:
            created = await terminals.create(
                t.CreateTerminalRequest(session_id="s1", command=escape(pidfile)), ctx
            )
            ids: dict[str, Any] = {"session_id": "s1", "terminal_id": created.terminal_id}
            exited = await terminals.wait_for_exit(t.WaitForTerminalExitRequest(**ids), ctx)
            assert exited.exit_code == 0
            escaped = await pid_in(pidfile)
            assert not pid_gone(escaped)
            await terminals.release(t.ReleaseTerminalRequest(**ids), ctx)
            await assert_gone(escaped)


async def test_terminal_kill_ends_the_escapees_too(tmp_path: Path) -> None:
    """terminal/kill ends the command's descendants that left its group, not only the group."""
    root = tmp_path / "project"
    root.mkdir()
    ctx = SessionContext(agent="tester", session_id="s1", cwd=str(root))
    pidfile = tmp_path / "escaped.pid"
    with trio.fail_after(DEADLINE):
        async with open_terminal_service(kill_grace=0.2) as terminals:
            line = f"{escape(pidfile)}; exec sleep 300"
            created = await terminals.create(
                t.CreateTerminalRequest(session_id="s1", command=line), ctx
            )
            escaped = await pid_in(pidfile)
            ids: dict[str, Any] = {"session_id": "s1", "terminal_id": created.terminal_id}
            await terminals.kill(t.KillTerminalRequest(**ids), ctx)
            await assert_gone(escaped)


async def test_a_verify_command_escapee_dies_when_it_ends(tmp_path: Path) -> None:
    """A verify command that leaves a setsid sleeper behind: gone when the verify returns."""
    pidfile = tmp_path / "escaped.pid"
    with trio.fail_after(DEADLINE):
        result = await run_verify(f"{escape(pidfile)}; echo checked", tmp_path)
        assert (result.exit_code, result.output) == (0, "checked")
        await assert_gone(int(pidfile.read_text()))


async def test_processes_outside_the_tree_are_spared(tmp_path: Path) -> None:
    """Only the released tree dies: a sleeper in a session of its own started by someone else
    (this test) survives the sweep."""
    pidfile = tmp_path / "escaped.pid"
    outsider = await trio.lowlevel.open_process(["sleep", "300"], start_new_session=True)
    try:
        with trio.fail_after(DEADLINE):
            async with open_agent_process(f"{escape(pidfile)}; exec cat", name="a") as agent:
                escaped = await pid_in(pidfile)
                await agent.stream.send_stream.aclose()
                assert await agent.wait() == 0
            await assert_gone(escaped)
            assert outsider.poll() is None
    finally:
        outsider.kill()
        with trio.CancelScope(shield=True):
            await outsider.wait()


# --------------------------------------------------------------------------- the console script

cli_only = pytest.mark.skipif(not CLI.is_file(), reason=f"console script {CLI} not installed")


@cli_only
@pytest.mark.slow
async def test_after_a_run_no_escaped_terminal_descendant_is_left(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """A scripted agent whose terminal command double-forks a setsid sleeper: gone after the run."""
    pidfile = tmp_path / "escaped.pid"
    command = shell_file(project / "escape.sh", escape(pidfile))
    script = write_script(
        tmp_path / "a.json", Turn(steps=(Terminal(command=command), Say(text="done")))
    )
    done = await run_cli(
        "prompt", "--json", "--policy", "trusted", "--cwd", str(project),
        "--agent", f"a={shlex.join(agent_command(script))}", "go",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    assert as_json(done)["text"] == "done"
    await assert_gone(int(pidfile.read_text()))


@cli_only
@pytest.mark.slow
async def test_after_a_run_no_escaped_agent_descendant_is_left(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """An agent process that double-forks a setsid sleeper itself: gone after the run."""
    pidfile = tmp_path / "escaped.pid"
    script = write_script(tmp_path / "a.json", Turn(steps=(Say(text="done"),)))
    agent = f"{escape(pidfile)}; exec {shlex.join(agent_command(script))}"
    done = await run_cli(
        "prompt", "--json", "--cwd", str(project),
        "--agent", f"a={shlex.join(['sh', '-c', agent])}", "go",
        cwd=tmp_path, state=state_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr.decode()
    await assert_gone(int(pidfile.read_text()))


@cli_only
@pytest.mark.slow
async def test_a_killed_orchestrator_takes_its_processes_along(
    tmp_path: Path, project: Path, state_dir: Path
) -> None:
    """SIGKILL of the console script mid-turn: its agent, the agent's terminal command and a
    descendant that escaped the agent's session all end within a bounded time."""
    files = {name: tmp_path / f"{name}.pid" for name in ("agent", "terminal", "escaped")}
    terminal = shell_file(
        project / "terminal.sh", f"{write_pid(files['terminal'])}; exec sleep 300"
    )
    script = write_script(
        tmp_path / "a.json", Turn(steps=(Terminal(command=terminal), Stall()), ignore_cancel=True)
    )
    start = f"{write_pid(files['agent'])}; {escape(files['escaped'])}"
    agent = f"{start}; exec {shlex.join(agent_command(script))}"
    argv = [str(CLI), "prompt", "--json", "--policy", "trusted", "--cwd", str(project)]
    argv += ["--agent", f"a={shlex.join(['sh', '-c', agent])}", "go"]
    env = {**os.environ, "ORCHESTRATOR_STATE_DIR": str(state_dir)}
    with trio.fail_after(CLI_LIMIT):
        cli = await trio.lowlevel.open_process(
            argv, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        try:
            await until(lambda: all(f.exists() for f in files.values()) or cli.poll() is not None)
            assert cli.poll() is None, "the command ended before its terminal started"
            pids = {name: int(f.read_text()) for name, f in files.items()}
            assert not any(pid_gone(pid) for pid in pids.values())
            cli.send_signal(signal.SIGKILL)
            assert await cli.wait() == -signal.SIGKILL
        finally:
            if cli.returncode is None:
                cli.kill()
                with trio.CancelScope(shield=True):
                    await cli.wait()
        await assert_gone(*pids.values())
