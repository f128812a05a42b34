"""Tests for orchestrator.agent.process: real child processes, every wait under trio.fail_after."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from log_capture import capture_logs

from orchestrator.agent.process import (
    AgentProcess,
    _LineSplitter,
    _StderrTail,
    open_agent_process,
)
from orchestrator.errors import AgentExited, AgentStartError

PY = sys.executable
SPAWN_TREE = str(Path(__file__).parent / "helpers" / "spawn_tree.py")
# Small graces keep the ladder fast; every test is also bounded by trio.fail_after.
FAST: dict[str, Any] = {"stdin_close_grace": 0.2, "term_grace": 0.2}

ECHO = (
    "import sys\n"
    "for line in sys.stdin.buffer:\n"
    "    sys.stdout.buffer.write(line)\n"
    "    sys.stdout.buffer.flush()\n"
)
IGNORE_EOF = "import time\nprint('ready', flush=True)\ntime.sleep(60)\n"
IGNORE_TERM = (
    "import signal, time\n"
    "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('ready', flush=True)\n"
    "time.sleep(60)\n"
)


async def read_line(agent: AgentProcess) -> bytes:
    """Read one line from the agent's stdout (b'' at EOF)."""
    buf = bytearray()
    while not buf.endswith(b"\n"):
        chunk = await agent.stream.receive_some(1)
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


async def read_all(agent: AgentProcess) -> bytes:
    """Read the agent's stdout to EOF."""
    buf = bytearray()
    while chunk := await agent.stream.receive_some():
        buf += chunk
    return bytes(buf)


# --------------------------------------------------------------------------- pid checks

# pid 1 here may not reap orphans (it is not always a real init), so killed grandchildren can stay
# zombies for a while: a zombie ('Z') or dead ('X') process counts as gone. The start time guards
# against the pid being reused by an unrelated process.


def _proc_stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # Fields after "(comm)": state is field 3, starttime field 22 of the whole line.
    return text.rsplit(")", 1)[1].split()


def start_time(pid: int) -> str | None:
    """The kernel start time of ``pid`` (None without /proc or if it is gone)."""
    fields = _proc_stat(pid)
    return fields[19] if fields else None


def is_alive(pid: int, started: str | None) -> bool:
    """Whether ``pid`` is still a live (non-zombie) process that started at ``started``."""
    if not Path("/proc/self/stat").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    fields = _proc_stat(pid)
    if fields is None:
        return False
    if started is not None and fields[19] != started:
        return False
    return fields[0] not in ("Z", "X")


async def assert_all_gone(pids: dict[int, str | None], within: float = 3.0) -> None:
    """Every pid is dead or a zombie within ``within`` seconds (SIGKILL lands asynchronously)."""
    # Polling: nothing signals the death of a process that is not our child.
    deadline = trio.current_time() + within
    while trio.current_time() < deadline:
        if not any(is_alive(pid, t) for pid, t in pids.items()):
            break
        await trio.sleep(0.02)
    alive = [pid for pid, t in pids.items() if is_alive(pid, t)]
    assert not alive, f"processes still alive: {alive}"


async def tree_pids(agent: AgentProcess) -> dict[int, str | None]:
    """Read spawn_tree's report; map every pid of the tree to its start time."""
    report = json.loads(await read_line(agent))
    pids = [report["leader"], *report["descendants"]]
    assert len(pids) == 7
    return {pid: start_time(pid) for pid in pids}


# --------------------------------------------------------------------------- sans-I/O helpers


def test_line_splitter_splits_and_keeps_partial_lines() -> None:
    """Lines are split on newlines, CR is stripped, and the unterminated rest comes at flush."""
    splitter = _LineSplitter(100)
    assert splitter.feed(b"one\r\ntw") == [(b"one", 0)]
    assert splitter.feed(b"o\nthree") == [(b"two", 0)]
    assert splitter.flush() == (b"three", 0)
    assert splitter.flush() is None


def test_line_splitter_truncates_overlong_lines() -> None:
    """An overlong line keeps its first `limit` bytes and counts the dropped rest."""
    splitter = _LineSplitter(4)
    assert splitter.feed(b"abcdefgh") == []
    assert splitter.feed(b"ij\nxy\n") == [(b"abcd", 6), (b"xy", 0)]


def test_stderr_tail_keeps_whole_lines_within_budget() -> None:
    """The tail evicts the oldest whole lines and never exceeds its byte budget."""
    tail = _StderrTail(10)
    for line in (b"aaaa", b"bbbb", b"cccc"):
        tail.add(line)
    assert tail.text() == "bbbb\ncccc\n"
    tail.add(b"x" * 50)
    assert tail.text() == "x" * 10
    empty = _StderrTail(0)
    empty.add(b"ignored")
    assert empty.text() == ""


def test_stderr_tail_decodes_with_replacement() -> None:
    """Undecodable bytes in the tail become replacement characters."""
    tail = _StderrTail(100)
    tail.add(b"bad \xff byte")
    assert tail.text() == "bad \ufffd byte\n"


# --------------------------------------------------------------------------- running


async def test_echo_over_the_stream() -> None:
    """Bytes sent on the stream reach the child's stdin and its stdout comes back."""
    with trio.fail_after(10):
        async with open_agent_process([PY, "-c", ECHO], name="echo") as agent:
            assert agent.returncode is None
            assert agent.name == "echo"
            assert agent.argv == (PY, "-c", ECHO)
            await agent.stream.send_all(b'{"jsonrpc": "2.0"}\n')
            assert await read_line(agent) == b'{"jsonrpc": "2.0"}\n'
            await agent.stream.send_all(b"second\n")
            assert await read_line(agent) == b"second\n"
        assert agent.returncode == 0


async def test_shell_line_command() -> None:
    """A str command runs through /bin/sh -c, pipes and expansions included."""
    with trio.fail_after(10):
        async with open_agent_process("echo abc | tr a-c x-z; echo $((1+2))", name="sh") as agent:
            assert agent.argv[:2] == ("/bin/sh", "-c")
            assert await read_all(agent) == b"xyz\n3\n"
            assert await agent.wait() == 0


async def test_env_is_merged_over_the_environment_and_cwd_is_used(tmp_path: Path) -> None:
    """env entries are added to os.environ, and the child runs in cwd."""
    script = "import os; print(os.environ.get('AGENT_X'), 'PATH' in os.environ, os.getcwd())"
    with trio.fail_after(10):
        async with open_agent_process(
            [PY, "-c", script], name="env", env={"AGENT_X": "42"}, cwd=tmp_path
        ) as agent:
            out = await read_all(agent)
    cwd = str(await trio.Path(tmp_path).resolve())
    assert out.decode().split() == ["42", str("PATH" in os.environ), cwd]


async def test_env_alone_without_inheritance() -> None:
    """With inherit_env=False the child sees only the given env, and its tree marker."""
    script = "import os; print(sorted(k for k in os.environ if k != 'LC_CTYPE'))"
    with trio.fail_after(10):
        async with open_agent_process(
            [PY, "-c", script], name="env", env={"ONLY": "1"}, inherit_env=False
        ) as agent:
            out = await read_all(agent)
    assert out.strip() == b"['ONLY', 'ORCHESTRATOR_TREE']"


async def test_exit_status_after_a_crash() -> None:
    """A process that exits with status 3 reports 3, via wait() and returncode."""
    script = "import sys; print('boom', file=sys.stderr); sys.exit(3)"
    with trio.fail_after(10):
        async with open_agent_process([PY, "-c", script], name="crash") as agent:
            assert await agent.wait() == 3
            assert agent.returncode == 3
        assert agent.returncode == 3
        assert agent.stderr_tail() == "boom\n"


async def test_exit_status_after_a_signal() -> None:
    """A process killed by a signal reports the negative signal number."""
    with trio.fail_after(10):
        async with open_agent_process([PY, "-c", IGNORE_EOF], name="sig") as agent:
            assert await read_line(agent) == b"ready\n"
            os.kill(agent.pid, signal.SIGUSR1)
            assert await agent.wait() == -signal.SIGUSR1
        assert agent.returncode == -signal.SIGUSR1


async def test_process_runs_in_its_own_session() -> None:
    """The child leads its own session and process group."""
    with trio.fail_after(10):
        async with open_agent_process([PY, "-c", IGNORE_EOF], name="sess", **FAST) as agent:
            await read_line(agent)
            assert os.getpgid(agent.pid) == agent.pid
            assert os.getsid(agent.pid) == agent.pid


# --------------------------------------------------------------------------- stderr


async def test_stderr_tail_is_bounded_and_ends_with_the_last_line() -> None:
    """A megabyte of stderr leaves a tail within budget, starting on a line, ending the output."""
    script = (
        "import sys\n"
        "for i in range(20000):\n"
        "    sys.stderr.write(f'line {i:06d} ' + 'x' * 40 + '\\n')\n"
        "sys.stderr.write('LAST LINE\\n')\n"
    )
    with trio.fail_after(30), capture_logs() as logs:
        async with open_agent_process(
            [PY, "-c", script], name="noisy", stderr_tail_bytes=4096
        ) as agent:
            await agent.wait()
    tail = agent.stderr_tail()
    assert len(tail.encode()) <= 4096
    assert tail.endswith("line 019999 " + "x" * 40 + "\nLAST LINE\n")
    assert tail.startswith("line ")
    lines = [e for e in logs if e["event"] == "agent stderr"]
    assert len(lines) == 20001
    assert lines[-1] == {
        "event": "agent stderr",
        "agent": "noisy",
        "line": "LAST LINE",
        "log_level": "info",
    }


async def test_an_overlong_stderr_line_is_truncated() -> None:
    """A single 1 MB stderr line is cut to the budget, in the tail and in the log."""
    script = "import sys; sys.stderr.write('y' * 1_000_000 + '\\nafter\\n')"
    with trio.fail_after(30), capture_logs() as logs:
        async with open_agent_process(
            [PY, "-c", script], name="long", stderr_tail_bytes=1000
        ) as agent:
            await agent.wait()
    tail = agent.stderr_tail()
    assert len(tail.encode()) <= 1000
    assert tail.endswith("after\n")
    long_line = next(e for e in logs if e["event"] == "agent stderr")
    assert long_line["line"] == "y" * 1000
    assert long_line["truncated"] == 999_000


async def test_exit_error_carries_status_and_stderr_tail() -> None:
    """exit_error() waits for the exit and returns AgentExited with status and tail."""
    script = (
        "import sys; sys.stdin.read(); print('fatal: bad things', file=sys.stderr); sys.exit(7)"
    )
    with trio.fail_after(10):
        async with open_agent_process([PY, "-c", script], name="dying") as agent:
            await agent.stream.send_stream.aclose()
            error = await agent.exit_error("agent closed its stdout", wait=5)
    assert isinstance(error, AgentExited)
    assert error.peer == "dying"
    assert error.exit_status == 7
    assert error.stderr_tail == "fatal: bad things\n"
    assert "exit status 7" in str(error)
    assert "fatal: bad things" in str(error)


async def test_exit_error_of_a_running_process_has_no_status() -> None:
    """exit_error() gives up after `wait` seconds and reports no exit status."""
    with trio.fail_after(10):
        async with open_agent_process([PY, "-c", IGNORE_EOF], name="alive", **FAST) as agent:
            await read_line(agent)
            error = await agent.exit_error("stream broke", wait=0.05)
            assert error.exit_status is None
            assert agent.returncode is None


# --------------------------------------------------------------------------- shutdown ladder


async def test_process_ignoring_stdin_close_gets_sigterm() -> None:
    """A process that does not exit on stdin EOF is stopped with SIGTERM after the grace."""
    with trio.fail_after(10), capture_logs() as logs:
        async with open_agent_process([PY, "-c", IGNORE_EOF], name="deaf", **FAST) as agent:
            await read_line(agent)
            start = trio.current_time()
        assert trio.current_time() - start >= 0.2
    assert agent.returncode == -signal.SIGTERM
    events = [e["event"] for e in logs]
    assert "agent shutdown: still running after stdin closed, sending SIGTERM" in events


async def test_process_ignoring_sigterm_gets_sigkill() -> None:
    """A process that ignores SIGTERM is killed with SIGKILL after the term grace."""
    with trio.fail_after(10), capture_logs() as logs:
        async with open_agent_process([PY, "-c", IGNORE_TERM], name="stubborn", **FAST) as agent:
            await read_line(agent)
            start = trio.current_time()
        elapsed = trio.current_time() - start
    assert agent.returncode == -signal.SIGKILL
    assert 0.4 <= elapsed < 5
    events = [e["event"] for e in logs]
    assert "agent shutdown: still running after SIGTERM, sending SIGKILL" in events


async def test_aclose_is_idempotent_and_concurrent_safe() -> None:
    """aclose() may be called twice and concurrently; the ladder runs once."""
    with trio.fail_after(10), capture_logs() as logs:
        async with open_agent_process([PY, "-c", IGNORE_EOF], name="twice", **FAST) as agent:
            await read_line(agent)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(agent.aclose)
                nursery.start_soon(agent.aclose)
            assert agent.returncode == -signal.SIGTERM
            await agent.aclose()
    sigterms = [e for e in logs if "sending SIGTERM" in e["event"]]
    assert len(sigterms) == 1


async def test_aclose_completes_even_when_cancelled() -> None:
    """aclose() is shielded: cancelling its caller does not stop the ladder."""
    with trio.fail_after(10):
        async with open_agent_process([PY, "-c", IGNORE_TERM], name="shielded", **FAST) as agent:
            await read_line(agent)
            with trio.CancelScope() as scope:
                scope.cancel()
                await agent.aclose()
            assert agent.returncode == -signal.SIGKILL


@pytest.mark.parametrize("leader", ["eof", "ignore-eof", "ignore-term"])
async def test_no_process_of_the_tree_survives(leader: str) -> None:
    """Children and grandchildren (some ignoring SIGTERM, one orphaned) all die with the agent."""
    with trio.fail_after(20):
        async with open_agent_process(
            [PY, SPAWN_TREE, "--leader", leader], name="tree", **FAST
        ) as agent:
            pids = await tree_pids(agent)
            # Child 2 exits at once (a zombie until the leader reaps it); the rest must live.
            assert sum(is_alive(pid, t) for pid, t in pids.items()) >= 6
        assert agent.returncode is not None
        await assert_all_gone(pids)


async def test_no_process_survives_when_the_body_raises() -> None:
    """An exception in the body stops the whole tree and comes out unwrapped."""
    pids: dict[int, str | None] = {}

    async def run_and_fail() -> None:
        async with open_agent_process([PY, SPAWN_TREE], name="tree", **FAST) as agent:
            pids.update(await tree_pids(agent))
            raise ValueError("body failed")

    with trio.fail_after(20):
        with pytest.raises(ValueError, match="body failed") as info:
            await run_and_fail()
        assert info.type is ValueError
        assert len(pids) == 7
        await assert_all_gone(pids)


async def test_no_process_survives_cancellation() -> None:
    """Cancelling the surrounding scope stops the whole tree and the Cancelled propagates."""
    pids: dict[int, str | None] = {}
    with trio.fail_after(20):
        with trio.move_on_after(1) as scope:
            async with open_agent_process(
                [PY, SPAWN_TREE, "--leader", "ignore-term"], name="tree", **FAST
            ) as agent:
                pids = await tree_pids(agent)
                await trio.sleep_forever()
        assert scope.cancelled_caught
        assert agent.returncode == -signal.SIGKILL
        await assert_all_gone(pids)


async def test_leftovers_are_killed_when_the_leader_exits_on_its_own() -> None:
    """When the leader exits while the block runs, its group's leftovers are killed at once."""
    with trio.fail_after(20):
        async with open_agent_process([PY, SPAWN_TREE], name="tree", **FAST) as agent:
            pids = await tree_pids(agent)
            await agent.stream.send_stream.aclose()
            assert await agent.wait() == 0
            await assert_all_gone(pids)


async def test_user_exception_group_is_not_rewrapped() -> None:
    """An ExceptionGroup raised by the body comes out with no extra nursery group around it."""
    group = ExceptionGroup("mine", [KeyError("a"), KeyError("b")])
    with trio.fail_after(10):
        with pytest.raises(ExceptionGroup) as info:
            async with open_agent_process([PY, "-c", "pass"], name="g"):
                raise group
    # trio's cancel scopes split groups, which copies them; the leaves are the very same objects.
    assert info.value.message == "mine"
    assert info.value.exceptions == group.exceptions


# --------------------------------------------------------------------------- start errors


async def test_command_not_found_raises_agent_start_error() -> None:
    """A missing executable raises AgentStartError naming the agent and the command."""
    with trio.fail_after(10):
        with pytest.raises(AgentStartError) as info:
            async with open_agent_process(["/nonexistent/agent-bin", "--acp"], name="ghost"):
                pytest.fail("must not start")
    assert info.value.agent == "ghost"
    assert "ghost" in str(info.value)
    assert "/nonexistent/agent-bin --acp" in str(info.value)
    assert isinstance(info.value.__cause__, FileNotFoundError)


async def test_not_executable_raises_agent_start_error(tmp_path: Path) -> None:
    """A file without execute permission raises AgentStartError."""
    script = tmp_path / "agent.sh"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o644)
    with trio.fail_after(10):
        with pytest.raises(AgentStartError, match=r"agent\.sh"):
            async with open_agent_process([str(script)], name="noexec"):
                pytest.fail("must not start")


async def test_bad_cwd_raises_agent_start_error(tmp_path: Path) -> None:
    """A working directory that does not exist raises AgentStartError."""
    with trio.fail_after(10):
        with pytest.raises(AgentStartError, match="missing-dir"):
            async with open_agent_process(
                [PY, "-c", "pass"], name="cwd", cwd=tmp_path / "missing-dir"
            ):
                pytest.fail("must not start")


async def test_empty_command_raises_agent_start_error() -> None:
    """An empty argv raises AgentStartError."""
    with trio.fail_after(10):
        with pytest.raises(AgentStartError, match="empty command"):
            async with open_agent_process([], name="empty"):
                pytest.fail("must not start")


async def test_stderr_written_during_shutdown_is_kept_under_cancellation() -> None:
    """The stderr drain keeps running through the ladder even when the scope was cancelled."""
    script = (
        "import signal, sys, time\n"
        "def bye(*_):\n"
        "    sys.stderr.write('got SIGTERM\\n'); sys.stderr.flush(); sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n"
    )
    with trio.fail_after(10):
        with trio.move_on_after(0.5) as scope:
            async with open_agent_process([PY, "-c", script], name="polite", **FAST) as agent:
                await read_line(agent)
                await trio.sleep_forever()
        assert scope.cancelled_caught
    assert agent.returncode == 143
    assert agent.stderr_tail() == "got SIGTERM\n"
