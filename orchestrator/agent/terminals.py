"""``terminal/*`` served by real child processes with bounded output.

:func:`open_terminal_service` yields a :class:`ProcessTerminalService` (the client's
:class:`~.services.TerminalService`) that owns a nursery; leaving the block kills the process
group of every terminal still alive. Install it with ``ClientServices(terminal=service)``.

Each terminal runs ``command`` with ``args``, or a whole shell line through ``/bin/sh -c`` when
there are no args, in a new session (so its whole process group can be signalled), stdin from
``/dev/null``, stdout and stderr interleaved into one buffer that keeps the last
``outputByteLimit`` bytes (default 1 MiB), cut at a UTF-8 character boundary. The working
directory defaults to the session's and must lie inside it. The environment starts from an
allowlist of the orchestrator's own (:data:`~orchestrator._env.TERMINAL_ENV`: ``PATH``,
``HOME``, ``LANG``, ``LC_*``, ``TERM``, ``TMPDIR``, ``USER``, ``SHELL``, ...) plus the variables
named in ``env_passthrough``, then the service's ``extra_env``, then the request's ``env``. The
command check sees the command line and the request's ``env`` exactly as they will reach the
process.

A service given a :class:`~orchestrator.sandbox.Sandbox` starts every command confined by
Landlock (see :mod:`orchestrator.agent.confine`): it may write only beneath the session's
directory, the sandbox's home, a private temp directory of its own (removed when the terminal
is released) and what the sandbox adds, whatever the request asks for.

The command's exit is noticed without reaping it (a pidfd and ``waitid(WNOWAIT)`` on Linux), so
the process group id stays reserved and background children it left can still be killed safely
on ``kill``, ``release``, :meth:`~ProcessTerminalService.release_session` and service exit. Where
pidfds are missing the leader is reaped at once and its leftovers are killed right then. The
descendants that left the group (``setsid``, a double fork) live on like background children
until ``kill``, ``release`` or service exit, and are killed then, found by the
``ORCHESTRATOR_TREE`` marker every terminal's environment gets or by its session (see
:mod:`orchestrator.agent.reaper`).
"""

from __future__ import annotations

import itertools
import os
import shlex
import signal
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from contextlib import asynccontextmanager, suppress
from typing import Literal

import trio
from attrs import define, field

from orchestrator._env import TERMINAL_ENV, terminal_environment
from orchestrator._names import decode_text, parse_name
from orchestrator._util import single_error
from orchestrator.errors import (
    CommandRefused,
    InternalError,
    InvalidParams,
    InvalidRequest,
    ResourceNotFound,
)

from .._log import get_logger
from ..protocol import types as t
from ..sandbox import Sandbox
from . import reaper
from .confine import Confined, confine, which
from .services import SessionContext

__all__ = [
    "DEFAULT_OUTPUT_BYTE_LIMIT",
    "TERMINAL_ENV",
    "CommandCheck",
    "OnExit",
    "OutputBuffer",
    "ProcessTerminalService",
    "open_terminal_service",
    "terminal_environment",
]

log = get_logger(__name__)

#: Output kept per terminal when the request gives no ``outputByteLimit``.
DEFAULT_OUTPUT_BYTE_LIMIT = 1 << 20
# Seconds to wait for a leader to die after SIGKILL, and to reap it.
_KILL_WAIT = 5.0
# After the command exits, how long to wait for its output to reach EOF (a background child may
# hold the pipe open forever).
_DRAIN_GRACE = 0.5
_READ_SIZE = 64 * 1024

#: A synchronous check of a command before it starts, given its line, the variables the
#: request sets (as they will reach the process) and the session: ``"allow"`` or ``"reject"``;
#: a check may also refuse by raising :class:`~orchestrator.errors.CommandRefused` itself.
CommandCheck = Callable[[str, Mapping[str, str], SessionContext], Literal["allow", "reject"]]
#: Called after every terminal command exits, before ``wait_for_exit`` returns (ctx, id, status).
OnExit = Callable[[SessionContext, str, t.TerminalExitStatus], Awaitable[None]]


def _request_env(variables: Iterable[t.EnvVariable]) -> dict[str, str]:
    """The request's ``env`` as it will be set (a later duplicate wins), checked."""
    env: dict[str, str] = {}
    for var in variables:
        if not var.name or "=" in var.name or "\0" in var.name + var.value:
            raise InvalidParams(f"bad environment variable {var.name!r}")
        env[var.name] = var.value
    return env


def _argv_line(argv: tuple[str, ...]) -> str:
    """An argv as the shell line that runs the same: a program named like an assignment
    (``FOO=1``) is quoted, or a shell would read it as one."""
    words = [shlex.quote(arg) for arg in argv]
    if words[0] == argv[0] and "=" in argv[0]:  # left unquoted: only characters safe in ''
        words[0] = f"'{argv[0]}'"
    return " ".join(words)


@define
class OutputBuffer:
    """The last ``limit`` bytes of a terminal's output (sans-I/O)."""

    limit: int
    _data: bytearray = field(factory=bytearray)
    _dropped: bool = False

    def feed(self, chunk: bytes | bytearray) -> None:
        """Append output; drop the oldest bytes beyond the limit."""
        self._data += chunk
        excess = len(self._data) - self.limit
        if excess > 0:
            del self._data[:excess]
            self._dropped = True

    def text(self, *, final: bool) -> tuple[str, bool]:
        """The output as text and whether it was truncated.

        The text starts at a character boundary and is at most ``limit`` bytes of UTF-8. Unless
        ``final``, an incomplete character at the end is held back for the next call.
        """
        data = bytes(self._data)
        truncated = self._dropped
        if truncated:
            data = _skip_continuation(data)
        if not final:
            data = data[: len(data) - _incomplete_tail(data)]
        # a byte that is not UTF-8 reads \xHH, as names are shown: a name the agent reads in
        # the output (``ls``) is one it can send back (see orchestrator._names)
        text = decode_text(data)
        encoded = text.encode("utf-8")
        if len(encoded) > self.limit:  # escaped bytes make invalid input grow
            text = _skip_continuation(encoded[len(encoded) - self.limit :]).decode("utf-8")
            truncated = True
        return text, truncated


def _skip_continuation(data: bytes) -> bytes:
    start = 0
    while start < min(len(data), 3) and data[start] & 0xC0 == 0x80:
        start += 1
    return data[start:]


def _incomplete_tail(data: bytes) -> int:
    """How many bytes at the end form the start of a character that is not complete yet."""
    for back in range(1, min(len(data), 4) + 1):
        byte = data[-back]
        if byte & 0xC0 == 0x80:
            continue
        needed = 1
        for length, lead in ((2, 0b110), (3, 0b1110), (4, 0b11110)):
            if byte >> (7 - length) == lead:
                needed = length
        return back if needed > back else 0
    return 0


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"SIG{number}"


@define(eq=False)
class _Terminal:
    id: str
    ctx: SessionContext
    argv: tuple[str, ...]
    process: trio.Process
    tree: reaper.ProcessTree
    pidfd: int | None
    output: OutputBuffer
    scope: trio.CancelScope = field(factory=trio.CancelScope)
    eof: trio.Event = field(factory=trio.Event)
    leader_gone: trio.Event = field(factory=trio.Event)
    exited: trio.Event = field(factory=trio.Event)
    done: trio.Event = field(factory=trio.Event)
    status: t.TerminalExitStatus | None = None
    reaped: bool = False
    #: its confinement, whose temp directory goes when the terminal does
    confined: Confined | None = None
    swept: bool = False

    def signal_group(self, sig: signal.Signals) -> None:
        # Safe while the leader is unreaped: its pid, the group id, cannot be reused.
        if self.reaped:
            return
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, sig)

    async def wait_leader(self) -> t.TerminalExitStatus:
        """Wait for the command to exit; leave it unreaped when a pidfd allows."""
        pid = self.process.pid
        if self.pidfd is not None:
            await trio.lowlevel.wait_readable(self.pidfd)
            # Readable pidfd: the child has exited, so this does not block. WNOWAIT: no reap.
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT | os.WNOHANG)  # noqa: ASYNC222
            if info is not None:
                if info.si_code == os.CLD_EXITED:
                    return t.TerminalExitStatus(exit_code=info.si_status)
                return t.TerminalExitStatus(signal=_signal_name(info.si_status))
        returncode = await self.process.wait()
        # Reaped: kill the leftovers now, the group id may be reused later.
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
        self.reaped = True
        if returncode < 0:
            return t.TerminalExitStatus(signal=_signal_name(-returncode))
        return t.TerminalExitStatus(exit_code=returncode)

    async def pump(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        try:
            while chunk := await stream.receive_some(_READ_SIZE):
                self.output.feed(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
            pass
        self.eof.set()

    async def terminate(self, grace: float) -> None:
        """The kill ladder for the whole group: SIGTERM, ``grace``, SIGKILL; bounded."""
        if not self.leader_gone.is_set() and grace > 0:
            self.signal_group(signal.SIGTERM)
            with trio.move_on_after(grace):
                await self.leader_gone.wait()
        self.signal_group(signal.SIGKILL)
        await self.sweep()
        with trio.move_on_after(_KILL_WAIT):
            await self.leader_gone.wait()
        if not self.leader_gone.is_set():
            log.error("terminal survived SIGKILL", terminal=self.id, pid=self.process.pid)

    async def sweep(self) -> None:
        """Once the group is killed: kill the descendants that left it (setsid, double fork)."""
        if self.swept:
            return
        self.swept = True
        # The session id is the leader's pid: only while the leader is unreaped is it ours.
        await reaper.release_tree(self.tree, session=None if self.reaped else self.process.pid)

    async def cleanup(self) -> None:
        """Shielded end of the terminal's task: kill what is left, reap, close."""
        with trio.CancelScope(shield=True):
            self.signal_group(signal.SIGKILL)
            await self.sweep()
            with trio.move_on_after(_KILL_WAIT):
                await self.process.wait()
            self.reaped = self.process.returncode is not None
            if self.reaped:
                self.leader_gone.set()
            if self.pidfd is not None:
                trio.lowlevel.notify_closing(self.pidfd)
                os.close(self.pidfd)
                self.pidfd = None
            if self.process.stdout is not None:
                await self.process.stdout.aclose()
            if not self.exited.is_set():
                self.exited.set()  # waiters see status None: released before it exited
            if self.confined is not None:
                await trio.to_thread.run_sync(self.confined.release)
            self.done.set()


@define(eq=False)
class ProcessTerminalService:
    """Terminals as child processes; get one from :func:`open_terminal_service`."""

    _nursery: trio.Nursery = field(alias="nursery")
    max_per_session: int = 16
    default_output_limit: int = DEFAULT_OUTPUT_BYTE_LIMIT
    max_output_limit: int = 64 << 20
    env_passthrough: tuple[str, ...] = ()
    extra_env: Mapping[str, str] = field(factory=dict)
    command_check: CommandCheck | None = None
    on_exit: OnExit | None = None
    kill_grace: float = 1.0
    #: confines every command (None: unconfined)
    sandbox: Sandbox | None = None
    _terminals: dict[str, _Terminal] = field(factory=dict, init=False)
    _ids: itertools.count[int] = field(factory=lambda: itertools.count(1), init=False)
    _closing: bool = field(default=False, init=False)
    _starting: dict[str, int] = field(factory=dict, init=False)
    #: sessions whose turn is being cancelled: they start no new command until their next turn
    #: (a command an agent asks for after ``session/cancel`` would outlive the kill of the
    #: session's terminals, and the turn would wait for it)
    _cancelled: set[str] = field(factory=set, init=False)

    # ----------------------------------------------------------------------- the protocol

    async def create(
        self, request: t.CreateTerminalRequest, ctx: SessionContext
    ) -> t.CreateTerminalResponse:
        """Start the command; its process runs until released (or the service ends)."""
        if self._closing:
            raise InternalError("the terminal service is shutting down")
        if not request.command.strip():
            raise InvalidParams("empty command")
        if ctx.session_id in self._cancelled:
            raise InvalidRequest("the turn is being cancelled: no new command starts")
        args = list(request.args or ())
        argv = (request.command, *args) if args else ("/bin/sh", "-c", request.command)
        line = _argv_line(argv) if args else request.command
        requested = _request_env(request.env or ())
        limit = request.output_byte_limit
        if limit is not None and limit < 0:
            raise InvalidParams("outputByteLimit must not be negative")
        limit = min(self.default_output_limit if limit is None else limit, self.max_output_limit)
        # before the check: a start the check allows is audited as allowed, so it must not
        # then fail on its directory
        cwd = await trio.to_thread.run_sync(_resolve_cwd, request.cwd, ctx.cwd)
        session_id = ctx.session_id
        in_use = self._starting.get(session_id, 0) + len(self._session_terminals(session_id))
        if in_use >= self.max_per_session:
            raise InvalidRequest(
                f"too many terminals in this session (limit {self.max_per_session}); "
                "release some first"
            )
        if self.command_check is not None and self.command_check(line, requested, ctx) != "allow":
            raise CommandRefused(f"terminal command rejected by policy: {line}")
        # Hold the slot while the process starts, so concurrent creates respect the limit.
        self._starting[session_id] = self._starting.get(session_id, 0) + 1
        confined: Confined | None = None
        try:
            env = terminal_environment(os.environ, passthrough=self.env_passthrough)
            env.update(self.extra_env)
            env.update(requested)  # what the check saw, and nothing else from the agent
            run = argv
            if self.sandbox is not None:
                confined = await trio.to_thread.run_sync(
                    self._confine, argv, ctx.cwd, cwd, env, list(requested)
                )
                run, env = confined.argv, dict(confined.env)
            try:
                process, tree = await self._spawn(run, cwd, env, line, argv[0])
            except BaseException:
                if confined is not None:
                    with trio.CancelScope(shield=True):
                        await trio.to_thread.run_sync(confined.release)
                raise
        finally:
            self._starting[session_id] -= 1
        # No checkpoint from the spawn to start_soon, so a cancel cannot leak the process.
        term = _Terminal(
            id=f"term-{next(self._ids)}",
            ctx=ctx,
            argv=argv,
            process=process,
            tree=tree,
            pidfd=_pidfd(process.pid),
            output=OutputBuffer(limit),
            confined=confined,
        )
        self._terminals[term.id] = term
        self._nursery.start_soon(self._supervise, term)
        if session_id in self._cancelled:  # cancelled while it started: it goes as the rest did
            self._nursery.start_soon(self._kill, term)
        log.info(
            "terminal started",
            terminal=term.id,
            agent=ctx.agent,
            session=ctx.session_id,
            pid=process.pid,
            command=line,
            cwd=cwd,
            sandboxed=confined is not None,
        )
        return t.CreateTerminalResponse(terminal_id=term.id)

    async def output(
        self, request: t.TerminalOutputRequest, ctx: SessionContext
    ) -> t.TerminalOutputResponse:
        """The output so far, whether it was truncated, and the exit status once exited."""
        term = self._get(request.terminal_id, ctx)
        await trio.lowlevel.checkpoint()
        exited = term.exited.is_set()
        text, truncated = term.output.text(final=exited)
        return t.TerminalOutputResponse(
            output=text, truncated=truncated, exit_status=term.status if exited else None
        )

    async def wait_for_exit(
        self, request: t.WaitForTerminalExitRequest, ctx: SessionContext
    ) -> t.WaitForTerminalExitResponse:
        """Wait until the command exits; its exit code, or the name of the killing signal."""
        term = self._get(request.terminal_id, ctx)
        await term.exited.wait()
        if term.status is None:
            raise ResourceNotFound(f"terminal {term.id} was released before it exited")
        return t.WaitForTerminalExitResponse(
            exit_code=term.status.exit_code, signal=term.status.signal
        )

    async def kill(
        self, request: t.KillTerminalRequest, ctx: SessionContext
    ) -> t.KillTerminalResponse:
        """Kill the command's whole process group; the terminal id stays valid."""
        term = self._get(request.terminal_id, ctx)
        await self._kill(term)
        return t.KillTerminalResponse()

    async def release(
        self, request: t.ReleaseTerminalRequest, ctx: SessionContext
    ) -> t.ReleaseTerminalResponse:
        """Kill the process group if still running, and forget the terminal."""
        await self._release(self._get(request.terminal_id, ctx))
        return t.ReleaseTerminalResponse()

    # ----------------------------------------------------------------------- sessions

    def terminal_ids(self, session_id: str | None = None) -> list[str]:
        """Ids of the terminals not yet released (of one session, or all)."""
        return [
            term.id
            for term in self._terminals.values()
            if session_id is None or term.ctx.session_id == session_id
        ]

    async def kill_session(self, session_id: str) -> None:
        """Kill every terminal of a session (on ``session/cancel``); ids stay valid. The session
        starts no new command until :meth:`reopen_session` (its next turn)."""
        self._cancelled.add(session_id)
        terms = self._session_terminals(session_id)
        if not terms:
            # most sessions never open a terminal: no nursery for nothing
            await trio.lowlevel.checkpoint()
            return
        async with trio.open_nursery() as nursery:
            for term in terms:
                nursery.start_soon(self._kill, term)

    def reopen_session(self, session_id: str) -> None:
        """A new turn of the session: it may start commands again (see :meth:`kill_session`)."""
        self._cancelled.discard(session_id)

    async def release_session(self, session_id: str) -> None:
        """Kill and release every terminal of a session (when the session ends)."""
        self._cancelled.discard(session_id)
        terms = self._session_terminals(session_id)
        if not terms:
            await trio.lowlevel.checkpoint()
            return
        async with trio.open_nursery() as nursery:
            for term in terms:
                nursery.start_soon(self._release, term)

    # ----------------------------------------------------------------------- internals

    def _confine(
        self, argv: tuple[str, ...], root: str, cwd: str, env: dict[str, str], keep: list[str]
    ) -> Confined:
        """A command's confinement: the session's directory is its writable tree (blocking)."""
        assert self.sandbox is not None
        # the launcher would find a missing program only after the fork: refuse it as unconfined
        if which(argv[0], env, cwd) is None:
            raise ResourceNotFound(f"command not found: {argv[0]}")
        return confine(argv, self.sandbox, cwd=os.path.realpath(root), environ=env, keep=keep)

    async def _spawn(
        self, argv: tuple[str, ...], cwd: str, env: dict[str, str], line: str, program: str
    ) -> tuple[trio.Process, reaper.ProcessTree]:
        tree = reaper.open_tree()
        try:
            try:
                process = await trio.lowlevel.open_process(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    env=tree.environment(env),
                    start_new_session=True,
                )
            except FileNotFoundError as exc:
                raise ResourceNotFound(f"command not found: {program}") from exc
            except OSError as exc:
                raise InternalError(f"cannot start {line}: {exc}") from exc
        except BaseException:
            reaper.close_tree(tree)
            raise
        if self._closing:  # the service began shutting down while the process started
            with trio.CancelScope(shield=True):
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                await reaper.release_tree(tree, session=process.pid)
                with trio.move_on_after(_KILL_WAIT):
                    await process.wait()
                if process.stdout is not None:
                    await process.stdout.aclose()
            raise InternalError("the terminal service is shutting down")
        return process, tree

    def _get(self, terminal_id: str, ctx: SessionContext) -> _Terminal:
        term = self._terminals.get(terminal_id)
        if term is None or term.ctx.session_id != ctx.session_id:
            raise ResourceNotFound(f"unknown terminal {terminal_id!r}")
        return term

    def _session_terminals(self, session_id: str) -> list[_Terminal]:
        return [term for term in self._terminals.values() if term.ctx.session_id == session_id]

    async def _kill(self, term: _Terminal) -> None:
        with trio.CancelScope(shield=True):
            await term.terminate(self.kill_grace)
        await term.exited.wait()  # the on_exit hook has run

    async def _release(self, term: _Terminal) -> None:
        await self._kill(term)
        with trio.CancelScope(shield=True):
            self._terminals.pop(term.id, None)
            term.scope.cancel()
            await term.done.wait()
        log.info("terminal released", terminal=term.id, session=term.ctx.session_id)

    async def _supervise(self, term: _Terminal) -> None:
        try:
            with term.scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(term.pump)
                    status = await term.wait_leader()
                    term.leader_gone.set()
                    with trio.move_on_after(_DRAIN_GRACE):
                        await term.eof.wait()
                    term.status = status
                    log.info(
                        "terminal exited",
                        terminal=term.id,
                        exit_code=status.exit_code,
                        signal=status.signal,
                    )
                    await self._notify_exit(term, status)
                    term.exited.set()
                    # Leftover children stay until release: kill them only then.
                    await trio.sleep_forever()
        finally:
            await term.cleanup()

    async def _notify_exit(self, term: _Terminal, status: t.TerminalExitStatus) -> None:
        if self.on_exit is None:
            return
        try:
            await self.on_exit(term.ctx, term.id, status)
        except Exception as exc:
            # the turn goes on: a follow-up that cannot work (a harvest of a removed branch
            # directory) fails again where the step next uses what it works on
            log.warning(
                "the follow-up of a finished terminal command failed",
                terminal=term.id,
                error=str(exc),
            )

    async def _shutdown(self) -> None:
        self._closing = True
        if not self._terminals:
            return  # nothing to kill (the usual case): the service's nursery exits at once
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for term in list(self._terminals.values()):
                    nursery.start_soon(term.terminate, self.kill_grace)
            for term in self._terminals.values():
                term.scope.cancel()
            self._terminals.clear()


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _resolve_cwd(requested: str | None, session_cwd: str) -> str:
    root = os.path.realpath(session_cwd)
    # named as the agent was shown it (``\xHH`` for a byte that is not UTF-8)
    target = os.path.realpath(os.path.join(root, parse_name(requested))) if requested else root
    if target != root and not target.startswith(root.rstrip(os.sep) + os.sep):
        raise InvalidParams(f"cwd {requested!r} is outside the session directory {session_cwd}")
    if not os.path.isdir(target):
        raise InvalidParams(f"cwd {requested!r} is not a directory")
    return target


@asynccontextmanager
async def open_terminal_service(
    *,
    max_per_session: int = 16,
    default_output_limit: int = DEFAULT_OUTPUT_BYTE_LIMIT,
    max_output_limit: int = 64 << 20,
    env_passthrough: Iterable[str] = (),
    extra_env: Mapping[str, str] | None = None,
    command_check: CommandCheck | None = None,
    on_exit: OnExit | None = None,
    kill_grace: float = 1.0,
    sandbox: Sandbox | None = None,
) -> AsyncIterator[ProcessTerminalService]:
    """A terminal service for the duration of the block; leaving it kills every terminal.

    ``max_per_session`` bounds the terminals a session holds (until released).
    ``env_passthrough`` names (globs, case-insensitive) variables of the orchestrator's
    environment passed to terminals beyond :data:`TERMINAL_ENV`; ``extra_env`` is added to
    every terminal's environment. ``command_check`` (see
    :func:`orchestrator.agent.permissions.policy_command_check`) vets each command line before it
    starts; ``on_exit`` runs after each command exits. ``kill_grace`` is the time between
    SIGTERM and SIGKILL when a terminal is killed (0: SIGKILL at once). ``sandbox`` confines
    every command (see the module doc).
    """
    with single_error():
        async with trio.open_nursery() as nursery:
            service = ProcessTerminalService(
                nursery=nursery,
                max_per_session=max_per_session,
                default_output_limit=default_output_limit,
                max_output_limit=max_output_limit,
                env_passthrough=tuple(env_passthrough),
                extra_env=dict(extra_env or {}),
                command_check=command_check,
                on_exit=on_exit,
                kill_grace=kill_grace,
                sandbox=sandbox,
            )
            try:
                yield service
            finally:
                await service._shutdown()
