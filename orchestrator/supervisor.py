"""The supervisor: many agent processes at once, with pools, limits, restarts and watchdogs.

A :class:`Supervisor` (from :func:`open_supervisor`) owns every agent process in its nursery.
Each :class:`~orchestrator.agents.AgentSpec` gets a pool; :meth:`Supervisor.lease` hands a step
a fresh ACP session on a pooled process and takes it back afterwards::

    async with open_supervisor(Limits(max_sessions=8)) as supervisor:
        async with supervisor.lease(spec, cwd=workdir, services=services, step="plan") as lease:
            result = await lease.prompt("Write a plan", idle_timeout=120)

Limits: a global bound on live sessions and a per-agent one (``AgentSpec.max_sessions``); an agent
that serves one session per process (``sessions_per_process=1``) gets a process per lease. A
process that dies is replaced when next needed, after a backoff, within the spec's restart
budget. A turn that outlives its timeout is cancelled; an agent that ignores the cancel too is
killed. Nothing is ever re-sent on its own: a turn lost with its process fails the lease, and
retrying is the caller's explicit choice. On exit, cancel or Ctrl-C every process gets the
shutdown ladder (stdin closed, SIGTERM, SIGKILL to its process group), but only after the turns
running on it were ended the ACP way (``session/cancel`` and the agent's answer, within
``ClientOptions.interrupt_grace``) and their callers had recorded what they did.
"""

from __future__ import annotations

import math
import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import trio
from attrs import define, field, frozen

from ._log import get_logger
from ._util import grace_period
from .agent.client import AcpSession, AgentConnection, ClientOptions, open_agent
from .agent.content import PromptInput
from .agent.services import ClientServices, SessionContext
from .agent.transcript import TranscriptFile, TranscriptWriter
from .agent.turn import DEFAULT_MAX_TURN_RECORD_BYTES, TurnResult
from .agents import AgentIdentity, AgentSpec
from .errors import AgentError, AgentHung, AgentStartError, OrchestratorError, ResourceNotFound
from .protocol import types as t
from .sandbox import Sandbox

__all__ = [
    "ConnectArgs",
    "Connector",
    "Lease",
    "Limits",
    "Supervisor",
    "open_supervisor",
    "subprocess_connector",
]

log = get_logger(__name__)

UpdateCallback = Callable[[t.SessionUpdate], None]


@frozen
class ConnectArgs:
    """What a connector needs to start one agent process."""

    #: the process's label in logs and transcripts: the agent's name, ``claude#2`` for a second
    label: str
    #: the process's working directory
    cwd: str
    #: connection-level services (sessions bring their own)
    services: ClientServices
    #: client options for the handshake and turns
    options: ClientOptions
    #: where to record the wire transcript, if anywhere
    transcript: TranscriptWriter | None
    #: the Landlock sandbox to start the process in (its session's branch directory among its
    #: writable paths), or None
    sandbox: Sandbox | None = None


#: Starts one agent and yields its initialized connection (the block's end stops it). A
#: connector that cannot start the agent in ``args.sandbox`` must refuse
#: (:class:`~orchestrator.errors.SandboxUnavailable`), never start it unconfined.
Connector = Callable[[AgentSpec, ConnectArgs], AbstractAsyncContextManager[AgentConnection]]


def subprocess_connector(
    spec: AgentSpec, args: ConnectArgs
) -> AbstractAsyncContextManager[AgentConnection]:
    """The default connector: the spec's command as a subprocess speaking ACP on stdio."""
    return open_agent(
        list(spec.command),
        name=args.label,
        cwd=args.cwd,
        env=dict(spec.env) or None,
        services=args.services,
        options=args.options,
        transcript=args.transcript,
        sandbox=args.sandbox,
    )


@frozen
class Limits:
    """Supervisor-wide limits."""

    #: live sessions at once, over all agents (None: no global bound)
    max_sessions: int | None = None
    #: first delay before restarting a crashed agent; doubles per consecutive crash
    backoff: float = 0.5
    #: the longest restart delay
    max_backoff: float = 30.0
    #: how long closing a session may take before the process is retired instead
    close_timeout: float = 5.0
    #: what a wire transcript keeps of one turn, in bytes (None: all of it); see
    #: :class:`~orchestrator.agent.transcript.TranscriptWriter`
    max_turn_transcript_bytes: int | None = DEFAULT_MAX_TURN_RECORD_BYTES

    def __attrs_post_init__(self) -> None:
        if self.max_sessions is not None and self.max_sessions < 1:
            raise ValueError("max_sessions must be at least 1")


class _Unrouted:
    """Connection-level services: every request belongs to a session with its own services."""

    async def read_text_file(self, request: Any, ctx: SessionContext) -> Any:
        raise ResourceNotFound(f"no file system for session {ctx.session_id}")

    async def write_text_file(self, request: Any, ctx: SessionContext) -> Any:
        raise ResourceNotFound(f"no file system for session {ctx.session_id}")

    async def create(self, request: Any, ctx: SessionContext) -> Any:
        raise ResourceNotFound(f"no terminals for session {ctx.session_id}")

    output = wait_for_exit = kill = release = create


_UNROUTED = _Unrouted()


#: seconds the end of a confined process's session waits for the process to exit
SANDBOXED_EXIT_WAIT = 1.0


@define(eq=False)
class _Process:
    pool: _Pool
    index: int
    conn: AgentConnection | None = None
    #: sessions leased on it now (counted from the moment a lease picks it)
    sessions: int = 0
    served: int = 0
    starting: bool = True
    retiring: bool = False
    dead: bool = False
    crashed: bool = False
    ready: trio.Event = field(factory=trio.Event)
    stop: trio.Event = field(factory=trio.Event)
    exited: trio.Event = field(factory=trio.Event)
    start_error: BaseException | None = None

    @property
    def label(self) -> str:
        # the agent's name for its first process (what errors and transcripts name), then
        # ``name#2``, ``name#3`` for the processes started after it
        name = self.pool.spec.name
        return name if self.index == 1 else f"{name}#{self.index}"

    def has_room(self) -> bool:
        limit = self.pool.per_process
        if self.dead or self.retiring:
            return False
        if self.conn is not None and self.conn.rpc.closed:
            return False
        return limit is None or self.sessions < limit

    def retire(self) -> None:
        self.retiring = True
        self.stop.set()


@define(eq=False)
class _Pool:
    spec: AgentSpec
    slots: trio.Semaphore | None
    processes: list[_Process] = field(factory=list)
    spawned: int = 0
    crashes: int = 0
    restarts: int = 0
    unreplaced: int = 0
    consecutive: int = 0
    last_crash: float = -math.inf
    sessions: int = 0
    turns: int = 0
    turns_total: int = 0

    @property
    def per_process(self) -> int | None:
        """Sessions one process serves: one when sandboxed, its rules being its branch's."""
        return 1 if self.spec.sandbox else self.spec.sessions_per_process


@frozen(eq=False)
class Lease:
    """A session leased from the supervisor for one step (or one attempt of it)."""

    #: the agent's spec
    spec: AgentSpec
    #: the ACP session, in the lease's ``cwd``
    session: AcpSession
    #: the process label, e.g. ``claude#2``
    process: str
    _supervisor: Supervisor
    _proc: _Process

    @property
    def connection(self) -> AgentConnection:
        """The connection the session lives on."""
        return self.session.connection

    async def prompt(
        self,
        prompt: PromptInput,
        *,
        timeout: float | None = None,
        idle_timeout: float | None = None,
        on_update: UpdateCallback | None = None,
    ) -> TurnResult:
        """Run one turn, counted in the statistics; an agent that ignores a cancel is killed.

        ``timeout`` bounds the turn and ``idle_timeout`` the silence between updates; past
        either the turn is cancelled (:class:`~orchestrator.errors.TurnTimeout`). A caller
        cancelled mid-turn gets :meth:`AcpSession.prompt`'s handshake before ``Cancelled``
        goes on (``session.last_result`` holds what the turn did); a process whose agent did
        not end the turn is retired when the lease ends.
        """
        pool = self._proc.pool
        pool.turns += 1
        pool.turns_total += 1
        self._supervisor._turns += 1
        try:
            return await self.session.prompt(
                prompt, timeout=timeout, idle_timeout=idle_timeout, on_update=on_update
            )
        except AgentHung as e:
            if e.unresponsive:
                log.warning("killing unresponsive agent", agent=self.process)
                self._proc.retire()
            raise
        finally:
            pool.turns -= 1
            self._supervisor._turns -= 1


@define(eq=False)
class Supervisor:
    """Owns agent processes and leases their sessions; make one with :func:`open_supervisor`."""

    _nursery: trio.Nursery
    limits: Limits = field(factory=Limits)
    connector: Connector = subprocess_connector
    options: ClientOptions = field(factory=ClientOptions)
    #: a directory for one wire transcript per process (``<label>.jsonl``), or None
    transcripts: Path | None = None
    #: a file that gets every process's transcript lines too, as they come (with
    #: ``transcripts``), or None
    transcript_copy: TranscriptFile | None = None
    #: the directory agent processes run in when their spec names none and sessions are shared
    workdir: str = "."
    _pools: dict[tuple[str, AgentIdentity, Any], _Pool] = field(factory=dict)
    #: the last process number given per label: process labels (and transcript files) stay
    #: distinct even when two different agents share a label
    _numbers: dict[str, int] = field(factory=dict)
    _slots: trio.Semaphore | None = None
    _sessions: int = 0
    _peak_sessions: int = 0
    _turns: int = 0
    _closing: bool = False

    def __attrs_post_init__(self) -> None:
        if self.limits.max_sessions is not None:
            self._slots = trio.Semaphore(self.limits.max_sessions)

    # ------------------------------------------------------------------ leases

    @asynccontextmanager
    async def lease(
        self,
        spec: AgentSpec,
        *,
        cwd: str | os.PathLike[str],
        services: ClientServices | None = None,
        step: str | None = None,
        mcp_servers: Sequence[t.McpServer] = (),
        instance: str | None = None,
    ) -> AsyncIterator[Lease]:
        """A new session of ``spec`` in ``cwd``, on a pooled process, for the block's duration.

        ``step`` is the session's step (its name, which policies scope by); ``instance``, the
        step instance it serves (``rename[a.py]``), is what ``session/new`` names when the
        agent's connection asks for it (``ClientOptions.step_meta``).

        Waits for room under the global and the agent's limits. A spec with a
        :attr:`~orchestrator.agents.AgentSpec.sandbox` gets a process per session, confined to
        ``cwd`` (its branch directory) from its start. The session is closed (or its
        process retired) at the end; if the process died or hung meanwhile, it is replaced on a
        later lease. Errors: :class:`~orchestrator.errors.AgentStartError` when the agent cannot
        start, :class:`~orchestrator.errors.AgentError` when its restart budget is spent.
        """
        if self._closing:
            raise AgentError("the supervisor is shutting down", agent=spec.name)
        pool = self._pool(spec)
        # The agent's own slot first: waiters queued behind a small per-agent limit must not
        # hold global slots that other agents' leases could use.
        async with _acquired(pool.slots), _acquired(self._slots):
            proc = await self._acquire(pool, os.fspath(cwd))
            try:
                assert proc.conn is not None
                session = await proc.conn.new_session(
                    cwd, services=services, step=step, mcp_servers=mcp_servers, instance=instance
                )
            except BaseException:
                proc.sessions -= 1
                self._after_session(proc)
                raise
            proc.served += 1
            pool.sessions += 1
            self._sessions += 1
            self._peak_sessions = max(self._peak_sessions, self._sessions)
            log.debug("session leased", agent=proc.label, session=session.session_id, step=step)
            try:
                yield Lease(spec, session, proc.label, self, proc)
                # a finished lease is evidence the agent works again
                pool.consecutive = 0
            finally:
                pool.sessions -= 1
                self._sessions -= 1
                with trio.CancelScope(shield=True):
                    await self._end_session(proc, session)

    def _pool(self, spec: AgentSpec) -> _Pool:
        # One pool per agent: what runs (its identity) under its label. Two different agents
        # that share a label get a pool each (a label never makes them one); two labels of one
        # agent (alice=demo, bob=demo) keep their own limits, statistics and audit names. Its
        # processes are started in one sandbox (or none): another makes another pool.
        key = (spec.name, spec.identity, spec.sandbox)
        pool = self._pools.get(key)
        if pool is None:
            slots = trio.Semaphore(spec.max_sessions) if spec.max_sessions else None
            pool = self._pools[key] = _Pool(spec, slots)
        elif pool.spec != spec:
            raise AgentError(
                f"agent {spec.name!r} is leased with two different settings for one command",
                agent=spec.name,
            )
        return pool

    async def _acquire(self, pool: _Pool, cwd: str) -> _Process:
        """A process with room for one more session; started if none has room."""
        while True:
            for proc in pool.processes:
                if proc.has_room():
                    proc.sessions += 1
                    if proc.starting:
                        try:
                            await proc.ready.wait()
                        except BaseException:
                            proc.sessions -= 1  # cancelled while waiting: give the room back
                            raise
                        if proc.start_error is not None:
                            proc.sessions -= 1
                            # every waiter gets its own error; the starter raised the original
                            raise AgentStartError(
                                f"the agent failed to start: {proc.start_error}",
                                agent=pool.spec.name,
                            ) from proc.start_error
                        if proc.dead:  # it started and died already: look again
                            proc.sessions -= 1
                            continue
                    return proc
            number = self._numbers[pool.spec.name] = self._numbers.get(pool.spec.name, 0) + 1
            proc = _Process(pool, number)
            proc.sessions = 1
            pool.processes.append(proc)
            try:
                await self._start(proc, cwd)
            except BaseException as e:
                proc.sessions -= 1
                if not isinstance(e, trio.Cancelled) and proc.start_error is None:
                    proc.start_error = e
                proc.dead = True
                if proc in pool.processes:
                    pool.processes.remove(proc)
                proc.ready.set()
                raise
            return proc

    async def _start(self, proc: _Process, cwd: str) -> None:
        pool = proc.pool
        spec = pool.spec
        if pool.unreplaced:
            if pool.restarts >= spec.max_restarts:
                raise AgentError(
                    f"restart budget spent: the agent crashed {pool.crashes} times and was "
                    f"restarted {pool.restarts} times (max_restarts={spec.max_restarts})",
                    agent=spec.name,
                )
            pool.restarts += 1
            pool.unreplaced -= 1
            delay = min(
                self.limits.max_backoff,
                self.limits.backoff * 2 ** max(pool.consecutive - 1, 0),
            )
            wait = pool.last_crash + delay - trio.current_time()
            log.info("restarting agent", agent=proc.label, after=round(max(wait, 0.0), 3))
            if wait > 0:
                await trio.sleep(wait)
        await self._nursery.start(self._run_process, proc, cwd)
        pool.spawned += 1

    async def _run_process(
        self,
        proc: _Process,
        session_cwd: str,
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        spec = proc.pool.spec
        options = attrs.evolve(
            self.options,
            init_timeout=spec.startup_timeout,
            auth_method=spec.auth_method or self.options.auth_method,
        )
        transcript = None
        if self.transcripts is not None:
            transcript = TranscriptWriter(
                self.transcripts / f"{proc.label}.jsonl",
                agent=proc.label,
                max_turn_bytes=self.limits.max_turn_transcript_bytes,
                copy_to=self.transcript_copy,
            )
        sandbox = _sandbox_of(spec, session_cwd)
        args = ConnectArgs(
            label=proc.label,
            # a one-session agent runs where its session does; a shared one somewhere neutral
            cwd=spec.cwd or (session_cwd if proc.pool.per_process == 1 else self.workdir),
            services=ClientServices(fs=_UNROUTED, terminal=_UNROUTED),
            options=options,
            transcript=transcript,
            sandbox=sandbox,
        )
        started = False
        try:
            async with self.connector(spec, args) as conn:
                # A lease cancelled while the agent started (no checkpoint may have seen it):
                # trio would leave this task under that cancelled lease (``started()`` does
                # nothing then), where the shielded wait below would never end.
                await trio.lowlevel.checkpoint_if_cancelled()
                proc.conn = conn
                conn.agent = spec.name  # audit records name the agent, not the process
                proc.starting = False
                started = True
                proc.ready.set()
                task_status.started()
                # Shielded: when the supervisor's caller is cancelled (Ctrl-C), the turns on
                # this process are ended the ACP way and recorded before it is stopped. It
                # stops when retired, at the latest when the supervisor closes.
                with trio.CancelScope(shield=True):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(self._watch_exit, proc, conn, nursery.cancel_scope)
                        await proc.stop.wait()
                        nursery.cancel_scope.cancel()
        except OrchestratorError as e:
            if not started:
                # before waiters wake (below): they must see the error, not retry the start
                proc.start_error = e
                raise
            # an agent that ends badly is an expected end: its leases already saw the error
            log.warning("agent process ended with an error", agent=proc.label, error=str(e))
        finally:
            proc.dead = True
            proc.starting = False
            if proc in proc.pool.processes:
                proc.pool.processes.remove(proc)
            proc.exited.set()
            if not started:
                proc.ready.set()

    async def _watch_exit(
        self, proc: _Process, conn: AgentConnection, scope: trio.CancelScope
    ) -> None:
        reason = await conn.rpc.wait_closed()
        if not proc.stop.is_set():
            pool = proc.pool
            proc.dead = proc.crashed = True
            pool.crashes += 1
            pool.unreplaced += 1
            pool.consecutive += 1
            pool.last_crash = trio.current_time()
            log.warning(
                "agent process exited unexpectedly",
                agent=proc.label,
                reason=str(reason),
                sessions=proc.sessions,
            )
        scope.cancel()

    async def _end_session(self, proc: _Process, session: AcpSession) -> None:
        conn = proc.conn
        try:
            if conn is None or conn.rpc.closed or proc.dead:
                await session.release()  # the services' own clean-up (terminals, memory)
                return
            last = session.last_result
            hung = last is not None and last.stop_reason is None
            if proc.pool.per_process == 1 or hung:
                # one session per process, or an agent that did not end its turn (it ignored
                # session/cancel): the process goes, and the session with it
                await session.release()
                proc.retire()
                if proc.pool.spec.sandbox:
                    # a confined process works in its session's directory (a branch
                    # directory): gone, it leaves the directory free to reuse at once. Not
                    # long: one that ignores the end of its input is stopped meanwhile.
                    with trio.move_on_after(SANDBOXED_EXIT_WAIT):
                        await proc.exited.wait()
                return
            caps = conn.agent_capabilities.session_capabilities
            if caps is not None and caps.close is not None:
                with grace_period(self.limits.close_timeout) as scope:
                    try:
                        await conn.close_session(session.session_id)
                    except OrchestratorError as e:
                        log.debug("session/close failed", agent=proc.label, error=str(e))
                if scope.cancelled_caught:
                    proc.retire()
            await session.release()
            conn.sessions.pop(session.session_id, None)
        finally:
            proc.sessions -= 1
            self._after_session(proc)

    def _after_session(self, proc: _Process) -> None:
        """Retire a process nobody will use again."""
        if proc.sessions == 0 and self._closing:
            proc.retire()

    # ------------------------------------------------------------------ inspection

    def statistics(self) -> dict[str, Any]:
        """Live processes, sessions and turns, and restarts, overall and per agent."""
        agents: dict[str, dict[str, int]] = {}
        for pool in self._pools.values():
            counts = {
                "processes": sum(1 for p in pool.processes if not p.dead),
                "sessions": pool.sessions,
                "turns": pool.turns,
                "turnsTotal": pool.turns_total,
                "spawned": pool.spawned,
                "crashes": pool.crashes,
                "restarts": pool.restarts,
            }
            # by label: pools that share one (different agents, same label) add up
            totals = agents.setdefault(pool.spec.name, dict.fromkeys(counts, 0))
            for key, value in counts.items():
                totals[key] += value
        return {
            "processes": sum(a["processes"] for a in agents.values()),
            "sessions": self._sessions,
            "peakSessions": self._peak_sessions,
            "turns": self._turns,
            "spawned": sum(a["spawned"] for a in agents.values()),
            "crashes": sum(a["crashes"] for a in agents.values()),
            "restarts": sum(a["restarts"] for a in agents.values()),
            "agents": agents,
        }

    def transcript_files(self) -> list[Path]:
        """The wire transcripts written so far, one per process."""
        if self.transcripts is None or not self.transcripts.is_dir():
            return []
        return sorted(self.transcripts.glob("*.jsonl"))

    async def aclose(self) -> None:
        """Stop every process (the shutdown ladder) and wait until all have exited."""
        self._closing = True
        procs = [p for pool in self._pools.values() for p in pool.processes]
        for proc in procs:
            proc.retire()
        with trio.CancelScope(shield=True):
            for proc in procs:
                if not proc.starting:
                    await proc.exited.wait()


def _sandbox_of(spec: AgentSpec, session_cwd: str) -> Sandbox | None:
    """The sandbox of a process of ``spec`` serving the session in ``session_cwd``."""
    if not spec.sandbox:
        return None
    sandbox = spec.sandbox if isinstance(spec.sandbox, Sandbox) else Sandbox()
    if spec.cwd is None:
        return sandbox
    # it runs elsewhere, and its session's branch directory is where it must write
    return attrs.evolve(sandbox, write=(session_cwd, *sandbox.write))


@asynccontextmanager
async def _acquired(semaphore: trio.Semaphore | None) -> AsyncIterator[None]:
    if semaphore is None:
        yield
        return
    async with semaphore:
        yield


@asynccontextmanager
async def open_supervisor(
    limits: Limits | None = None,
    *,
    connector: Connector | None = None,
    options: ClientOptions | None = None,
    transcripts: str | os.PathLike[str] | None = None,
    workdir: str | os.PathLike[str] | None = None,
    transcript_copy: TranscriptFile | None = None,
) -> AsyncIterator[Supervisor]:
    """A supervisor whose agent processes all end with the block.

    ``transcripts`` is a directory for one wire transcript per process, ``transcript_copy``
    a file that gets their lines too, as they come (its owner runs and closes it);
    ``workdir`` is where processes run when their spec names no ``cwd`` (default: the
    current directory).
    """
    tdir = Path(transcripts) if transcripts is not None else None
    if tdir is not None:
        tdir.mkdir(parents=True, exist_ok=True)
    async with trio.open_nursery() as nursery:
        supervisor = Supervisor(
            nursery,
            limits or Limits(),
            connector or subprocess_connector,
            options or ClientOptions(),
            tdir,
            transcript_copy,
            os.fspath(workdir) if workdir is not None else os.getcwd(),
        )
        try:
            yield supervisor
        finally:
            await supervisor.aclose()
