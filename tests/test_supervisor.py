"""The supervisor: pools, limits, restarts, watchdogs and shutdown, with real agent processes."""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from conftest import pid_gone
from run_helpers import timeline

from orchestrator.agent.client import ClientOptions
from orchestrator.agents import AgentSpec
from orchestrator.errors import AgentError, AgentExited, AgentStartError, TurnTimeout
from orchestrator.supervisor import ConnectArgs, Limits, open_supervisor, subprocess_connector
from orchestrator.testing import (
    AgentScript,
    Capabilities,
    Crash,
    ExitAtStart,
    Say,
    Sleep,
    Stall,
    Turn,
    scripted_agent_command,
)
from orchestrator.testing.connector import memory_connector


def spec_for(
    script: AgentScript, directory: Path, name: str = "scripted", **kw: object
) -> AgentSpec:
    return AgentSpec(name, tuple(scripted_agent_command(script, directory)), **kw)  # type: ignore[arg-type]


SAY = AgentScript(turns=(Turn(steps=(Say("done"),)),))


async def test_lease_runs_a_turn_and_reuses_the_process(tmp_path: Path) -> None:
    """Two leases in a row share one process; the statistics count them."""
    spec = spec_for(SAY, tmp_path)
    with trio.fail_after(30):
        async with open_supervisor() as sup:
            for _ in range(2):
                async with sup.lease(spec, cwd=tmp_path) as lease:
                    result = await lease.prompt("hi")
                    assert result.text == "done"
                    assert sup.statistics()["sessions"] == 1
            stats = sup.statistics()
            pid = next(iter(sup._pools.values())).processes[0].conn.pid  # type: ignore[union-attr]
    assert stats["spawned"] == 1
    assert stats["agents"]["scripted"]["turnsTotal"] == 2
    # services and audit records see the agent's name, not the process label
    assert lease.connection.name == "scripted"
    assert lease.session.context.agent == "scripted"
    assert stats["sessions"] == 0
    assert pid is not None and pid_gone(pid)


async def test_one_session_per_process_spawns_a_process_per_lease(tmp_path: Path) -> None:
    """An agent serving one session per process gets a fresh process for every lease."""
    spec = spec_for(SAY, tmp_path, sessions_per_process=1)
    pids = []
    with trio.fail_after(30):
        async with open_supervisor() as sup:
            for _ in range(2):
                async with sup.lease(spec, cwd=tmp_path) as lease:
                    await lease.prompt("hi")
                    pids.append(lease.connection.pid)
            assert sup.statistics()["spawned"] == 2
    assert len(set(pids)) == 2
    assert all(p is not None and pid_gone(p) for p in pids)


async def test_global_limit_bounds_live_sessions() -> None:
    """Twenty concurrent leases under a limit of 4 never hold more than 4 sessions."""
    script = AgentScript(turns=(Turn(steps=(Sleep(0.01), Say("ok"))),))
    spec = AgentSpec("mem", ("unused",))
    seen: list[int] = []
    with trio.fail_after(30):
        async with open_supervisor(
            Limits(max_sessions=4), connector=memory_connector(lambda _: script)
        ) as sup:

            async def one() -> None:
                async with sup.lease(spec, cwd="/tmp") as lease:
                    seen.append(sup.statistics()["sessions"])
                    await lease.prompt("go")

            async with trio.open_nursery() as nursery:
                for _ in range(20):
                    nursery.start_soon(one)
            stats = sup.statistics()
    assert stats["peakSessions"] == 4
    assert max(seen) <= 4
    assert stats["agents"]["mem"]["turnsTotal"] == 20


async def test_per_agent_limit() -> None:
    """An agent's own max_sessions bounds its sessions even with no global limit."""
    script = AgentScript(turns=(Turn(steps=(Sleep(0.01), Say("ok"))),))
    spec = AgentSpec("mem", ("unused",), max_sessions=2)
    with trio.fail_after(30):
        async with open_supervisor(connector=memory_connector(lambda _: script)) as sup:

            async def one() -> None:
                async with sup.lease(spec, cwd="/tmp") as lease:
                    await lease.prompt("go")

            async with trio.open_nursery() as nursery:
                for _ in range(10):
                    nursery.start_soon(one)
            assert sup.statistics()["peakSessions"] == 2


async def test_queue_behind_a_per_agent_limit_leaves_global_slots_to_others(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Leases waiting for a busy agent's own slot do not hold global slots other agents need."""
    slow = AgentScript(turns=(Turn(steps=(Sleep(10), Say("slow"))),))
    fast = AgentScript(turns=(Turn(steps=(Say("fast"),)),))
    scripts = {"slow": slow, "fast": fast}
    slow_spec = AgentSpec("slow", ("unused",), max_sessions=1)
    fast_spec = AgentSpec("fast", ("unused",))
    fast_done: list[float] = []
    with trio.fail_after(120):
        async with open_supervisor(
            Limits(max_sessions=2),
            connector=memory_connector(lambda spec: scripts[spec.name]),
        ) as sup:

            async def one(spec: AgentSpec) -> None:
                async with sup.lease(spec, cwd="/tmp") as lease:
                    await lease.prompt("go")
                if spec is fast_spec:
                    fast_done.append(trio.current_time())

            start = trio.current_time()
            async with trio.open_nursery() as nursery:
                for _ in range(4):  # one runs, three wait for the slow agent's only slot
                    nursery.start_soon(one, slow_spec)
                await trio.testing.wait_all_tasks_blocked()
                nursery.start_soon(one, fast_spec)
    # the fast agent ran beside the first slow turn, not after the slow queue drained
    assert fast_done and fast_done[0] - start < 10


async def test_crash_mid_turn_is_reported_and_replaced(tmp_path: Path) -> None:
    """A crash fails the lease's turn; the next lease gets a new process (one restart)."""
    script = AgentScript(
        turns=(
            Turn(steps=(Crash(exit_code=3, stderr="boom"),), when_prompt_contains="crash"),
            Turn(steps=(Say("fine"),)),
        )
    )
    spec = spec_for(script, tmp_path)
    with trio.fail_after(30):
        async with open_supervisor(Limits(backoff=0.01)) as sup:
            with pytest.raises(AgentExited) as info:  # noqa: PT012
                async with sup.lease(spec, cwd=tmp_path) as lease:
                    first_pid = lease.connection.pid
                    await lease.prompt("crash now")
            assert info.value.exit_status == 3
            await trio.sleep(0.1)
            assert sup.statistics()["crashes"] == 1
            async with sup.lease(spec, cwd=tmp_path) as lease:
                assert (await lease.prompt("hello")).text == "fine"
                assert lease.connection.pid != first_pid
            stats = sup.statistics()
    assert stats["restarts"] == 1
    assert stats["spawned"] == 2


async def test_restart_budget_is_enforced(tmp_path: Path) -> None:
    """Once an agent crashed more often than its budget allows, leases fail with AgentError."""
    script = AgentScript(turns=(Turn(steps=(Crash(),)),))
    spec = spec_for(script, tmp_path, max_restarts=1)
    with trio.fail_after(30):
        async with open_supervisor(Limits(backoff=0.01)) as sup:
            for _ in range(2):
                with pytest.raises(AgentExited):
                    async with sup.lease(spec, cwd=tmp_path) as lease:
                        await lease.prompt("x")
                await trio.sleep(0.05)
            with pytest.raises(AgentError, match="restart budget"):
                async with sup.lease(spec, cwd=tmp_path):
                    pass


async def test_unresponsive_agent_is_killed(tmp_path: Path) -> None:
    """An agent that ignores the cancel after an idle timeout is killed."""
    script = AgentScript(turns=(Turn(steps=(Stall(),), ignore_cancel=True),))
    spec = spec_for(script, tmp_path)
    with trio.fail_after(30):
        async with open_supervisor(options=ClientOptions(cancel_grace=0.2)) as sup:
            with pytest.raises(TurnTimeout) as info:  # noqa: PT012
                async with sup.lease(spec, cwd=tmp_path) as lease:
                    pid = lease.connection.pid
                    await lease.prompt("x", idle_timeout=0.3)
            assert info.value.unresponsive
            with trio.fail_after(10):
                while not (pid is not None and pid_gone(pid)):  # noqa: ASYNC110
                    await trio.sleep(0.05)


async def test_cancel_honoured_keeps_the_process(tmp_path: Path) -> None:
    """A timed-out turn the agent cancels politely does not cost the process."""
    script = AgentScript(turns=(Turn(steps=(Stall(),)),))
    spec = spec_for(script, tmp_path)
    with trio.fail_after(30):
        async with open_supervisor() as sup:
            with pytest.raises(TurnTimeout) as info:
                async with sup.lease(spec, cwd=tmp_path) as lease:
                    await lease.prompt("x", timeout=0.3)
            assert not info.value.unresponsive
            assert sup.statistics()["processes"] == 1


async def test_start_failure_is_reported(tmp_path: Path) -> None:
    """An agent that exits before initialize fails the lease with AgentStartError."""
    script = AgentScript(exit_at_start=ExitAtStart(exit_code=2, stderr="no key"))
    spec = spec_for(script, tmp_path)
    with trio.fail_after(30):
        async with open_supervisor() as sup:
            with pytest.raises(AgentStartError):
                async with sup.lease(spec, cwd=tmp_path):
                    pass
            assert sup.statistics()["processes"] == 0


async def test_shared_process_closes_sessions(tmp_path: Path) -> None:
    """Sessions on an agent supporting session/close are closed when the lease ends."""
    script = AgentScript(
        capabilities=Capabilities(session_close=True), turns=(Turn(steps=(Say("x"),)),)
    )
    spec = spec_for(script, tmp_path)
    with trio.fail_after(30):
        async with open_supervisor() as sup:
            async with sup.lease(spec, cwd=tmp_path) as lease:
                conn = lease.connection
                await lease.prompt("x")
            assert conn.sessions == {}


async def test_exit_kills_every_process(tmp_path: Path) -> None:
    """Leaving the supervisor (even by cancellation) leaves no agent process behind."""
    spec = spec_for(AgentScript(turns=(Turn(steps=(Stall(),)),)), tmp_path, sessions_per_process=1)
    pids: list[int] = []
    with trio.fail_after(30):
        with trio.move_on_after(2):
            async with open_supervisor() as sup:

                async def one() -> None:
                    async with sup.lease(spec, cwd=tmp_path) as lease:
                        assert lease.connection.pid is not None
                        pids.append(lease.connection.pid)
                        await lease.prompt("x")

                async with trio.open_nursery() as nursery:
                    for _ in range(3):
                        nursery.start_soon(one)
    assert len(pids) == 3
    assert all(pid_gone(p) for p in pids)


async def test_cancelled_caller_ends_turns_before_the_processes_stop(tmp_path: Path) -> None:
    """Cancelled mid-turn: session/cancel first; session/close only where the turn then ended."""
    polite_record, deaf_record = tmp_path / "polite.jsonl", tmp_path / "deaf.jsonl"
    closing = Capabilities(session_close=True)
    polite = AgentScript(
        capabilities=closing,
        turns=(Turn(steps=(Say("working"), Stall())),),
        record_path=str(polite_record),
    )
    deaf = AgentScript(
        capabilities=closing,
        turns=(Turn(steps=(Say("working"), Stall()), ignore_cancel=True),),
        record_path=str(deaf_record),
    )
    specs = [spec_for(polite, tmp_path, "polite"), spec_for(deaf, tmp_path, "deaf")]
    results = {}
    pids = []
    with trio.fail_after(30), trio.CancelScope() as scope:
        async with open_supervisor(options=ClientOptions(interrupt_grace=0.5)) as sup:
            working = 0

            def started(update: object) -> None:
                nonlocal working
                working += 1
                if working == len(specs):
                    scope.cancel()

            async def one(spec: AgentSpec) -> None:
                async with sup.lease(spec, cwd=tmp_path) as lease:
                    assert lease.connection.pid is not None
                    pids.append(lease.connection.pid)
                    try:
                        await lease.prompt("x", on_update=started)
                    finally:
                        results[spec.name] = lease.session.last_result

            async with trio.open_nursery() as nursery:
                for spec in specs:
                    nursery.start_soon(one, spec)
    assert scope.cancelled_caught
    assert all(pid_gone(p) for p in pids)
    polite_seen, deaf_seen = timeline(polite_record), timeline(deaf_record)
    assert "recv $/cancel_request" not in polite_seen + deaf_seen
    assert polite_seen.index("recv session/cancel") < polite_seen.index("turn_end")
    assert polite_seen.index("turn_end") < polite_seen.index("recv session/close")
    assert polite_seen.index("recv session/close") < polite_seen.index("eof")
    assert deaf_seen.index("recv session/cancel") < deaf_seen.index("eof")
    assert "turn_end" not in deaf_seen
    assert "recv session/close" not in deaf_seen  # retired: it did not end its turn
    assert {name: (r.stop_reason, r.text) for name, r in results.items() if r} == {
        "polite": ("cancelled", "working"),
        "deaf": (None, "working"),
    }


async def test_same_label_different_agents_get_a_pool_each(tmp_path: Path) -> None:
    """Two different commands under one label never share a pool: each lease runs its own."""
    say = {n: AgentScript(turns=(Turn(steps=(Say(f"I am {n}"),)),)) for n in "ab"}
    a = spec_for(say["a"], tmp_path, name="x")
    b = spec_for(say["b"], tmp_path, name="x")
    with trio.fail_after(30):
        async with open_supervisor() as sup:
            async with sup.lease(a, cwd=tmp_path) as la, sup.lease(b, cwd=tmp_path) as lb:
                assert (await la.prompt("who")).text == "I am a"
                assert (await lb.prompt("who")).text == "I am b"
                assert (la.process, lb.process) == ("x", "x#2")
            assert sup.statistics()["agents"]["x"]["spawned"] == 2


async def test_one_agent_under_two_settings_refused(tmp_path: Path) -> None:
    """The same label and command leased with other limits is refused, not mixed in a pool."""
    a = spec_for(SAY, tmp_path, name="x")
    b = attrs.evolve(a, max_sessions=1)
    with trio.fail_after(30):
        async with open_supervisor() as sup:
            async with sup.lease(a, cwd=tmp_path):
                pass
            with pytest.raises(AgentError, match="two different settings"):
                async with sup.lease(b, cwd=tmp_path):
                    pass


async def test_failed_start_fails_every_waiting_lease_once() -> None:
    """Leases waiting for a process that fails to start all fail; the start is tried once."""
    from contextlib import asynccontextmanager

    calls = 0

    @asynccontextmanager
    async def broken(spec: AgentSpec, args: object) -> AsyncIterator[object]:
        nonlocal calls
        calls += 1
        await trio.sleep(0.05)
        raise AgentStartError("no such agent", agent=spec.name)
        yield  # pragma: no cover

    spec = AgentSpec("shared", ("unused",))
    errors: list[BaseException] = []
    with trio.fail_after(10):
        async with open_supervisor(connector=broken) as sup:  # type: ignore[arg-type]

            async def one() -> None:
                try:
                    async with sup.lease(spec, cwd="/tmp"):
                        pass
                except AgentStartError as e:
                    errors.append(e)

            async with trio.open_nursery() as nursery:
                for _ in range(4):
                    nursery.start_soon(one)
            assert sup.statistics()["processes"] == 0
    assert calls == 1
    assert len(errors) == 4
    assert len({id(e) for e in errors}) == 4  # each lease got its own error


async def test_lease_cancelled_while_a_process_starts_gives_its_room_back() -> None:
    """A lease cancelled while waiting for a starting process does not keep a session slot."""
    script = AgentScript(initialize_delay=0.3, turns=(Turn(steps=(Say("ok"),)),))
    spec = AgentSpec("slow", ("unused",), sessions_per_process=2)
    with trio.fail_after(10):
        async with open_supervisor(connector=memory_connector(lambda _: script)) as sup:
            async with trio.open_nursery() as nursery:

                async def first() -> None:
                    async with sup.lease(spec, cwd="/tmp") as lease:
                        await lease.prompt("go")

                nursery.start_soon(first)
                await trio.sleep(0.05)
                with trio.move_on_after(0.05):
                    async with sup.lease(spec, cwd="/tmp"):
                        pass
            [proc] = next(iter(sup._pools.values())).processes
            assert proc.sessions == 0


async def test_lease_cancelled_as_its_agent_finishes_starting_ends(tmp_path: Path) -> None:
    """A lease cancelled just as its agent finished starting (no checkpoint saw the cancel yet)
    ends with Cancelled and the agent is stopped, instead of the start waiting for ever."""
    scope = trio.CancelScope()
    pids: list[int] = []

    @asynccontextmanager
    async def cancelled_as_started(spec: AgentSpec, args: ConnectArgs) -> AsyncIterator[Any]:
        async with subprocess_connector(spec, args) as conn:
            assert conn.pid is not None
            pids.append(conn.pid)
            scope.cancel()  # lands between the answer to initialize and the start's end
            yield conn

    left = trio.Event()
    with trio.fail_after(30):
        async with open_supervisor(connector=cancelled_as_started) as sup:

            async def lease() -> None:
                with scope:
                    try:
                        async with sup.lease(spec_for(SAY, tmp_path), cwd=tmp_path):
                            pytest.fail("leased although cancelled")
                    except AgentExited:
                        return  # killed below, having kept waiting: the failure is below
                left.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(lease)
                with trio.move_on_after(5):
                    await left.wait()
                ended = left.is_set()
                if not ended:  # what else would end the start: the agent's end
                    os.kill(pids[0], signal.SIGKILL)
                    nursery.cancel_scope.cancel()
    assert ended, "the cancelled lease kept waiting for its agent's start"
    assert scope.cancelled_caught
    assert pid_gone(pids[0])
