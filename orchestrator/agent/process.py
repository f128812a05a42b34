"""Spawn and stop one agent process.

:func:`open_agent_process` starts an agent as a child process in its own session (so its whole
process group can be signalled), hands its stdin/stdout to the caller as one
:class:`trio.abc.Stream` for the JSON-RPC layer, drains its stderr into the log and a bounded tail,
and on the way out always runs the shutdown ladder: close stdin, SIGTERM the group, SIGKILL the
group, each rung bounded by a grace period.

With a :class:`~orchestrator.sandbox.Sandbox`, the agent starts confined by Landlock (see
:mod:`orchestrator.agent.confine`): the rules hold before its program runs, for it and every
process it starts.

As soon as the leader exits (noticed through a pidfd before it is reaped, so its pid, the group
and session id, stays reserved meanwhile), whatever it leaves behind is killed: its process
group, then its descendants that left the group (``setsid``, ``setpgid``, a double fork), found
by the ``ORCHESTRATOR_TREE`` marker in their environment or by their session (see
:mod:`orchestrator.agent.reaper`). Only then is the leader reaped and :meth:`AgentProcess.wait`
answered. If the orchestrator itself dies, even by ``SIGKILL``, the reaper's watchdog kills
every process of the agent's tree.

Limits (Linux; elsewhere only the group is signalled): a descendant that leaves the agent's
session and also runs a program with an environment lacking the marker (``env -i``) is found
only while it stays in a session led by a marked process; one that outruns the sweep by forking
and exiting in a loop, or one running as another user, is not found. Only a cgroup could
contain those.
"""

from __future__ import annotations

import logging
import os
import shlex
import signal
from collections import deque
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from subprocess import PIPE

import trio
from attrs import define, field

from orchestrator.errors import AgentExited, AgentStartError
from orchestrator.jsonrpc.pipes import PipeStream
from orchestrator.sandbox import Ruleset, Sandbox

from .._log import get_logger
from . import reaper
from .confine import Confined, confine, which

__all__ = [
    "KILL_WAIT",
    "STDERR_EOF_GRACE",
    "STDERR_LOG_LEVEL",
    "AgentProcess",
    "open_agent_process",
]

log = get_logger(__name__)

#: Level at which every stderr line of an agent is logged.
STDERR_LOG_LEVEL = logging.INFO
#: Seconds to wait for the process to be reaped after SIGKILL before giving up on it.
KILL_WAIT = 5.0
#: Seconds to wait for stderr EOF once the process is gone (a descendant that escaped the
#: process group may hold the pipe open forever).
STDERR_EOF_GRACE = 1.0

_READ_SIZE = 64 * 1024
# Lines are cut to the tail budget, but never below this, so a tiny tail still logs readable lines.
_MIN_LINE_LIMIT = 256


# --------------------------------------------------------------------------- sans-I/O helpers


@define
class _LineSplitter:
    """Splits a byte stream into lines, keeping at most ``limit`` bytes of any one line.

    The rest of an overlong line is dropped (and counted) until its newline, so memory stays
    bounded whatever the peer writes.
    """

    limit: int
    _buf: bytearray = field(factory=bytearray)
    _dropped: int = 0

    def feed(self, data: bytes | bytearray) -> list[tuple[bytes, int]]:
        """Consume ``data``; return the completed lines (without newline) and bytes dropped."""
        lines: list[tuple[bytes, int]] = []
        start = 0
        while start < len(data):
            newline = data.find(b"\n", start)
            end = len(data) if newline < 0 else newline
            self._keep(data, start, end)
            if newline < 0:
                break
            lines.append(self._take())
            start = newline + 1
        return lines

    def flush(self) -> tuple[bytes, int] | None:
        """At EOF: the unterminated last line, if any."""
        if not self._buf and not self._dropped:
            return None
        return self._take()

    def _keep(self, data: bytes | bytearray, start: int, end: int) -> None:
        room = max(0, self.limit - len(self._buf))
        take = min(room, end - start)
        self._buf += data[start : start + take]
        self._dropped += end - start - take

    def _take(self) -> tuple[bytes, int]:
        line = bytes(self._buf)
        if line.endswith(b"\r"):
            line = line[:-1]
        dropped = self._dropped
        self._buf.clear()
        self._dropped = 0
        return line, dropped


@define
class _StderrTail:
    """The last ``limit`` bytes of stderr, kept as whole lines where possible."""

    limit: int
    _lines: deque[bytes] = field(factory=deque)
    _size: int = 0

    def add(self, line: bytes) -> None:
        """Append one line (without its newline); evict the oldest lines beyond the budget."""
        if self.limit <= 0:
            return
        entry = (line + b"\n")[: self.limit]
        self._lines.append(entry)
        self._size += len(entry)
        while self._size > self.limit:
            self._size -= len(self._lines.popleft())

    def text(self) -> str:
        """The tail decoded as UTF-8, undecodable bytes replaced."""
        return b"".join(self._lines).decode("utf-8", errors="replace")


# --------------------------------------------------------------------------- the process


@define(eq=False)
class AgentProcess:
    """One running agent process, as yielded by :func:`open_agent_process`.

    Only the tasks of :func:`open_agent_process` wait on and reap the underlying process, so that
    the leftovers of its process group and tree are killed before the leader is reaped (while its
    pid cannot be reused).
    """

    name: str
    """The agent's name, used in logs and errors."""
    pid: int
    """The process id, which is also its process group and session id."""
    argv: tuple[str, ...]
    """The command line that was executed."""
    stream: PipeStream
    """The child's stdin (send side) and stdout (receive side), for the JSON-RPC layer."""
    ruleset: Ruleset | None = field(default=None, kw_only=True)
    """The Landlock rules it runs under, or None when it is not confined."""
    _process: trio.Process = field(alias="process", repr=False)
    _tree: reaper.ProcessTree = field(alias="tree", repr=False)
    _pidfd: int | None = field(alias="pidfd", repr=False)
    _tail: _StderrTail = field(alias="tail", repr=False)
    _stdin_close_grace: float = field(alias="stdin_close_grace", repr=False)
    _term_grace: float = field(alias="term_grace", repr=False)
    shutdown_steps: list[str] = field(factory=list, init=False, repr=False)
    """The rungs of the shutdown ladder taken, in order: ``close-stdin``,
    ``wait-stdin-grace``, ``sigterm``, ``wait-term-grace``, ``sigkill``, ``wait-kill``."""
    _skip_stdin_grace: bool = field(default=False, init=False, repr=False)
    _returncode: int | None = field(default=None, init=False)
    _exited: trio.Event = field(factory=trio.Event, init=False, repr=False)
    _stderr_done: trio.Event = field(factory=trio.Event, init=False, repr=False)
    _closing: bool = field(default=False, init=False, repr=False)
    _closed: trio.Event = field(factory=trio.Event, init=False, repr=False)
    _watch_scope: trio.CancelScope = field(
        factory=lambda: trio.CancelScope(shield=True), init=False, repr=False
    )
    _drain_scope: trio.CancelScope = field(
        factory=lambda: trio.CancelScope(shield=True), init=False, repr=False
    )

    @classmethod
    def _from_process(
        cls,
        process: trio.Process,
        *,
        name: str,
        argv: tuple[str, ...],
        tree: reaper.ProcessTree,
        pidfd: int | None,
        stderr_tail_bytes: int,
        stdin_close_grace: float,
        term_grace: float,
        ruleset: Ruleset | None,
    ) -> AgentProcess:
        assert isinstance(process.stdin, trio.lowlevel.FdStream)
        assert isinstance(process.stdout, trio.lowlevel.FdStream)
        return cls(
            name=name,
            pid=process.pid,
            argv=argv,
            stream=PipeStream(process.stdin, process.stdout),
            process=process,
            tree=tree,
            pidfd=pidfd,
            tail=_StderrTail(stderr_tail_bytes),
            stdin_close_grace=stdin_close_grace,
            term_grace=term_grace,
            ruleset=ruleset,
        )

    @property
    def returncode(self) -> int | None:
        """The exit status: ``None`` while running, ``-N`` if killed by signal ``N``."""
        return self._returncode

    async def wait(self) -> int:
        """Wait until the process has exited and return its exit status."""
        await self._exited.wait()
        assert self._returncode is not None
        return self._returncode

    def stderr_tail(self) -> str:
        """The last stderr output (at most ``stderr_tail_bytes``), starting at a line boundary."""
        return self._tail.text()

    async def exit_error(self, reason: str, *, wait: float = 1.0) -> AgentExited:
        """An :class:`AgentExited` carrying the exit status and stderr tail.

        Waits up to ``wait`` seconds for the process to exit and its stderr to reach EOF, so the
        error is as complete as possible; the status is ``None`` if it is still running. Meant as
        the JSON-RPC connection's ``close_error`` factory.
        """
        with trio.move_on_after(wait):
            await self._exited.wait()
            await self._stderr_done.wait()
        return AgentExited(
            reason, peer=self.name, exit_status=self._returncode, stderr_tail=self.stderr_tail()
        )

    def skip_stdin_grace(self) -> None:
        """Send SIGTERM as soon as stdin is closed, for an agent known not to exit when its
        stdin closes (waiting for it would only cost the grace)."""
        self._skip_stdin_grace = True

    async def aclose(self) -> None:
        """Stop the process with the shutdown ladder; idempotent, shielded and time-bounded.

        Rungs: close stdin and wait ``stdin_close_grace`` (not at all after
        :meth:`skip_stdin_grace`); SIGTERM the process group and wait ``term_grace``; SIGKILL
        the process group and wait up to :data:`KILL_WAIT`. :attr:`shutdown_steps` records
        the rungs taken.
        """
        with trio.CancelScope(shield=True):
            if self._closing:
                await self._closed.wait()
                return
            self._closing = True
            try:
                await self._shutdown_ladder()
            finally:
                self._closed.set()

    # ----------------------------------------------------------------------- internals

    async def _shutdown_ladder(self) -> None:
        bound = log.bind(agent=self.name, pid=self.pid)
        assert self._process.stdin is not None
        assert self._process.stdout is not None
        steps = self.shutdown_steps
        if self._returncode is None:
            bound.debug("agent shutdown: closing stdin")
        steps.append("close-stdin")
        await self._process.stdin.aclose()
        if self._skip_stdin_grace and not self._exited.is_set():
            bound.debug("agent shutdown: it does not exit on stdin close, sending SIGTERM")
            exited = False
        else:
            steps.append("wait-stdin-grace")
            exited = await self._wait_exited(self._stdin_close_grace)
            if not exited:
                bound.info("agent shutdown: still running after stdin closed, sending SIGTERM")
        if not exited:
            steps.append("sigterm")
            self._signal_group(signal.SIGTERM)
            steps.append("wait-term-grace")
            if not await self._wait_exited(self._term_grace):
                bound.warning("agent shutdown: still running after SIGTERM, sending SIGKILL")
                steps.append("sigkill")
                self._signal_group(signal.SIGKILL)
                steps.append("wait-kill")
                if not await self._wait_exited(KILL_WAIT):
                    bound.error("agent shutdown: process survived SIGKILL; giving up on it")
        await self._process.stdout.aclose()

    async def _wait_exited(self, timeout: float) -> bool:
        with trio.move_on_after(timeout):
            await self._exited.wait()
        return self._exited.is_set()

    def _signal_group(self, sig: signal.Signals) -> bool:
        """Signal the whole process group; False if nothing was left to signal."""
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            return False
        return True

    async def _watch_exit(self) -> None:
        """When the leader exits, kill whatever is left of its group and its tree, then reap it."""
        try:
            with self._watch_scope:
                if self._pidfd is not None:
                    # Readable once the leader has exited; it stays unreaped (a zombie) until
                    # wait() below, so its pid, the group and session id, cannot be reused
                    # while its leftovers are killed.
                    await trio.lowlevel.wait_readable(self._pidfd)
                    self._signal_group(signal.SIGKILL)
                    await reaper.release_tree(self._tree, session=self.pid)
                    returncode = await self._process.wait()
                else:
                    returncode = await self._process.wait()
                    # Reaped: the group id cannot be reused while members remain, and we get
                    # here right after the reap, so this hits only the agent's own leftovers.
                    self._signal_group(signal.SIGKILL)
                    await reaper.release_tree(self._tree)
                self._returncode = returncode
                self._exited.set()
                log.info(
                    "agent process exited",
                    agent=self.name,
                    pid=self.pid,
                    returncode=returncode,
                )
        finally:
            if self._pidfd is not None:
                os.close(self._pidfd)
                self._pidfd = None

    async def _drain_stderr(self, stderr: trio.abc.ReceiveStream) -> None:
        """Log stderr line by line and keep its tail, until EOF or told to stop."""
        splitter = _LineSplitter(max(self._tail.limit, _MIN_LINE_LIMIT))
        try:
            with self._drain_scope:
                async with stderr:
                    while True:
                        try:
                            data = await stderr.receive_some(_READ_SIZE)
                        except (trio.ClosedResourceError, trio.BrokenResourceError, OSError):
                            break
                        if not data:
                            break
                        for line, dropped in splitter.feed(data):
                            self._stderr_line(line, dropped)
            last = splitter.flush()
            if last is not None:
                self._stderr_line(*last)
        finally:
            self._stderr_done.set()

    def _stderr_line(self, line: bytes, dropped: int) -> None:
        self._tail.add(line)
        extra = {"truncated": dropped} if dropped else {}
        log.log(
            STDERR_LOG_LEVEL,
            "agent stderr",
            agent=self.name,
            line=line.decode("utf-8", errors="replace"),
            **extra,
        )

    async def _close_from_context(self) -> None:
        """Exit path of :func:`open_agent_process`: ladder, then let the helper tasks end."""
        with trio.CancelScope(shield=True):
            try:
                await self.aclose()
                with trio.move_on_after(STDERR_EOF_GRACE):
                    await self._stderr_done.wait()
            finally:
                self._drain_scope.cancel()
                self._watch_scope.cancel()


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _argv(command: Sequence[str] | str) -> tuple[str, ...]:
    if isinstance(command, str):
        return ("/bin/sh", "-c", command)
    return tuple(os.fspath(arg) for arg in command)


@asynccontextmanager
async def open_agent_process(
    command: Sequence[str] | str,
    *,
    name: str,
    env: Mapping[str, str] | None = None,
    inherit_env: bool = True,
    cwd: str | os.PathLike[str] | None = None,
    stderr_tail_bytes: int = 64 * 1024,
    stdin_close_grace: float = 2.0,
    term_grace: float = 2.0,
    sandbox: Sandbox | None = None,
) -> AsyncIterator[AgentProcess]:
    """Run an agent process for the duration of the block.

    ``command`` is an argv, or a shell line run with ``/bin/sh -c``. ``env`` is merged over
    ``os.environ`` when ``inherit_env``, else used alone; either way the process's tree marker
    (``ORCHESTRATOR_TREE``) is added. The process runs in a new session; on leaving the block
    (normally, by exception or by cancellation) :meth:`AgentProcess.aclose` runs shielded, and
    no member of its process group survives, nor any descendant found by its marker or session.

    With ``sandbox``, the process is confined by Landlock: it may write only beneath ``cwd``
    (default: the current directory), its home and a private temp directory (``HOME``,
    ``TMPDIR`` and the XDG directories point there, unless ``env`` sets them: those it sets are
    writable), and what the sandbox adds. Raises
    :class:`~orchestrator.errors.SandboxUnavailable` where the kernel cannot confine it.

    Raises :class:`~orchestrator.errors.AgentStartError` if the command cannot be started.
    Exceptions from the block come out as they are, never wrapped in an exception group.
    """
    if stderr_tail_bytes < 0:
        raise ValueError("stderr_tail_bytes must not be negative")
    argv = _argv(command)
    if not argv:
        raise AgentStartError("empty command", agent=name)
    child_env: dict[str, str] | None = None
    if not inherit_env:
        child_env = dict(env or {})
    elif env:
        child_env = {**os.environ, **env}
    confined: Confined | None = None
    run = argv
    if sandbox is not None:
        confined = await trio.to_thread.run_sync(
            _confine, name, argv, sandbox, cwd, child_env, dict(env or {})
        )
        run, child_env = confined.argv, dict(confined.env)
    try:
        async with _spawned(
            argv,
            run,
            name=name,
            env=child_env,
            cwd=cwd,
            stderr_tail_bytes=stderr_tail_bytes,
            stdin_close_grace=stdin_close_grace,
            term_grace=term_grace,
            ruleset=confined.ruleset if confined is not None else None,
        ) as agent:
            yield agent
    finally:
        if confined is not None:
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(confined.release)


def _confine(
    name: str,
    argv: tuple[str, ...],
    sandbox: Sandbox,
    cwd: str | os.PathLike[str] | None,
    env: Mapping[str, str] | None,
    explicit: Mapping[str, str],
) -> Confined:
    """The agent's confinement; a missing program fails here, as it would unconfined."""
    where = os.fspath(cwd) if cwd is not None else os.getcwd()
    environ = os.environ if env is None else env
    # the launcher would only find out after the fork: say it the way an unconfined start does
    if which(argv[0], environ, where) is None:
        error = FileNotFoundError(2, "No such file or directory", argv[0])
        raise AgentStartError(f"cannot start {shlex.join(argv)}: {error}", agent=name) from error
    # the variables the agent's own settings name are its own: kept, and writable when they are
    # directories (XDG_CONFIG_HOME=..., say)
    writable = [v for k, v in explicit.items() if k.startswith("XDG_") and os.path.isabs(v)]
    return confine(argv, sandbox, cwd=where, environ=environ, keep=explicit, writable=writable)


@asynccontextmanager
async def _spawned(
    argv: tuple[str, ...],
    run: tuple[str, ...],
    *,
    name: str,
    env: dict[str, str] | None,
    cwd: str | os.PathLike[str] | None,
    stderr_tail_bytes: int,
    stdin_close_grace: float,
    term_grace: float,
    ruleset: Ruleset | None,
) -> AsyncIterator[AgentProcess]:
    tree = reaper.open_tree()
    try:
        try:
            process = await trio.lowlevel.open_process(
                list(run),
                stdin=PIPE,
                stdout=PIPE,
                stderr=PIPE,
                # the marker goes last, over anything the caller's environment says
                env=tree.environment(dict(os.environ) if env is None else env),
                cwd=cwd,
                start_new_session=True,
            )
        except OSError as exc:
            raise AgentStartError(f"cannot start {shlex.join(argv)}: {exc}", agent=name) from exc
    except BaseException:
        reaper.close_tree(tree)
        raise
    log.info(
        "agent process started", agent=name, pid=process.pid, argv=argv, sandboxed=bool(ruleset)
    )
    # No checkpoint between the spawn and the try below, so a cancel cannot leak the process.
    agent = AgentProcess._from_process(
        process,
        name=name,
        argv=argv,
        tree=tree,
        pidfd=_pidfd(process.pid),
        stderr_tail_bytes=stderr_tail_bytes,
        stdin_close_grace=stdin_close_grace,
        term_grace=term_grace,
        ruleset=ruleset,
    )
    stderr = process.stderr
    assert stderr is not None
    single: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent._watch_exit)
            nursery.start_soon(agent._drain_stderr, stderr)
            try:
                yield agent
            finally:
                await agent._close_from_context()
    except BaseExceptionGroup as group:
        if len(group.exceptions) != 1:
            raise
        single = group.exceptions[0]
    if single is not None:
        # Raised outside the except block so the group does not become its __context__.
        try:
            raise single
        finally:
            single = None
