"""Tests for orchestrator.agent.terminals: real child processes, every wait bounded."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from log_capture import capture_logs

import orchestrator.agent.terminals as terminals_module
from orchestrator.agent.services import ClientServices, SessionContext
from orchestrator.agent.terminals import (
    OutputBuffer,
    ProcessTerminalService,
    open_terminal_service,
    terminal_environment,
)
from orchestrator.errors import CommandRefused, InvalidParams, InvalidRequest, ResourceNotFound
from orchestrator.protocol import types as t

PY = sys.executable
SPAWN_TREE = str(Path(__file__).parent / "helpers" / "spawn_tree.py")


@pytest.fixture
def ctx(tmp_path: Path) -> SessionContext:
    """A session whose working directory is a fresh project directory."""
    root = tmp_path / "project"
    root.mkdir()
    return SessionContext(agent="tester", session_id="s1", cwd=str(root))


@asynccontextmanager
async def service(**options: Any) -> AsyncIterator[ProcessTerminalService]:
    """A terminal service with a short kill grace, bounded in time."""
    options.setdefault("kill_grace", 0.2)
    with trio.fail_after(20):
        async with open_terminal_service(**options) as terminals:
            yield terminals


async def create(
    terminals: ProcessTerminalService,
    ctx: SessionContext,
    command: str,
    args: list[str] | None = None,
    **fields: Any,
) -> str:
    """Start a terminal and return its id."""
    request = t.CreateTerminalRequest(
        session_id=ctx.session_id, command=command, args=args, **fields
    )
    return (await terminals.create(request, ctx)).terminal_id


async def output(
    terminals: ProcessTerminalService, ctx: SessionContext, terminal_id: str
) -> t.TerminalOutputResponse:
    """terminal/output."""
    request = t.TerminalOutputRequest(session_id=ctx.session_id, terminal_id=terminal_id)
    return await terminals.output(request, ctx)


async def wait(
    terminals: ProcessTerminalService, ctx: SessionContext, terminal_id: str
) -> t.WaitForTerminalExitResponse:
    """terminal/wait_for_exit."""
    request = t.WaitForTerminalExitRequest(session_id=ctx.session_id, terminal_id=terminal_id)
    return await terminals.wait_for_exit(request, ctx)


async def kill(terminals: ProcessTerminalService, ctx: SessionContext, terminal_id: str) -> None:
    """terminal/kill."""
    request = t.KillTerminalRequest(session_id=ctx.session_id, terminal_id=terminal_id)
    await terminals.kill(request, ctx)


async def release(terminals: ProcessTerminalService, ctx: SessionContext, terminal_id: str) -> None:
    """terminal/release."""
    request = t.ReleaseTerminalRequest(session_id=ctx.session_id, terminal_id=terminal_id)
    await terminals.release(request, ctx)


async def run(
    terminals: ProcessTerminalService, ctx: SessionContext, command: str, **kw: Any
) -> str:
    """Run a command to completion and return its output."""
    terminal_id = await create(terminals, ctx, command, **kw)
    await wait(terminals, ctx, terminal_id)
    return (await output(terminals, ctx, terminal_id)).output


async def output_line(terminals: ProcessTerminalService, ctx: SessionContext, tid: str) -> str:
    """Poll until the terminal printed a whole line; return it."""
    # Polling is the protocol's own way: terminal/output has no "wait for more".
    while "\n" not in (text := (await output(terminals, ctx, tid)).output):  # noqa: ASYNC110
        await trio.sleep(0.02)
    return text.split("\n", 1)[0]


# pid 1 here may not reap orphans, so a zombie counts as gone; the start time guards against reuse.
def _stat(pid: int) -> list[str] | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None


def snapshot(pids: list[int]) -> dict[int, str]:
    """Map the pids that are running now to their start times."""
    stats = {pid: _stat(pid) for pid in pids}
    return {pid: s[19] for pid, s in stats.items() if s is not None and s[0] not in "ZX"}


def alive(pids: dict[int, str]) -> list[int]:
    """The pids still running (not zombies, same start time)."""
    live = []
    for pid, started in pids.items():
        stat = _stat(pid)
        if stat is not None and stat[19] == started and stat[0] not in "ZX":
            live.append(pid)
    return live


async def assert_gone(pids: dict[int, str], within: float = 3.0) -> None:
    """Every pid is dead or a zombie within ``within`` seconds."""
    # Polling: nothing signals the death of a process that is not our child.
    with trio.move_on_after(within):
        while alive(pids):  # noqa: ASYNC110
            await trio.sleep(0.02)
    assert not alive(pids), f"still alive: {alive(pids)}"


async def spawn_tree(
    terminals: ProcessTerminalService, ctx: SessionContext
) -> tuple[str, dict[int, str]]:
    """Start spawn_tree.py (7 processes, some ignoring SIGTERM) and return its id and pids."""
    tid = await create(terminals, ctx, PY, [SPAWN_TREE, "--leader", "ignore-term"])
    report = json.loads(await output_line(terminals, ctx, tid))
    pids = snapshot([report["leader"], *report["descendants"]])
    assert len(pids) >= 6  # child 2 exits at once (maybe not yet), orphaning its grandchild
    return tid, pids


# --------------------------------------------------------------------------- output buffer


def test_output_buffer_keeps_the_end_at_a_character_boundary() -> None:
    """Over the limit the oldest bytes go, and the text starts on a whole character."""
    buffer = OutputBuffer(10)
    buffer.feed(("start" + "é" * 20 + "END").encode())
    assert buffer.text(final=True) == ("éééEND", True)


def test_output_buffer_holds_back_an_incomplete_character() -> None:
    """A character split across reads shows up whole once its last byte arrives."""
    buffer = OutputBuffer(100)
    data = "a€".encode()
    buffer.feed(data[:2])
    assert buffer.text(final=False) == ("a", False)
    buffer.feed(data[2:])
    assert buffer.text(final=False) == ("a€", False)


def test_output_buffer_invalid_bytes_stay_within_the_limit() -> None:
    """Replacement characters for invalid bytes never push the text over the limit."""
    buffer = OutputBuffer(4)
    buffer.feed(b"\xff\xfe\xfd\xfc")
    text, truncated = buffer.text(final=True)
    assert len(text.encode()) <= 4
    assert truncated


def test_terminal_environment_is_an_allowlist() -> None:
    """Only the basic variables get in, whatever the others are called; passthrough adds."""
    environ = {
        "PATH": "/bin",
        "HOME": "/h",
        "LANG": "C.UTF-8",
        "LC_ALL": "C",
        "LC_SECRET_TOKEN": "x",  # no locale category, and a secret
        "LC_MADEUP": "x",
        "TERM": "xterm",
        "TMPDIR": "/tmp",
        "USER": "u",
        "OPENAI_API_KEY": "x",
        "GITHUB_TOKEN": "x",
        "MYSQL_PWD": "x",
        "MY_DB_PASS": "x",
        "SLACK_WEBHOOK_URL": "https://hooks.slack.com/x",
        "HTTPS_PROXY": "http://user:pass@proxy:3128",
        "AWS_REGION": "eu",
        "SSH_AUTH_SOCK": "/s",
        "EDITOR": "vi",
    }
    kept = terminal_environment(environ, passthrough=["aws_region", "MY_DB_*"])
    basic = ["HOME", "LANG", "LC_ALL", "PATH", "TERM", "TMPDIR", "USER"]
    assert sorted(kept) == sorted([*basic, "AWS_REGION", "MY_DB_PASS"])
    assert sorted(terminal_environment(environ)) == basic


# --------------------------------------------------------------------------- commands


async def test_shell_line_and_command_with_args(ctx: SessionContext) -> None:
    """A line without args runs through /bin/sh; command + args is executed as is."""
    async with service() as terminals:
        assert await run(terminals, ctx, "echo $((1 + 2)) && echo ok") == "3\nok\n"
        literal = await run(terminals, ctx, "printf", args=["%s|", "a b", "$HOME", ";ls"])
        assert literal == "a b|$HOME|;ls|"


async def test_exit_code_output_and_default_cwd(ctx: SessionContext) -> None:
    """The exit code is reported; stdout and stderr interleave; cwd defaults to the session's."""
    async with service() as terminals:
        tid = await create(terminals, ctx, "pwd; echo oops >&2; exit 3")
        assert await wait(terminals, ctx, tid) == t.WaitForTerminalExitResponse(exit_code=3)
        result = await output(terminals, ctx, tid)
        assert result.output == f"{os.path.realpath(ctx.cwd)}\noops\n"
        assert not result.truncated
        assert result.exit_status == t.TerminalExitStatus(exit_code=3)


async def test_output_over_limit_keeps_the_end(ctx: SessionContext) -> None:
    """Output beyond outputByteLimit keeps the end, cut at a UTF-8 character boundary."""
    script = "import sys; sys.stdout.write('start' + 'é' * 5000 + 'END')"
    async with service() as terminals:
        tid = await create(terminals, ctx, PY, ["-c", script], output_byte_limit=11)
        await wait(terminals, ctx, tid)
        result = await output(terminals, ctx, tid)
        assert result.output == "ééééEND"
        assert result.truncated
        assert len(result.output.encode()) <= 11


async def test_wait_reports_signals(ctx: SessionContext) -> None:
    """A command killed by a signal reports the signal's name, not an exit code."""
    async with service() as terminals:
        tid = await create(terminals, ctx, "kill -TERM $$")
        assert await wait(terminals, ctx, tid) == t.WaitForTerminalExitResponse(signal="SIGTERM")
    async with service(kill_grace=0) as terminals:
        tid = await create(terminals, ctx, "sleep 60")
        await kill(terminals, ctx, tid)
        assert await wait(terminals, ctx, tid) == t.WaitForTerminalExitResponse(signal="SIGKILL")


async def test_kill_keeps_the_id_and_release_frees_it(ctx: SessionContext) -> None:
    """After kill the output and status are still there; after release the id is unknown."""
    async with service() as terminals:
        tid = await create(terminals, ctx, "echo started; sleep 60")
        assert await output_line(terminals, ctx, tid) == "started"
        await kill(terminals, ctx, tid)
        result = await output(terminals, ctx, tid)
        assert result.output == "started\n"
        assert result.exit_status is not None
        assert result.exit_status.signal == "SIGTERM"
        await release(terminals, ctx, tid)
        with pytest.raises(ResourceNotFound):
            await output(terminals, ctx, tid)
        with pytest.raises(ResourceNotFound):
            await release(terminals, ctx, tid)
        assert terminals.terminal_ids() == []


async def test_release_kills_the_whole_tree(ctx: SessionContext) -> None:
    """Releasing a command that spawned children leaves no process of its tree alive."""
    async with service() as terminals:
        tid, pids = await spawn_tree(terminals, ctx)
        await release(terminals, ctx, tid)
        await assert_gone(pids)


async def test_background_children_live_until_release(ctx: SessionContext) -> None:
    """A command's background child survives the command's exit, and dies on release."""
    async with service() as terminals:
        tid = await create(terminals, ctx, "sleep 60 & echo $!")
        pid = int(await output_line(terminals, ctx, tid))
        pids = snapshot([pid])
        assert list(pids) == [pid]
        assert await wait(terminals, ctx, tid) == t.WaitForTerminalExitResponse(exit_code=0)
        assert alive(pids) == [pid]
        await release(terminals, ctx, tid)
        await assert_gone(pids)


async def test_leaving_the_service_kills_everything(ctx: SessionContext) -> None:
    """Leaving the service context, normally or by cancellation, kills every terminal."""
    async with service() as terminals:
        _, tree = await spawn_tree(terminals, ctx)
        tid = await create(terminals, ctx, "echo $$; exec sleep 60")
        sleeper = snapshot([int(await output_line(terminals, ctx, tid))])
        assert len(sleeper) == 1
    await assert_gone(tree | sleeper)
    with trio.move_on_after(10) as outer:
        async with service() as terminals:
            _, tree = await spawn_tree(terminals, ctx)
            outer.cancel()  # as on Ctrl-C
            await trio.sleep_forever()
    await assert_gone(tree)


async def test_release_session_and_kill_session(ctx: SessionContext) -> None:
    """Session-wide kill keeps the ids; session-wide release frees them."""
    other = SessionContext(agent="tester", session_id="s2", cwd=ctx.cwd)
    async with service() as terminals:
        mine = [await create(terminals, ctx, "sleep 60") for _ in range(2)]
        theirs = await create(terminals, other, "sleep 60")
        await terminals.kill_session("s1")
        assert sorted(terminals.terminal_ids("s1")) == sorted(mine)
        assert (await output(terminals, ctx, mine[0])).exit_status is not None
        await terminals.release_session("s1")
        assert terminals.terminal_ids() == [theirs]
        assert (await output(terminals, other, theirs)).exit_status is None


async def test_a_cancelled_session_starts_no_command_until_its_next_turn(
    ctx: SessionContext,
) -> None:
    """After kill_session (session/cancel) a create is refused: the command would outlive the
    kill and hold the turn; the session's next turn (reopen_session) may start commands."""
    async with service() as terminals:
        await terminals.kill_session("s1")
        with pytest.raises(InvalidRequest, match="being cancelled"):
            await create(terminals, ctx, "sleep 60")
        assert terminals.terminal_ids("s1") == []
        terminals.reopen_session("s1")
        assert await run(terminals, ctx, "echo again") == "again\n"


# --------------------------------------------------------------------------- refusals


async def test_cwd_must_lie_inside_the_session(ctx: SessionContext, tmp_path: Path) -> None:
    """A cwd outside the session directory (directly or by symlink) is refused."""
    (Path(ctx.cwd) / "sub").mkdir()
    (Path(ctx.cwd) / "link").symlink_to(tmp_path)
    async with service() as terminals:
        assert await run(terminals, ctx, "pwd", cwd="sub") == f"{os.path.realpath(ctx.cwd)}/sub\n"
        for cwd in ("/", "..", str(tmp_path), "link", "missing"):
            with pytest.raises(InvalidParams):
                await create(terminals, ctx, "pwd", cwd=cwd)
        assert terminals.terminal_ids() == ["term-1"]


async def test_env_is_an_allowlist_merged_with_the_request(
    ctx: SessionContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The orchestrator's other variables stay out; passed, configured and requested get in."""
    monkeypatch.setenv("ORCH_TEST_API_KEY", "leak")
    monkeypatch.setenv("ORCH_TEST_TOKEN", "leak")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "leak")
    monkeypatch.setenv("MYSQL_PWD", "leak")
    monkeypatch.setenv("MY_DB_PASS", "leak")
    monkeypatch.setenv("SLACK_WEBHOOK_URL", "https://hooks.slack.com/services/leak")
    monkeypatch.setenv("HTTPS_PROXY", "http://user:leak@proxy:3128")
    monkeypatch.setenv("ORCH_TEST_PLAIN", "leak")
    monkeypatch.setenv("ORCH_TEST_PASS_TOKEN", "allowed")
    env = [
        t.EnvVariable(name="FROM_AGENT", value="agent"),
        t.EnvVariable(name="X_TOKEN", value="a"),
    ]
    async with service(env_passthrough=["ORCH_TEST_PASS_*"], extra_env={"EXTRA": "1"}) as terminals:
        text = await run(terminals, ctx, "env", env=env)
    variables = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert "leak" not in text
    assert variables["ORCH_TEST_PASS_TOKEN"] == "allowed"
    assert (variables["EXTRA"], variables["FROM_AGENT"], variables["X_TOKEN"]) == (
        "1",
        "agent",
        "a",
    )
    assert variables["PATH"] == os.environ["PATH"]


async def test_concurrent_limit_per_session(ctx: SessionContext) -> None:
    """A session holds at most max_per_session terminals until it releases one."""
    other = SessionContext(agent="tester", session_id="s2", cwd=ctx.cwd)
    async with service(max_per_session=2) as terminals:
        first = await create(terminals, ctx, "sleep 60")
        await create(terminals, ctx, "sleep 60")
        with pytest.raises(InvalidRequest, match="too many terminals"):
            await create(terminals, ctx, "sleep 60")
        await create(terminals, other, "sleep 60")
        await release(terminals, ctx, first)
        await create(terminals, ctx, "true")


async def test_concurrent_creates_respect_the_limit(ctx: SessionContext) -> None:
    """Creates racing each other cannot exceed the per-session limit."""
    results: list[str] = []

    async def try_create(terminals: ProcessTerminalService) -> None:
        try:
            results.append(await create(terminals, ctx, "sleep 60"))
        except InvalidRequest:
            results.append("refused")

    async with service(max_per_session=2) as terminals:
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(try_create, terminals)
        assert sorted(results) == ["refused", "term-1", "term-2"]


async def test_without_pidfd_leftovers_die_with_the_command(
    ctx: SessionContext, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where pidfds are missing the command is reaped at exit and its leftovers killed then."""
    monkeypatch.setattr(terminals_module, "_pidfd", lambda pid: None)
    async with service() as terminals:
        tid = await create(terminals, ctx, "sleep 60 & echo $!; exit 4")
        pids = snapshot([int(await output_line(terminals, ctx, tid))])
        assert await wait(terminals, ctx, tid) == t.WaitForTerminalExitResponse(exit_code=4)
        await assert_gone(pids)
        tid, tree = await spawn_tree(terminals, ctx)
        await release(terminals, ctx, tid)
        await assert_gone(tree)


async def test_command_check_and_unknown_things(ctx: SessionContext) -> None:
    """The policy hook can refuse a command; unknown terminals and programs are not found."""
    seen: list[str] = []

    def check(line: str, env: Any, context: SessionContext) -> Any:
        seen.append(line)
        return "reject" if "rm" in line else "allow"

    other = SessionContext(agent="tester", session_id="s2", cwd=ctx.cwd)
    async with service(command_check=check) as terminals:
        with pytest.raises(CommandRefused, match="rejected by policy"):
            await create(terminals, ctx, "rm -rf /tmp/x")
        tid = await create(terminals, ctx, "echo", ["a b"])
        with pytest.raises(ResourceNotFound):  # a program of that name: quoted for the check
            await create(terminals, ctx, "FOO=1", ["ls"])
        assert seen == ["rm -rf /tmp/x", "echo 'a b'", "'FOO=1' ls"]
        with pytest.raises(ResourceNotFound):
            await output(terminals, other, tid)  # another session's terminal
        with pytest.raises(ResourceNotFound, match="command not found"):
            await create(terminals, ctx, "no-such-program-xyz", ["x"])
        no_such = await create(terminals, ctx, "no-such-program-xyz")
        assert (await wait(terminals, ctx, no_such)).exit_code == 127
        with pytest.raises(InvalidParams):
            await create(terminals, ctx, "  ")


async def test_command_check_sees_the_env_the_process_gets(ctx: SessionContext) -> None:
    """The check gets the request's env as it will be set; a bad name is refused before it."""
    seen: list[dict[str, str]] = []

    def check(line: str, env: Any, context: SessionContext) -> Any:
        seen.append(dict(env))
        return "reject" if "PATH" in env else "allow"

    twice = [t.EnvVariable(name="A", value="1"), t.EnvVariable(name="A", value="2")]
    async with service(command_check=check) as terminals:
        assert await run(terminals, ctx, 'echo "$A"', env=twice) == "2\n"
        with pytest.raises(CommandRefused):
            await create(terminals, ctx, "ls", env=[t.EnvVariable(name="PATH", value="/x")])
        with pytest.raises(InvalidParams, match="bad environment variable"):
            await create(terminals, ctx, "ls", env=[t.EnvVariable(name="A=B", value="x")])
        assert terminals.terminal_ids() == ["term-1"]
    assert seen == [{"A": "2"}, {"PATH": "/x"}]


async def test_on_exit_hook(ctx: SessionContext) -> None:
    """on_exit runs after each command, before wait_for_exit returns; its failures are logged."""
    calls: list[tuple[str, str, t.TerminalExitStatus]] = []

    async def on_exit(
        context: SessionContext, terminal_id: str, status: t.TerminalExitStatus
    ) -> None:
        await trio.sleep(0.05)
        calls.append((context.session_id, terminal_id, status))
        if status.exit_code == 1:
            raise RuntimeError("harvest failed")

    async with service(on_exit=on_exit) as terminals:
        tid = await create(terminals, ctx, "exit 0")
        await wait(terminals, ctx, tid)
        assert calls == [("s1", tid, t.TerminalExitStatus(exit_code=0))]
        with capture_logs() as logs:
            failing = await create(terminals, ctx, "exit 1")
            assert (await wait(terminals, ctx, failing)).exit_code == 1
        failed = "the follow-up of a finished terminal command failed"
        assert any(entry["event"] == failed for entry in logs)


async def test_errors_from_the_block_come_out_unwrapped(ctx: SessionContext) -> None:
    """An exception raised in the service block is not wrapped in an exception group."""

    async def fail_inside() -> None:
        async with service() as terminals:
            await create(terminals, ctx, "sleep 60")
            raise KeyError("boom")

    with pytest.raises(KeyError):
        await fail_inside()


async def test_installs_in_client_services(ctx: SessionContext) -> None:
    """The service plugs into ClientServices and turns the terminal capability on."""
    async with service() as terminals:
        assert ClientServices(terminal=terminals).capabilities().terminal is True
