"""One process at a time per run: the lock a run (or an apply of it) holds on its directory,
and who holds it.

A run holds an exclusive ``flock`` on ``runs/RUN/lock`` in the state directory while it runs,
and so does an apply of it; the lock goes with the process (a crash or a SIGKILL releases it),
so a run whose record still says ``running`` but whose lock is free is one whose process died.

The holder also writes who it is into the lock file: its pid, its start time, the kernel's boot
id, its pid namespace and its host name. A reader can then tell whether a run recorded
``running`` still has its process without taking the lock (which would make a resume starting
at that moment find it busy): on the same boot of the same kernel, in the same pid namespace,
a pid whose process started at the recorded time is the owner, and a pid that is gone, a zombie
or a later process means the owner is gone. Elsewhere (another machine sharing the state
directory, another container, a record this release did not write) nothing can be told.
"""

from __future__ import annotations

import fcntl
import os
import socket
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any, Literal

import orjson
import trio
from attrs import frozen

from ..agent.reaper import process_started, same_process
from ..errors import RunBusy

__all__ = [
    "RunOwner",
    "hold_run_lock",
    "move_leftovers",
    "probe_run_lock",
    "run_owner",
    "wait_run_lock",
]

LOCK_NAME = "lock"


@frozen
class RunOwner:
    """Whether the process that holds (or last held) a run's lock is alive, as far as this
    process can tell."""

    #: ``alive``, ``gone``, or ``unknown`` (another machine, container or boot; no record)
    state: Literal["alive", "gone", "unknown"]
    #: the owner's pid and host, when recorded
    pid: int | None = None
    host: str | None = None

    @property
    def reason(self) -> str | None:
        """Why a run recorded ``running`` reads as it does, for people; None if it runs."""
        if self.state == "gone":
            return "its process is gone"
        if self.state == "unknown":
            who = f"process {self.pid} on {self.host}" if self.pid is not None else "its process"
            return f"unknown whether {who} is alive: it cannot be checked from here"
        return None


def _identity() -> dict[str, Any]:
    """This process as a lock file records it."""
    return {
        "pid": os.getpid(),
        "uid": os.getuid(),
        "started": process_started(os.getpid()),
        "boot": _boot_id(),
        "pidNamespace": _pid_namespace(),
        "host": socket.gethostname(),
    }


def _boot_id() -> str | None:
    """The running kernel's boot id (new at each boot), if it can be read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def _pid_namespace() -> str | None:
    """This process's pid namespace (pids name processes only within one), if it can be read."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


@contextmanager
def hold_run_lock(run_dir: Path, run_id: str, *, doing: str) -> Iterator[None]:
    """Hold run ``run_id``'s lock for the block; :class:`RunBusy` if another process has it.

    ``doing`` says what the refused caller wanted, for the message (``resume``, ``apply``).
    The lock file then says who holds it (:func:`run_owner` reads it).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunBusy(
                f"run {run_id} is running in another process: cannot {doing} it now", run_id
            ) from None
        record = orjson.dumps(_identity())
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        yield
    finally:
        os.close(fd)  # closing the file releases the lock


#: seconds :func:`wait_run_lock` waits for a run's lock by default
LOCK_PATIENCE = 10.0
#: seconds between two tries
_LOCK_POLL = 0.02


@asynccontextmanager
async def wait_run_lock(
    run_dir: Path, run_id: str, *, doing: str, patience: float = LOCK_PATIENCE
) -> AsyncIterator[None]:
    """:func:`hold_run_lock`, waiting up to ``patience`` seconds for it (cancellably) when it
    is held: another run of the same process or state directory takes a finished run's lock for
    a moment to move its leftover directories (:func:`move_leftovers`), and a batch that applies
    its repositories' runs one after another must not fail for that. :class:`RunBusy` when it
    is still held after that."""
    deadline = trio.current_time() + patience
    while True:
        try:
            lock = hold_run_lock(run_dir, run_id, doing=doing)
            lock.__enter__()
        except RunBusy:
            if trio.current_time() >= deadline:
                raise
            await trio.sleep(_LOCK_POLL)
            continue
        break
    try:
        yield
    finally:
        lock.__exit__(None, None, None)


def probe_run_lock(run_dir: Path) -> bool:
    """Whether the lock of the run in ``run_dir`` is free (or missing): taken and released at
    once, nothing created. A process starting on the run at that moment finds it busy."""
    try:
        fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # not a lock that can be taken: not known to be free
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
    return True


def run_owner(run_dir: Path) -> RunOwner:
    """Whether the process that last took the lock of the run in ``run_dir`` is alive.

    ``unknown`` unless this process can check it: the record must be this boot's, from this
    pid namespace (a pid is checked with its start time, so a reused pid is not taken for the
    owner).
    """
    try:
        owner = orjson.loads((run_dir / LOCK_NAME).read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return RunOwner("unknown")  # no record (an older release), or one being written
    if not isinstance(owner, dict):
        return RunOwner("unknown")
    pid, started, host = owner.get("pid"), owner.get("started"), owner.get("host")
    if not isinstance(pid, int) or not isinstance(host, str):
        return RunOwner("unknown")
    here = (
        owner.get("boot") is not None
        and owner.get("boot") == _boot_id()
        and owner.get("pidNamespace") is not None
        and owner.get("pidNamespace") == _pid_namespace()
    )
    if not here or not isinstance(started, int):
        return RunOwner("unknown", pid, host)
    alive = same_process(pid, started)
    if alive is None:  # no /proc to look in
        return RunOwner("unknown", pid, host)
    hidden = os.getuid() != 0 and owner.get("uid") != os.getuid()
    if not alive and hidden and not os.path.exists(f"/proc/{pid}"):
        # another user's process may be hidden from this one (/proc mounted hidepid)
        return RunOwner("unknown", pid, host)
    return RunOwner("alive" if alive else "gone", pid, host)


#: what a run leaves in its directory that is nobody's once its process is gone
_LEFTOVERS = ("branches", "trash")


def move_leftovers(runs: Path, trash: Path) -> int:
    """Move the branch directories and trash of runs in ``runs`` whose process is gone (their
    lock is free) into ``trash``, to be deleted there; how many folders were moved.

    A run killed (SIGKILL, a crash) deletes nothing: without this its copies of the workspace
    would stay forever. The lock is held while they move, so a resume starting meanwhile waits
    for none of it (it finds the run busy for that moment only). Renames only: cheap.
    """
    moved = 0
    try:
        names = os.listdir(runs)
    except OSError:
        return 0
    for name in names:
        run_dir = runs / name
        found = [kind for kind in _LEFTOVERS if (run_dir / kind).is_dir()]
        if not found or run_dir / "trash" == trash:
            continue
        try:
            fd = os.open(run_dir / LOCK_NAME, os.O_RDWR | os.O_CLOEXEC)
        except OSError:
            continue  # no lock: not a run's directory (or one from before locks)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # running
            trash.mkdir(parents=True, exist_ok=True)
            for kind in found:
                try:
                    os.rename(run_dir / kind, trash / f"{name}.{kind}")
                    moved += 1
                except OSError:
                    pass  # moved by another run meanwhile, or across filesystems: left there
        finally:
            os.close(fd)
    return moved
