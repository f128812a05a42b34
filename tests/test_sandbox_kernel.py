"""The launcher and the process layer against the real kernel's Landlock.

Each test runs real processes confined by the launcher (``orchestrator/_landlock.py``) and
checks what the kernel lets them do: write where the rules allow and nowhere else (EACCES),
connect only to the listed TCP ports, signal nothing outside their sandbox. The launcher that
cannot confine exits without running the command.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from run_helpers import landlock_missing

from orchestrator._landlock import EXIT_UNCONFINED, LAUNCHER
from orchestrator.agent.process import open_agent_process
from orchestrator.agent.services import SessionContext
from orchestrator.agent.terminals import open_terminal_service
from orchestrator.agents import AgentSpec
from orchestrator.errors import AgentStartError, ResourceNotFound
from orchestrator.protocol import types as t
from orchestrator.sandbox import Sandbox, build_ruleset, kernel_abi
from orchestrator.supervisor import Limits, open_supervisor
from orchestrator.testing import AgentScript, Say, Turn, scripted_agent_command

pytestmark = pytest.mark.skipif(landlock_missing() is not None, reason=str(landlock_missing()))

#: prints the errno of writing each path given (0: written)
WRITE_PROBE = """\
import sys
for path in sys.argv[1:]:
    try:
        with open(path, "w") as f:
            f.write("x")
        print(0)
    except OSError as e:
        print(e.errno)
"""

#: prints the errno of reading each path given (0: read)
READ_PROBE = """\
import sys
for path in sys.argv[1:]:
    try:
        open(path).read()
        print(0)
    except OSError as e:
        print(e.errno)
"""


def confined(argv: list[str], writable: list[Path], sandbox: Sandbox | None = None) -> list[str]:
    """``argv`` behind the launcher, writable only beneath ``writable``."""
    rules = build_ruleset(
        sandbox or Sandbox(), abi=kernel_abi(), writable=[str(p) for p in writable]
    )
    return rules.command(argv)


def run(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run to the end, capturing text output."""
    return subprocess.run(argv, capture_output=True, text=True, check=False, timeout=60)


def test_writes_only_beneath_the_writable_paths(tmp_path: Path) -> None:
    """Inside: written. Beside it, or above it: EACCES from the kernel. Devices still work."""
    inside, beside = tmp_path / "inside", tmp_path / "beside"
    inside.mkdir()
    beside.mkdir()
    targets = [inside / "a", beside / "b", tmp_path / "c", "/dev/null"]
    done = run(confined([sys.executable, "-c", WRITE_PROBE, *map(str, targets)], [inside]))
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["0", "13", "13", "0"]
    assert (inside / "a").exists() and not (beside / "b").exists()


def test_a_read_allowlist_leaves_the_rest_unreadable(tmp_path: Path) -> None:
    """read=[system trees, the interpreter's]: a file elsewhere cannot even be read (EACCES)."""
    secret, listed = tmp_path / "secret", tmp_path / "listed"
    secret.mkdir()
    listed.mkdir()
    (secret / "key").write_text("k")
    (listed / "notes").write_text("n")
    system = ("/usr", "/lib", "/lib64", "/bin", "/etc", "/proc", "/dev")
    interpreter = (
        sys.prefix,
        sys.base_prefix,
        str(Path(os.path.realpath(sys.executable)).parents[1]),
    )
    sandbox = Sandbox(read=(*system, *interpreter, str(listed)))
    argv = [sys.executable, "-c", READ_PROBE, str(listed / "notes"), str(secret / "key")]
    done = run(confined(argv, [tmp_path / "none"], sandbox))
    assert done.stdout.split() == ["0", "13"], done.stderr


def test_output_to_inherited_pipes_is_not_confined(tmp_path: Path) -> None:
    """The command's stdout and stderr are pipes it inherits: /dev/stdout works."""
    done = run(confined(["/bin/sh", "-c", "echo out > /dev/stdout; echo err >&2"], [tmp_path]))
    assert (done.returncode, done.stdout, done.stderr) == (0, "out\n", "err\n")


def test_the_launcher_never_runs_a_command_it_could_not_confine(tmp_path: Path) -> None:
    """A ruleset the kernel rejects: exit 125 and one line, and the command did not run."""
    marker = tmp_path / "ran"
    argv = [sys.executable, "-I", "-S", LAUNCHER, "-f", f"{1 << 40:x}", "-p", "7", "/"]
    done = run([*argv, "--", "/bin/sh", "-c", f"touch {marker}"])
    assert done.returncode == EXIT_UNCONFINED
    assert done.stderr.startswith("orchestrator sandbox: cannot confine the command: ")
    assert not marker.exists()


def test_a_missing_command_exits_127(tmp_path: Path) -> None:
    """As a shell would: 127 and the name, when the command cannot be found."""
    done = run(confined(["no-such-program-xyz"], [tmp_path]))
    assert done.returncode == 127
    assert "no-such-program-xyz" in done.stderr


def _ignored_signals(argv: list[str]) -> int:
    status = run(argv).stdout
    line = next(x for x in status.splitlines() if x.startswith("SigIgn:"))
    return int(line.split()[1], 16)


def test_the_command_gets_default_signal_dispositions(tmp_path: Path) -> None:
    """The launcher's interpreter ignores SIGPIPE and SIGXFSZ; the command does not inherit it."""
    plain = _ignored_signals(["cat", "/proc/self/status"])
    inside = _ignored_signals(confined(["cat", "/proc/self/status"], [tmp_path]))
    assert inside == plain
    assert not inside & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1))


def test_signals_stay_inside_the_sandbox(tmp_path: Path) -> None:
    """A confined process cannot signal the orchestrator (Landlock scopes, ABI 6)."""
    if kernel_abi() < 6:
        pytest.skip("signal scoping needs Landlock ABI 6")
    code = (
        f"import os\ntry:\n    os.kill({os.getpid()}, 0)\nexcept OSError as e:\n    print(e.errno)"
    )
    done = run(confined([sys.executable, "-c", code], [tmp_path]))
    assert done.stdout.split() == ["1"]  # EPERM


@pytest.fixture
def listeners() -> Iterator[tuple[int, int]]:
    """Two TCP ports listening on 127.0.0.1."""
    socks = [socket.create_server(("127.0.0.1", 0)) for _ in range(2)]
    try:
        yield socks[0].getsockname()[1], socks[1].getsockname()[1]
    finally:
        for sock in socks:
            sock.close()


CONNECT_PROBE = """\
import socket, sys
for port in sys.argv[1:]:
    try:
        socket.create_connection(("127.0.0.1", int(port)), timeout=10).close()
        print(0)
    except OSError as e:
        print(e.errno)
"""


def test_tcp_connect_only_to_listed_ports(tmp_path: Path, listeners: tuple[int, int]) -> None:
    """ports=[A]: A connects, B (listening too) is refused by the kernel."""
    if kernel_abi() < 4:
        pytest.skip("TCP port rules need Landlock ABI 4")
    allowed, other = listeners
    argv = [sys.executable, "-c", CONNECT_PROBE, str(allowed), str(other)]
    done = run(confined(argv, [tmp_path], Sandbox(ports=(allowed,))))
    assert done.stdout.split() == ["0", "13"], done.stderr
    unlimited = run(confined(argv, [tmp_path]))
    assert unlimited.stdout.split() == ["0", "0"]


# --------------------------------------------------------------------------- the process layer


async def test_agent_process_gets_its_own_home_and_temp(tmp_path: Path) -> None:
    """HOME and TMPDIR point at private directories, which are gone once the process is."""
    code = "import os; print(os.environ['HOME'], os.environ['TMPDIR'], flush=True); input()"
    async with open_agent_process(
        [sys.executable, "-c", code], name="probe", cwd=tmp_path, sandbox=Sandbox()
    ) as proc:
        assert proc.ruleset is not None
        line = b""
        while not line.endswith(b"\n"):
            chunk = await proc.stream.receive_some(4096)
            assert chunk, "the probe ended before its line"
            line += chunk
        home, tmp = line.decode().split()
        assert home.startswith(tmp) and Path(home).is_dir()
        assert {str(tmp_path), home, tmp} <= set(proc.ruleset.writable)
    assert not Path(tmp).exists()


async def test_missing_agent_program_fails_as_unconfined(tmp_path: Path) -> None:
    """A program that is not there: AgentStartError caused by FileNotFoundError, as without."""
    with pytest.raises(AgentStartError) as caught:
        async with open_agent_process(["no-such-agent-xyz"], name="x", sandbox=Sandbox()):
            pass
    assert isinstance(caught.value.__cause__, FileNotFoundError)


async def test_terminal_commands_are_confined_to_the_session(tmp_path: Path) -> None:
    """A sandboxed terminal: writes in the session directory only; a missing program is 404."""
    session, outside = tmp_path / "session", tmp_path / "outside"
    session.mkdir()
    outside.mkdir()
    ctx = SessionContext(session_id="s", cwd=str(session), agent="a")
    command = f"echo in > in.txt; echo out > {outside}/out.txt"
    async with open_terminal_service(sandbox=Sandbox()) as terminals:
        created = await terminals.create(
            t.CreateTerminalRequest(session_id="s", command=command), ctx
        )
        term = created.terminal_id
        await terminals.wait_for_exit(
            t.WaitForTerminalExitRequest(session_id="s", terminal_id=term), ctx
        )
        output = await terminals.output(
            t.TerminalOutputRequest(session_id="s", terminal_id=term), ctx
        )
        assert "Permission denied" in output.output
        with pytest.raises(ResourceNotFound, match="command not found"):
            await terminals.create(
                t.CreateTerminalRequest(session_id="s", command="no-such-xyz", args=["1"]), ctx
            )
    assert (session / "in.txt").read_text() == "in\n"
    assert not (outside / "out.txt").exists()


async def test_a_sandboxed_agent_serves_one_session_per_process(tmp_path: Path) -> None:
    """Its rules are its branch's: two sessions, two processes, each started in its own."""
    script = AgentScript(turns=(Turn(steps=(Say("hi"),)),))
    spec = AgentSpec("a", tuple(scripted_agent_command(script, tmp_path)), sandbox=Sandbox())
    first, second = tmp_path / "one", tmp_path / "two"
    first.mkdir()
    second.mkdir()
    async with open_supervisor(Limits(), workdir=tmp_path) as supervisor:
        async with (
            supervisor.lease(spec, cwd=first) as one,
            supervisor.lease(spec, cwd=second) as two,
        ):
            assert one.connection is not two.connection
            for lease, where in ((one, first), (two, second)):
                process = lease.connection.process
                assert process is not None and process.ruleset is not None
                assert str(where) in process.ruleset.writable
                assert os.readlink(f"/proc/{process.pid}/cwd") == str(where)
        assert supervisor.statistics()["spawned"] == 2
    await trio.lowlevel.checkpoint()
