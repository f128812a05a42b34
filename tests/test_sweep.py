"""Tests for the process-tree markers, the /proc sweep and the watchdog (real processes)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio
from conftest import pid_gone

from orchestrator.agent import _sweep, reaper

PY = sys.executable
DEADLINE = 20.0


async def until(condition: Callable[[], bool], within: float = DEADLINE) -> None:
    """Poll ``condition`` until it holds; fail after ``within`` seconds."""
    # Polling: nothing signals the death of a process that is not our child.
    with trio.move_on_after(within):
        while not condition():  # noqa: ASYNC110
            await trio.sleep(0.02)
    assert condition(), f"not within {within} s"


@asynccontextmanager
async def session(
    token: str | None, member: str = "env -i sleep 300"
) -> AsyncIterator[tuple[int, int]]:
    """A session leader ``sleep`` carrying ``token`` (or no marker) and a member of its session
    (by default started with an empty environment); yields both pids, kills both at the end."""
    env = {name: value for name, value in os.environ.items() if name != _sweep.MARKER}
    if token is not None:
        env[_sweep.MARKER] = token
    proc = await trio.lowlevel.open_process(
        ["sh", "-c", f"{member} & echo $!; exec sleep 300"],
        env=env,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    try:
        line = b""
        while not line.endswith(b"\n"):
            line += await proc.stdout.receive_some(1)
        member_pid = int(line)
        # it runs with its own environment once it runs sleep (no longer the forked shell)
        cmdline = Path(f"/proc/{member_pid}/cmdline")
        await until(lambda: cmdline.read_bytes().startswith(b"sleep\0"))
        yield proc.pid, member_pid
    finally:
        with trio.CancelScope(shield=True):
            # both are in the leader's group, which is ours until the leader is reaped
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            await proc.stdout.aclose()


def test_markers_are_read_from_an_environment_block() -> None:
    """The marker's tokens wherever the variable sits; a longer name ending like it is not it."""
    assert _sweep.markers(b"ORCHESTRATOR_TREE=a.1:b.2\0PATH=/bin\0") == [b"a.1", b"b.2"]
    assert _sweep.markers(b"XORCHESTRATOR_TREE=no\0HOME=/\0ORCHESTRATOR_TREE=c.3") == [b"c.3"]
    assert _sweep.markers(b"PATH=/bin\0XORCHESTRATOR_TREE=no\0") == []
    assert _sweep.markers(b"") == []


def test_a_tree_inherits_the_markers_above_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under another orchestrator's tree, a new tree keeps the outer tokens before its own."""
    monkeypatch.setenv(reaper.MARKER, "outer.7")
    tree = reaper.open_tree()
    try:
        assert tree.value == f"outer.7:{tree.token}"
        assert tree.environment({reaper.MARKER: "forged", "A": "1"}) == {
            reaper.MARKER: tree.value,
            "A": "1",
        }
    finally:
        reaper.close_tree(tree)


async def test_kill_trees_takes_the_marked_and_their_sessions_only() -> None:
    """The marked process dies, and its session's unmarked member; another token's do not."""
    with trio.fail_after(DEADLINE):
        async with session("t.1") as (marked, member), session("t.2") as (other, other_member):
            killed = await trio.to_thread.run_sync(
                _sweep.kill_trees, lambda tokens: b"t.1" in tokens
            )
            assert {marked, member} <= set(killed)
            await until(lambda: pid_gone(marked) and pid_gone(member))
            assert not pid_gone(other) and not pid_gone(other_member)


async def test_a_marked_job_in_a_foreign_session_spares_that_session() -> None:
    """A marked process in a session led by an unmarked one (a job a daemon ran with the tree's
    environment) dies alone: the session's leader lives on."""
    job = f"env {_sweep.MARKER}=t.3 sleep 300"
    with trio.fail_after(DEADLINE):
        async with session(None, member=job) as (daemon, marked):
            killed = await trio.to_thread.run_sync(
                _sweep.kill_trees, lambda tokens: b"t.3" in tokens
            )
            assert killed == [marked]
            await until(lambda: pid_gone(marked))
            assert not pid_gone(daemon)


async def test_kill_trees_takes_a_named_session_without_any_marker() -> None:
    """A session named by the caller (a tree's leader) dies whole, markers or not."""
    with trio.fail_after(DEADLINE):
        async with session(None) as (leader, member):
            await trio.to_thread.run_sync(_sweep.kill_trees, lambda tokens: False, [leader])
            await until(lambda: pid_gone(leader) and pid_gone(member))


async def start_watchdog(nonce: str) -> tuple[trio.Process, int]:
    """The watchdog of an orchestrator ``nonce``; returns it and the write end of its pipe."""
    read_end, write_end = os.pipe()
    watchdog = await trio.lowlevel.open_process(
        reaper.watchdog_command(nonce, 0), stdin=read_end, start_new_session=True
    )
    os.close(read_end)
    return watchdog, write_end


async def test_the_watchdog_kills_its_orchestrators_trees_at_eof() -> None:
    """Its pipe closed without a word: every process carrying the nonce dies, nothing else."""
    with trio.fail_after(DEADLINE):
        async with session("f00d.1") as (marked, member), session("beef.1") as (other, _):
            watchdog, pipe = await start_watchdog("f00d")
            os.close(pipe)
            assert await watchdog.wait() == 0
            await until(lambda: pid_gone(marked) and pid_gone(member))
            assert not pid_gone(other)


async def test_the_watchdog_leaves_on_q_without_a_sweep() -> None:
    """An orderly exit with no tree open says ``q``: the watchdog kills nothing."""
    with trio.fail_after(DEADLINE):
        async with session("cafe.1") as (marked, member):
            watchdog, pipe = await start_watchdog("cafe")
            os.write(pipe, b"q\n")
            os.close(pipe)
            assert await watchdog.wait() == 0
            assert not pid_gone(marked) and not pid_gone(member)


async def test_a_process_exiting_with_open_trees_takes_them_along(tmp_path: Path) -> None:
    """A program that opened a tree and leaves by ``os._exit`` without releasing it: its
    watchdog kills the tree."""
    pidfile = tmp_path / "sleeper.pid"
    program = (
        "import os, subprocess\n"
        "from orchestrator.agent import reaper\n"
        "tree = reaper.open_tree()\n"
        "p = subprocess.Popen(['sleep', '300'], env=tree.environment(os.environ),\n"
        "                     start_new_session=True)\n"
        f"open({str(pidfile)!r}, 'w').write(str(p.pid))\n"
        "os._exit(0)\n"
    )
    with trio.fail_after(DEADLINE):
        await trio.run_process([PY, "-c", program])
        sleeper = int(pidfile.read_text())
        await until(lambda: pid_gone(sleeper))
