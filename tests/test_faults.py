"""Faults of real agent processes (scripted agents as subprocesses); no process may be left."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from conftest import is_process_watchdog, pid_gone
from log_capture import capture_logs
from run_helpers import timeline

import orchestrator.agent.launch as client_module
from orchestrator.agent.client import (
    AgentConnection,
    ClientOptions,
    open_agent,
    open_agent_on_stream,
)
from orchestrator.agent.process import AgentProcess, open_agent_process
from orchestrator.errors import (
    AgentExited,
    AgentHung,
    AgentStartError,
    BacklogExceeded,
    ConnectionClosed,
    TurnTimeout,
)
from orchestrator.protocol import types as t
from orchestrator.testing import (
    AgentRecord,
    AgentScript,
    AskPermission,
    Crash,
    ExitAtStart,
    FloodRequests,
    HugeLine,
    PermissionToolCall,
    Raw,
    Request,
    Say,
    Stall,
    Step,
    scripted_agent_command,
)
from orchestrator.testing import Turn as ScriptTurn

AGENT = "faulty"
#: real seconds before a stuck test fails instead of hanging
LIMIT = 30.0
#: each rung of the shutdown ladder (stdin closed, SIGTERM), kept short
GRACE = 0.5
#: what "promptly" means for a failure the client should notice at once
PROMPTLY = 5.0


# --------------------------------------------------------------------------- process checks


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name, or None if it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return text.rsplit(")", 1)[1].split()


def _live_processes() -> Iterator[tuple[int, list[str]]]:
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and fields[0] not in ("Z", "X"):
                yield int(entry.name), fields


def live_children(pid: int) -> set[int]:
    """Processes whose parent is ``pid`` and that are not zombies, but its process watchdog."""
    return {
        p for p, fields in _live_processes() if int(fields[1]) == pid and not is_process_watchdog(p)
    }


def live_group(pgid: int) -> set[int]:
    """Live members of the process group ``pgid`` (an agent's group is its own pid)."""
    return {p for p, fields in _live_processes() if int(fields[2]) == pgid}


def descendants(pid: int) -> set[int]:
    """Every live descendant of ``pid``."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in live_children(todo.pop()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _still_there(find: Callable[[], set[int]], within: float = 2.0) -> set[int]:
    # A process killed by a signal dies a moment after kill() returns; only the leader is waited
    # for (reaped) by the shutdown ladder, so give the rest of its group that moment.
    deadline = time.monotonic() + within
    while (found := find()) and time.monotonic() < deadline:
        time.sleep(0.01)
    return found


async def lingering(pids: Iterable[int], within: float = 2.0) -> set[int]:
    """The processes of ``pids`` still alive after up to ``within`` seconds."""
    left = {p for p in pids if not pid_gone(p)}
    with trio.move_on_after(within):
        while left:
            await trio.sleep(0.01)
            left = {p for p in left if not pid_gone(p)}
    return left


@pytest.fixture(autouse=True)
def agent_pids(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Pids of the agents started in the test; after it none of them, nor their group, lives."""
    pids: list[int] = []
    original = open_agent_process

    @asynccontextmanager
    async def recording(*args: Any, **kwargs: Any) -> AsyncIterator[AgentProcess]:
        async with original(*args, **kwargs) as proc:
            pids.append(proc.pid)
            yield proc

    monkeypatch.setattr(client_module, "open_agent_process", recording)
    before = live_children(os.getpid())
    yield pids
    assert [p for p in pids if not pid_gone(p)] == [], "an agent process outlived its block"
    group = _still_there(lambda: {g for p in pids for g in live_group(p)})
    assert group == set(), "a member of an agent's process group lives on"
    children = _still_there(lambda: live_children(os.getpid()) - before)
    assert children == set(), "a child process was left behind"


@pytest.fixture(autouse=True)
def schema_violations_fail() -> Iterator[None]:
    """Fail the test if a frame our client sent failed conftest's schema check (only logged)."""
    with capture_logs() as events:
        yield
    failed = [e.get("exception", e) for e in events if e["event"] == "frame observer failed"]
    assert not failed, f"a frame our client sent failed the schema check: {failed[0]}"


# --------------------------------------------------------------------------- helpers


def turns(*steps: Step, **kwargs: Any) -> AgentScript:
    """A script whose every prompt runs ``steps`` (``kwargs`` go to the agent script)."""
    return AgentScript(turns=(ScriptTurn(steps=steps),), **kwargs)


def recorded(script: AgentScript, directory: Path) -> tuple[AgentScript, Path]:
    """The script with a record file in ``directory``, and that file's path."""
    path = directory / "record.jsonl"
    return AgentScript.from_json({**script.to_json(), "record_path": str(path)}), path


@asynccontextmanager
async def agent(
    script: AgentScript,
    directory: Path,
    *,
    options: ClientOptions | None = None,
    wrapper: Sequence[str] = (),
) -> AsyncIterator[AgentConnection]:
    """An initialized connection to the scripted agent run as a subprocess.

    ``wrapper`` is a command prefix (e.g. a shell line that outlives the agent), run with the
    agent's command line as its arguments.
    """
    command = [*wrapper, *scripted_agent_command(script, directory)]
    with trio.fail_after(LIMIT):
        async with open_agent(command, name=AGENT, options=options, term_grace=GRACE) as conn:
            assert conn.pid is not None
            yield conn


def shell(line: str) -> list[str]:
    """A wrapper that runs the agent (``"$@"``) inside a shell line."""
    return ["/bin/sh", "-c", line, "sh"]


def huge_line_text_size(session_id: str, size: int) -> int:
    """The text length the scripted agent pads a ``huge_line`` of ``size`` bytes to."""
    empty = {
        "jsonrpc": "2.0",
        "method": "session/update",
        "params": {
            "sessionId": session_id,
            "update": {
                "sessionUpdate": "agent_message_chunk",
                "content": {"type": "text", "text": ""},
            },
        },
    }
    return size - len(orjson.dumps(empty)) - 1


# --------------------------------------------------------------------------- crashes and exits


async def test_crash_mid_turn_raises_agent_exited(tmp_path: Path) -> None:
    """A crash mid-turn fails the prompt with AgentExited: name, exit status, stderr tail."""
    script = turns(Say("working"), Crash(exit_code=3, stderr="fatal: model quota exceeded"))
    async with agent(script, tmp_path) as conn:
        pid = conn.pid
        session = await conn.new_session(tmp_path)
        with pytest.raises(AgentExited) as info:
            await session.prompt("go")
        with pytest.raises(AgentExited):
            await conn.new_session(tmp_path)
    error = info.value
    assert isinstance(error, ConnectionClosed)
    assert error.peer == AGENT
    assert AGENT in str(error)
    assert error.exit_status == 3
    assert "fatal: model quota exceeded" in error.stderr_tail
    assert pid is not None
    assert pid_gone(pid)


@pytest.mark.parametrize("limit", ["max_requests_in_flight", "max_unsent_bytes"])
async def test_an_agent_flooding_requests_it_never_reads_is_cut_off(
    limit: str, tmp_path: Path
) -> None:
    """An agent that stops reading and floods requests is cut off past either bound: the turn
    fails with BacklogExceeded naming the limit, every later call too, and its process ends
    with the block (an unbounded client grew by kilobytes per answer and never let go)."""
    script = turns(Say("reading"), FloodRequests(20_000, params={"path": "f.txt"}))
    options = (
        ClientOptions(max_requests_in_flight=300)
        if limit == "max_requests_in_flight"
        else ClientOptions(max_unsent_bytes=300)
    )
    async with agent(script, tmp_path, options=options) as conn:
        pid = conn.pid
        session = await conn.new_session(tmp_path)
        with pytest.raises(BacklogExceeded) as info:
            await session.prompt("go")
        with pytest.raises(BacklogExceeded):
            await conn.new_session(tmp_path)
    error = info.value
    assert (error.peer, error.limit, error.value) == (AGENT, limit, 300)
    assert str(error).startswith(f"{AGENT}: stopped: ")
    assert str(error).endswith(f", over the limit {limit} = 300")
    assert pid is not None
    assert pid_gone(pid)


@pytest.mark.parametrize("wait_for_initialize", [True, False])
async def test_exit_before_initialize_is_a_start_error(
    wait_for_initialize: bool, tmp_path: Path
) -> None:
    """An agent that exits before answering initialize raises AgentStartError naming it."""
    script = AgentScript(
        exit_at_start=ExitAtStart(
            exit_code=2,
            stderr="error: no API key configured",
            wait_for_initialize=wait_for_initialize,
        )
    )
    with pytest.raises(AgentStartError) as info:
        async with agent(script, tmp_path):
            pytest.fail("the agent completed initialize")
    assert info.value.agent == AGENT
    assert "no API key configured" in str(info.value)
    cause = info.value.__cause__
    assert isinstance(cause, AgentExited)
    assert cause.exit_status == 2


async def test_agent_that_never_answers_initialize(tmp_path: Path) -> None:
    """No answer to initialize within init_timeout raises AgentStartError."""
    script = AgentScript(initialize_delay=60)
    start = trio.current_time()
    with pytest.raises(AgentStartError, match=r"no answer to initialize within 0\.5s") as info:
        async with agent(script, tmp_path, options=ClientOptions(init_timeout=0.5)):
            pytest.fail("the agent completed initialize")
    assert info.value.agent == AGENT
    assert trio.current_time() - start < PROMPTLY


# --------------------------------------------------------------------------- junk on the wire


async def test_malformed_lines_mid_turn_do_not_end_it(tmp_path: Path) -> None:
    """Lines that are not JSON or not JSON-RPC are answered with errors; the turn completes."""
    script, record_path = recorded(
        turns(Say("a"), Raw("{this is not json"), Raw("[1, 2]"), Say("b")), tmp_path
    )
    async with agent(script, tmp_path) as conn:
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert (result.stop_reason, result.text) == ("end_turn", "ab")
    record = AgentRecord.from_jsonl(record_path)
    errors = [e["message"] for e in record.of("recv") if "error" in e["message"]]
    assert [(e["id"], e["error"]["code"]) for e in errors] == [(None, -32700), (None, -32600)]


async def test_ten_megabyte_line_is_delivered(tmp_path: Path) -> None:
    """A 10 MB update line arrives whole, as text of that size."""
    size = 10 * 2**20
    async with agent(turns(HugeLine(size), Say("!")), tmp_path) as conn:
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    text_size = huge_line_text_size(session.session_id, size)
    assert text_size > size - 200
    assert len(result.text) == text_size + 1
    assert result.text == "x" * text_size + "!"


async def test_line_over_the_limit_is_dropped_and_the_connection_lives(tmp_path: Path) -> None:
    """A line over max_message_size is dropped; the turn and the next one complete."""
    command = scripted_agent_command(turns(Say("a"), HugeLine(2 * 2**20), Say("b")), tmp_path)
    with trio.fail_after(LIMIT):
        async with open_agent(
            command, name=AGENT, term_grace=GRACE, max_message_size=2**20
        ) as conn:
            session = await conn.new_session(tmp_path)
            first = await session.prompt("go")
            second = await session.prompt("again")
            dropped = conn.rpc.statistics().oversized_dropped
    assert (first.stop_reason, first.text) == ("end_turn", "ab")
    assert second.text == "ab"
    assert dropped == 2


async def test_line_over_the_limit_of_a_stream_connection(
    tmp_path: Path, agent_pids: list[int]
) -> None:
    """open_agent_on_stream over a process's pipes applies its max_message_size too."""
    command = scripted_agent_command(turns(Say("a"), HugeLine(2 * 2**20), Say("b")), tmp_path)
    with trio.fail_after(LIMIT):
        async with open_agent_process(
            command, name=AGENT, stdin_close_grace=GRACE, term_grace=GRACE
        ) as proc:
            agent_pids.append(proc.pid)
            async with open_agent_on_stream(
                proc.stream, name=AGENT, close_error=proc.exit_error, max_message_size=2**20
            ) as conn:
                session = await conn.new_session(tmp_path)
                result = await session.prompt("go")
                dropped = conn.rpc.statistics().oversized_dropped
    assert (result.text, dropped) == ("ab", 1)


async def test_a_connection_opened_by_a_cancelled_caller_ends_at_once(
    tmp_path: Path, agent_pids: list[int]
) -> None:
    """A caller cancelled before the connection's read loop started (cancelled while its agent
    was being spawned, which no checkpoint saw) leaves with Cancelled at once: the read loop,
    shielded once started, must not keep it waiting on an agent that says nothing."""
    command = scripted_agent_command(turns(Say("a")), tmp_path)
    left = trio.Event()
    with trio.fail_after(LIMIT):
        async with open_agent_process(
            command, name=AGENT, stdin_close_grace=GRACE, term_grace=GRACE
        ) as proc:
            agent_pids.append(proc.pid)

            async def open_cancelled() -> None:
                with trio.CancelScope() as scope:
                    scope.cancel()
                    try:
                        async with open_agent_on_stream(
                            proc.stream, name=AGENT, close_error=proc.exit_error
                        ):
                            pytest.fail("initialized although cancelled")
                    except AgentExited:
                        return  # killed below, having kept waiting: the failure is below
                assert scope.cancelled_caught
                left.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(open_cancelled)
                with trio.move_on_after(PROMPTLY):
                    await left.wait()
                ended = left.is_set()
                if not ended:  # the only way out of a shielded read: the agent's end
                    os.kill(proc.pid, signal.SIGKILL)
    assert ended, "the cancelled caller kept waiting on the connection's read loop"


async def test_unknown_request_mid_turn_is_answered_and_the_turn_completes(
    tmp_path: Path,
) -> None:
    """An undeclared agent request mid-turn is answered -32601 and the turn goes on."""
    request = Request("craft/drainMidTurnQueue", {"sessionId": "sess-1"})
    script, record_path = recorded(turns(Say("before "), request, Say("after")), tmp_path)
    async with agent(script, tmp_path) as conn:
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert (result.stop_reason, result.text) == ("end_turn", "before after")
    [answer] = AgentRecord.from_jsonl(record_path).of("request")
    assert answer["error"]["code"] == -32601


async def test_string_request_ids_are_echoed(tmp_path: Path) -> None:
    """An agent numbering its requests with strings gets its exact ids back."""
    steps = (
        AskPermission(PermissionToolCall("t1"), on_reject="continue"),
        Request("craft/drainMidTurnQueue"),
        Say("ok"),
    )
    script, record_path = recorded(turns(*steps, id_style="string"), tmp_path)
    async with agent(script, tmp_path) as conn:
        session = await conn.new_session(tmp_path)
        result = await session.prompt("go")
    assert result.text == "ok"
    record = AgentRecord.from_jsonl(record_path)
    ids = [e["id"] for e in record.of("response")]
    assert len(ids) == 2
    assert all(isinstance(i, str) for i in ids)
    assert record.of("unexpected_response") == []


# --------------------------------------------------------------------------- stalls and EOF


async def test_stall_past_the_timeout_raises_turn_timeout(tmp_path: Path) -> None:
    """A turn stalling past prompt(timeout=...) is cancelled, TurnTimeout raised, agent stopped."""
    async with agent(turns(Say("thinking"), Stall()), tmp_path) as conn:
        pid = conn.pid
        assert pid is not None
        session = await conn.new_session(tmp_path)
        start = trio.current_time()
        with pytest.raises(TurnTimeout):
            await session.prompt("go", timeout=0.5)
        assert 0.5 <= trio.current_time() - start < PROMPTLY
        assert not pid_gone(pid)
    assert pid_gone(pid)


async def test_agent_ignoring_cancel_and_stdin_close_is_killed_on_exit(tmp_path: Path) -> None:
    """A hung agent that outlives its stdin is killed, children included, when the block ends."""
    script = AgentScript(turns=(ScriptTurn(steps=(Stall(),), ignore_cancel=True),))
    options = ClientOptions(cancel_grace=0.3)
    # the shell waits on: closing stdin ends the scripted agent, not the shell
    async with agent(script, tmp_path, options=options, wrapper=shell('"$@"; sleep 60')) as conn:
        pid = conn.pid
        assert pid is not None
        session = await conn.new_session(tmp_path)
        with pytest.raises(AgentHung, match=r"no response 0\.3s after session/cancel"):
            await session.prompt("go", timeout=0.3)
        children = descendants(pid)
        assert len(children) == 1
        start = trio.current_time()
    assert trio.current_time() - start < 2 * GRACE + PROMPTLY
    assert pid_gone(pid)
    assert await lingering(children | live_group(pid)) == set()


async def test_eof_fails_every_pending_call_promptly(tmp_path: Path) -> None:
    """When the agent dies with prompts pending, each of them fails with AgentExited at once."""
    script = AgentScript(
        turns=(
            ScriptTurn(steps=(Crash(exit_code=0, stderr="bye"),), when_prompt_contains="crash"),
            ScriptTurn(steps=(Say("started"), Stall())),
        )
    )
    errors: list[AgentExited] = []
    started: list[t.SessionUpdate] = []
    both_started = trio.Event()

    def on_update(update: t.SessionUpdate) -> None:
        started.append(update)
        if len(started) == 2:
            both_started.set()

    async with agent(script, tmp_path) as conn:
        sessions = [await conn.new_session(tmp_path) for _ in range(3)]

        async def run(index: int, text: str) -> None:
            try:
                await sessions[index].prompt(text, on_update=on_update)
            except AgentExited as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, 0, "wait")
            nursery.start_soon(run, 1, "wait")
            await both_started.wait()
            start = trio.current_time()
            nursery.start_soon(run, 2, "crash now")
        elapsed = trio.current_time() - start
        with pytest.raises(AgentExited):
            await conn.new_session(tmp_path)
    assert len(errors) == 3
    assert elapsed < PROMPTLY
    assert all(e.exit_status == 0 and "bye" in e.stderr_tail for e in errors)


async def test_stdout_closed_while_the_agent_lives_fails_pending_calls(tmp_path: Path) -> None:
    """EOF on stdout from a process still running fails the pending prompt promptly."""
    script = turns(Say("working"), Crash(exit_code=0))
    # the agent ends, the shell closes the pipe it holds and lives on with a child
    wrapper = shell('"$@"; exec >&-; sleep 60')
    async with agent(script, tmp_path, wrapper=wrapper) as conn:
        pid = conn.pid
        assert pid is not None
        session = await conn.new_session(tmp_path)
        start = trio.current_time()
        with pytest.raises(AgentExited) as info:
            await session.prompt("go")
        assert trio.current_time() - start < PROMPTLY
        children = descendants(pid)
        assert len(children) == 1  # sleep 60
    assert info.value.exit_status is None  # stdout ended, the process did not
    assert pid_gone(pid)
    assert await lingering(children) == set()


async def test_cancelled_scope_around_a_running_turn_leaves_no_process(tmp_path: Path) -> None:
    """Cancelling the scope around open_agent mid-turn stops the agent process."""
    pid: int | None = None
    with trio.fail_after(LIMIT), trio.CancelScope() as scope:
        async with agent(turns(Say("working"), Stall()), tmp_path) as conn:
            pid = conn.pid
            session = await conn.new_session(tmp_path)
            await session.prompt("go", on_update=lambda update: scope.cancel())
            pytest.fail("the prompt outlived the cancelled scope")
    assert scope.cancelled_caught
    assert pid is not None
    assert pid_gone(pid)


async def test_cancelled_scope_ends_the_turn_before_the_shutdown_ladder(tmp_path: Path) -> None:
    """Cancelled mid-turn: session/cancel, the agent ends the turn, then stdin closes; no signal."""
    script, path = recorded(turns(Say("working"), Stall()), tmp_path)
    process: AgentProcess | None = None
    with trio.CancelScope() as scope:
        async with agent(script, tmp_path) as conn:
            process = conn.process
            session = await conn.new_session(tmp_path)
            await session.prompt("go", on_update=lambda update: scope.cancel())
    assert scope.cancelled_caught
    assert process is not None
    assert process.returncode == 0  # it exited by itself when its stdin closed
    seen = timeline(path)
    assert "recv $/cancel_request" not in seen
    assert seen.index("recv session/cancel") < seen.index("turn_end") < seen.index("eof")
    result = session.last_result
    assert result is not None
    assert (result.stop_reason, result.text) == ("cancelled", "working")


async def test_cancelled_scope_kills_an_agent_ignoring_cancel_after_the_grace(
    tmp_path: Path,
) -> None:
    """An agent ignoring session/cancel gets the interrupt grace, then the ladder kills it."""
    base = AgentScript(turns=(ScriptTurn(steps=(Say("working"), Stall()), ignore_cancel=True),))
    script, path = recorded(base, tmp_path)
    options = ClientOptions(interrupt_grace=0.5)
    wrapper = shell('"$@"; sleep 60')  # closing stdin ends the agent, not the shell
    with trio.CancelScope() as scope:
        async with agent(script, tmp_path, options=options, wrapper=wrapper) as conn:
            pid = conn.pid
            assert pid is not None
            session = await conn.new_session(tmp_path)
            children = descendants(pid)
            start = trio.current_time()
            await session.prompt("go", on_update=lambda update: scope.cancel())
    elapsed = trio.current_time() - start
    assert scope.cancelled_caught
    assert pid is not None
    assert 0.5 <= elapsed < 0.5 + 2 * GRACE + PROMPTLY
    assert pid_gone(pid)
    assert await lingering(children | live_group(pid)) == set()
    seen = timeline(path)
    assert "recv $/cancel_request" not in seen
    assert "turn_end" not in seen
    assert seen.index("recv session/cancel") < seen.index("eof")
    result = session.last_result
    assert result is not None
    assert (result.stop_reason, result.text) == (None, "working")
