"""Find and kill the processes of a process tree by the marker in their environment.

Every process the orchestrator starts gets ``ORCHESTRATOR_TREE`` in its environment: the
markers it inherited from an orchestrator above it, then its own token, joined by ``:``. Its
descendants inherit the variable, also those that leave its process group or session
(``setsid``, a double fork), so :func:`kill_trees` finds them wherever they were reparented by
reading ``/proc/PID/environ``, the environment a process was started with. A process that
lives in a session led by a marked process (or in a session the caller names, a tree's leader)
is part of the tree too, whatever its environment: sessions are only inherited, so that session
was created inside the tree.

Standard library only: the orchestrator's watchdog runs this file as ``python -I -S _sweep.py
NONCE SINCE`` once the orchestrator is gone, to kill every process carrying one of its tokens
(see :func:`kill_orchestrator_trees` and :mod:`orchestrator.agent.reaper`).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Collection, Sequence

__all__ = ["MARKER", "kill_orchestrator_trees", "kill_trees", "markers", "start_time"]

#: the environment variable holding a process's tree tokens
MARKER = "ORCHESTRATOR_TREE"
_KEY = MARKER.encode() + b"="
#: scans per sweep at most: each finds what the previous round's processes forked meanwhile
MAX_ROUNDS = 50
_READ_SIZE = 64 * 1024

#: decides from a process's tokens whether it belongs to the trees being killed
Match = Callable[[Sequence[bytes]], bool]


def markers(environ: bytes) -> list[bytes]:
    """The tokens of ``MARKER`` in a NUL-separated environment block (empty if absent)."""
    pos = environ.find(_KEY)
    while pos >= 0:
        if pos == 0 or environ[pos - 1] == 0:
            start = pos + len(_KEY)
            end = environ.find(b"\0", start)
            value = environ[start:] if end < 0 else environ[start:end]
            return [token for token in value.split(b":") if token]
        pos = environ.find(_KEY, pos + 1)
    return []


def _read(path: str) -> bytes | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, _READ_SIZE)
        if len(data) == _READ_SIZE:
            chunks = [data]
            while chunk := os.read(fd, _READ_SIZE):
                chunks.append(chunk)
            data = b"".join(chunks)
        return data
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat(pid: int) -> tuple[bytes, int, int] | None:
    """State, session id and start time (clock ticks after boot) of ``pid``; None if gone."""
    data = _read(f"/proc/{pid}/stat")
    if data is None:
        return None
    # after "(comm)", which may hold anything: state, ppid, pgrp, session, ... starttime (22nd)
    fields = data.rpartition(b")")[2].split()
    try:
        return fields[0], int(fields[3]), int(fields[19])
    except (IndexError, ValueError):
        return None


def start_time(pid: int) -> int:
    """When ``pid`` started, in the clock ticks of /proc (0 when unknown)."""
    stat = _stat(pid)
    return stat[2] if stat else 0


def running_since(pid: int, started: int) -> bool:
    """Whether ``pid`` is a live process (not a zombie) that started at ``started``."""
    stat = _stat(pid)
    return stat is not None and stat[0] not in (b"Z", b"X") and stat[2] == started


def _scan(
    match: Match,
    sessions: Collection[int],
    since: int,
    skip: dict[int, int],
    skip_pids: Collection[int],
) -> tuple[dict[int, int], set[int]] | None:
    """One pass over /proc: the live processes of the trees, and the sessions marked ones lead.

    Returns ``{pid: start time}`` and the session ids; None when /proc cannot be listed.
    ``skip`` maps the processes already killed to their start times.
    """
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    found: dict[int, int] = {}
    marked_sessions: set[int] = set()
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        if pid in skip_pids:
            continue
        stat = _stat(pid)
        if stat is None or stat[0] in (b"Z", b"X"):
            continue  # gone, or dead and waiting to be reaped
        _, session, started = stat
        if started < since or skip.get(pid) == started:
            continue  # older than the trees' owner (so not a descendant), or killed already
        if session in sessions:
            found[pid] = started
            continue
        environ = _read(f"/proc/{pid}/environ")
        if environ and _KEY in environ and match(markers(environ)):
            found[pid] = started
            if session == pid:
                # A session it leads was created inside the tree. A marked process in a session
                # it does not lead may be a job a foreign daemon ran with the tree's
                # environment (a build daemon's worker): that session is not the tree's.
                marked_sessions.add(session)
    return found, marked_sessions


def _kill(pid: int, started: int) -> None:
    """SIGKILL ``pid`` if it is still the process that started at ``started``."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):
        pidfd = None
    try:
        # The pidfd pins the process: if the pid still has the same start time now, the pidfd
        # names the process we judged, not a newcomer that reused its pid.
        stat = _stat(pid)
        if stat is None or stat[2] != started:
            return
        if pidfd is not None:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    finally:
        if pidfd is not None:
            os.close(pidfd)


def kill_trees(match: Match, sessions: Collection[int] = (), since: int = 0) -> list[int]:
    """SIGKILL every process of the trees; return the pids killed.

    A process belongs to the trees when ``match`` accepts its tokens, or it lives in one of
    ``sessions`` or in a session led by a process that ``match`` accepts. Processes that started
    before ``since`` (a :func:`start_time`, the trees' owner's) are passed over unread: they
    cannot descend from it. Scans repeat until one finds nothing new (at most
    :data:`MAX_ROUNDS`): a process killed after a scan may have forked first, and its child
    shows in the next. Never kills this process or pid 1, nor takes its own session whole.
    Where there is no /proc (not Linux) it does nothing.
    """
    own = {0, os.getsid(0)}
    spared = (1, os.getpid())
    wanted = {s for s in sessions if s not in own}
    killed: dict[int, int] = {}
    for _ in range(MAX_ROUNDS):
        scanned = _scan(match, wanted, since, killed, spared)
        if scanned is None:
            break
        found, marked_sessions = scanned
        new_sessions = marked_sessions - own - wanted
        wanted |= new_sessions
        if not found and not new_sessions:
            break
        for pid, started in found.items():
            _kill(pid, started)
            killed[pid] = started
    return sorted(killed)


def kill_orchestrator_trees(nonce: str, since: int = 0) -> list[int]:
    """Kill every tree of the orchestrator ``nonce`` (tokens ``NONCE.N``), which started at
    ``since`` (a :func:`start_time`); the watchdog's work once that orchestrator is gone."""
    prefix = nonce.encode() + b"."
    return kill_trees(lambda tokens: any(t.startswith(prefix) for t in tokens), since=since)


if __name__ == "__main__":
    # Its own session already keeps terminal signals away; a stray Ctrl-C must not stop it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    kill_orchestrator_trees(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0)
