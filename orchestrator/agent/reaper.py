"""No process the orchestrator starts outlives its owner: every descendant included.

Agents, terminal commands and verify commands each start in a session of their own, so a
signal to the process group reaches what they start, but a descendant can leave the group
(``setsid``, ``setpgid``, a double fork), and a group outlives the orchestrator if the
orchestrator is killed. Two mechanisms close those gaps, on Linux:

- **Markers.** Each started process is a :class:`ProcessTree`: its environment gets
  ``ORCHESTRATOR_TREE`` holding a token of its own (after the tokens of any orchestrator above
  this one). Its descendants inherit it wherever they move, so when the tree is released
  (:func:`release_tree`: the agent exited, the terminal was killed or released, the command
  ended) a sweep of ``/proc`` finds and kills every live process carrying the token, and every
  member of a session led by one of those or, when the caller names it, of the tree's own
  session (see :mod:`._sweep`). Sweeps that overlap in time are merged into one pass in a
  worker thread; processes older than this one are passed over unread.
- **The watchdog.** The first tree of a process starts one small watchdog process (``/bin/sh``
  in a session of its own, an environment without credentials) that blocks reading a pipe from
  this process. When this process exits, however it dies (``SIGKILL`` included), the pipe
  reaches EOF and the watchdog becomes ``python -I -S _sweep.py`` (standard library only), which
  kills every process carrying one of this process's tokens, and the members of the sessions
  they lead. An orderly exit with no tree left open (:func:`stop_watchdog`, also run at
  interpreter exit) writes ``q`` first: the watchdog ends without starting Python.

The orchestrator does not make itself a child subreaper (``PR_SET_CHILD_SUBREAPER``): in a host
program that embeds the library, the orphaned grandchildren of the host's own children would
become the host's children, left as zombies unless it reaps them; the markers find a tree's
descendants wherever they were reparented instead. It uses no ``PR_SET_PDEATHSIG`` either: the
signal follows the exit of the spawning *thread* (trio spawns from worker threads that end when
idle), would reach only direct children, and needs a ``preexec_fn``, which costs the fast
``vfork`` spawn.

Limits: a descendant that leaves the group *and* starts a program with an environment without
the marker (``env -i``, or a program that builds its children's environment from scratch) is
found only while it stays in one of those sessions; one that changes its pid faster than the
sweep can follow (forks and exits in a loop, over :data:`._sweep.MAX_ROUNDS` scans), or runs
under another user id whose environment cannot be read (a setuid program), is not found. Only a
cgroup could contain those. A marked process in a session it does not lead (a job a daemon
started before the run carried out with the tree's environment) is killed, but not its session.
If the watchdog itself is killed together with the orchestrator, nothing ends the orphans.
Without ``/proc`` (not Linux) only the process groups are signalled.
"""

from __future__ import annotations

import atexit
import itertools
import os
import subprocess
import sys
import threading
from collections.abc import Mapping, Sequence

import trio
from attrs import define, field, frozen

from .._log import get_logger
from . import _sweep

__all__ = [
    "MARKER",
    "ProcessTree",
    "close_tree",
    "detach_watchdog",
    "open_tree",
    "process_started",
    "release_tree",
    "same_process",
    "stop_watchdog",
    "watchdog_command",
]

log = get_logger(__name__)

#: The environment variable that marks a started process and its descendants.
MARKER = _sweep.MARKER
#: Seconds :func:`stop_watchdog` waits for the watchdog to finish.
WATCHDOG_EXIT_WAIT = 5.0

_HAVE_PROC = os.path.isfile("/proc/self/environ")
# The watchdog waits in a shell (a Python start costs ten times more) and runs the sweep, its
# arguments, only when the pipe ends without the word "q".
_WATCH = 'read -r word; [ "$word" = q ] || exec "$@"'


def watchdog_command(nonce: str, since: int) -> list[str]:
    """The watchdog of the orchestrator ``nonce`` (started at ``since``), to run with the read
    end of its pipe on stdin."""
    sweep = [sys.executable, "-I", "-S", _sweep.__file__, nonce, str(since)]
    return ["/bin/sh", "-c", _WATCH, "orchestrator-watchdog", *sweep]


@frozen
class ProcessTree:
    """One started process and everything that descends from it, named by a token."""

    token: str
    """This tree's token, unique in this process's lifetime."""
    value: str
    """The whole value of :data:`MARKER` for the process: inherited tokens, then ``token``."""

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with this tree's marker set (whatever ``base`` had under that name)."""
        return {**base, MARKER: self.value}


class _Containment:
    """The process-wide state: this process's nonce, its open trees and its watchdog."""

    def __init__(self) -> None:
        self.reset()

    #: start the watchdog detached from this process (see :func:`detach_watchdog`)
    detached = False

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.nonce = os.urandom(8).hex()
        self.counter = itertools.count(1)
        self.open: set[str] = set()
        # processes older than this one cannot descend from it: sweeps pass over them unread
        self.since = _sweep.start_time(os.getpid())
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.pipe: int | None = None
        self.tried = False

    def open_tree(self) -> ProcessTree:
        with self.lock:
            if not self.tried:
                self.tried = True
                self._start_watchdog()
            token = f"{self.nonce}.{next(self.counter)}"
            self.open.add(token)
        inherited = os.environ.get(MARKER)
        return ProcessTree(token, f"{inherited}:{token}" if inherited else token)

    def close_tree(self, tree: ProcessTree) -> None:
        with self.lock:
            self.open.discard(tree.token)

    def _start_watchdog(self) -> None:
        if not _HAVE_PROC or not sys.executable or not os.path.isfile(_sweep.__file__):
            return
        read_end, write_end = os.pipe()  # close-on-exec: only the watchdog gets the read end
        # No credentials in its environment: only the markers above, so that the sweep of an
        # orchestrator above this one takes it along.
        inherited = os.environ.get(MARKER)
        command = watchdog_command(self.nonce, self.since)
        if self.detached:
            # started by a shell that exits at once: not a child of this process (a host that
            # kills its worker's children with it, as Ray does, would kill the watchdog too);
            # the pipe is its stdin still (a background job's would be /dev/null)
            command = ["/bin/sh", "-c", 'exec 3<&0; "$@" 0<&3 3<&- &', "detach", *command]
        try:
            watchdog = subprocess.Popen(
                command,
                stdin=read_end,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd="/",
                env={MARKER: inherited} if inherited else {},
                start_new_session=True,
            )
        except OSError as exc:
            os.close(write_end)
            log.warning("cannot start the process watchdog", error=str(exc))
            return
        finally:
            os.close(read_end)
        self.watchdog, self.pipe = watchdog, write_end

    def stop_watchdog(self, wait: float) -> None:
        with self.lock:
            watchdog, pipe = self.watchdog, self.pipe
            self.watchdog = self.pipe = None
            self.tried = False
            if pipe is None:
                return
            try:
                if not self.open:
                    os.write(pipe, b"q\n")
            except OSError:
                pass
            finally:
                os.close(pipe)
        assert watchdog is not None
        try:
            watchdog.wait(wait)
        except subprocess.TimeoutExpired:
            log.warning("the process watchdog is still sweeping", pid=watchdog.pid)

    def after_fork_in_child(self) -> None:
        # A forked child is another process: a nonce and a watchdog of its own (the lock may
        # have been held by another thread at the fork), and it must not hold the parent's
        # pipe open, or the parent's watchdog would not see the parent's death.
        if self.pipe is not None:
            os.close(self.pipe)
        if self.watchdog is not None:
            _parents_watchdogs.append(self.watchdog)  # not this process's child: never waited on
        self.reset()


_CONTAINMENT = _Containment()
_parents_watchdogs: list[subprocess.Popen[bytes]] = []
os.register_at_fork(after_in_child=_CONTAINMENT.after_fork_in_child)
atexit.register(lambda: stop_watchdog())


def detach_watchdog() -> None:
    """Start this process's watchdog (when its first tree opens) as no child of it, but of
    init: for a process whose host kills its children when it ends it (a Ray worker), which
    would kill the watchdog before it sweeps. On an orderly exit the watchdog is not waited
    for then: it is not this process's child."""
    _CONTAINMENT.detached = True


def open_tree() -> ProcessTree:
    """A new tree for a process about to start; put :meth:`ProcessTree.environment` in its env.

    The first call in a process starts the watchdog.
    """
    return _CONTAINMENT.open_tree()


def close_tree(tree: ProcessTree) -> None:
    """Forget ``tree`` without a sweep (its process never started)."""
    _CONTAINMENT.close_tree(tree)


async def release_tree(tree: ProcessTree, session: int | None = None) -> None:
    """Kill every live process of ``tree``, then forget it; shielded.

    ``session`` is the session the tree's process started (its pid): the members of that
    session die too, whatever their environment. Call it once the process group was killed.
    """
    with trio.CancelScope(shield=True):
        try:
            if _HAVE_PROC:
                await _sweeper().sweep(tree.token.encode(), session)
        finally:
            close_tree(tree)


def stop_watchdog(wait: float = WATCHDOG_EXIT_WAIT) -> None:
    """End the watchdog of an exiting process and wait (up to ``wait`` seconds) for it.

    With trees still open it kills them first, as when the process dies. Runs at interpreter
    exit; a program that leaves by ``os._exit`` calls it itself. A later tree starts a new one.
    """
    _CONTAINMENT.stop_watchdog(wait)


def process_started(pid: int) -> int | None:
    """When process ``pid`` started (clock ticks after boot, as /proc says), or None when it
    is not running or there is no /proc. With the pid, it names one process of this boot."""
    if not _HAVE_PROC:
        return None
    return _sweep.start_time(pid) or None


def same_process(pid: int, started: int) -> bool | None:
    """Whether the process ``pid`` that started at ``started`` (:func:`process_started`) still
    runs: False when that pid is gone, a zombie, or now names a later process; None without
    /proc. Only meaningful on the boot, and in the pid namespace, that ``started`` was read in.
    """
    if not _HAVE_PROC:
        return None
    return _sweep.running_since(pid, started)


# --------------------------------------------------------------------------- merged sweeps


@define
class _Sweeper:
    """Merges the sweeps of one trio run: one pass over /proc serves every tree queued by then."""

    _queue: list[tuple[bytes, int | None, trio.Event]] = field(factory=list)
    _busy: trio.Event | None = None

    async def sweep(self, token: bytes, session: int | None) -> None:
        done = trio.Event()
        self._queue.append((token, session, done))
        while not done.is_set():
            if self._busy is not None:
                await self._busy.wait()
                continue
            busy = self._busy = trio.Event()
            batch: list[tuple[bytes, int | None, trio.Event]] = []
            try:
                # One scheduler pass first: the trees released in the same pass (many processes
                # ending at once) join this sweep.
                await trio.lowlevel.cancel_shielded_checkpoint()
                batch, self._queue = self._queue, []
                await self._run(batch)
            finally:
                self._busy = None
                for *_, event in batch:
                    event.set()
                busy.set()

    @staticmethod
    async def _run(batch: list[tuple[bytes, int | None, trio.Event]]) -> None:
        tokens = frozenset(token for token, _, _ in batch)
        sessions = [session for _, session, _ in batch if session is not None]

        def match(found: Sequence[bytes]) -> bool:
            return any(token in tokens for token in found)

        since = _CONTAINMENT.since
        killed = await trio.to_thread.run_sync(_sweep.kill_trees, match, sessions, since)
        if killed:
            log.info("killed processes left by released process trees", pids=killed)


_SWEEPER: trio.lowlevel.RunVar[_Sweeper] = trio.lowlevel.RunVar("orchestrator_sweeper")


def _sweeper() -> _Sweeper:
    try:
        return _SWEEPER.get()
    except LookupError:
        sweeper = _Sweeper()
        _SWEEPER.set(sweeper)
        return sweeper
