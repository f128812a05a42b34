"""Branch directories of a run: making, harvesting and removing them, and what that costs.

:class:`BranchDirs` is the runner's one way to branch directory I/O, timed into a
:class:`BranchIO`. Each operation on a large tree runs in a worker thread; a small tree
(:func:`is_small`) is made and harvested on the event loop, where the system calls cost less
than two thread wake-ups. Finished directories go to a :class:`Reaper`, which removes them in
the background (a small one's files are deleted at once, its folders by the reaper). With a
:class:`~orchestrator.vfs.pool.DirPool`, finished directories are pooled instead and reset
for the next branch of the same tree (see :mod:`orchestrator.vfs.pool`).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import trio
from attrs import define, field

from .._log import get_logger
from ..vfs import Branch, ChangeSet, Snapshot, Workdir, Write, materialize
from ..vfs._fileio import remove_tree
from ..vfs.pool import DirPool
from ..vfs.tree import compose
from ._calls import safe
from .branches import diff_of

__all__ = ["BranchDirs", "BranchIO", "Reaper", "branch_diffs"]

log = get_logger(__name__)

_T = TypeVar("_T")
_U = TypeVar("_U")

#: Trees up to this many files and bytes are made and harvested on the event loop itself: the
#: system calls take less time than handing the work to a thread and back (two wake-ups).
INLINE_MAX_FILES = 16
INLINE_MAX_BYTES = 256 * 1024


def is_small(branch: Branch) -> bool:
    """Whether ``branch`` is small enough for its directory I/O to run on the event loop.

    Counts the workspace's files, and the files written by the steps it was forked from as well
    as its own (a parent may have written a large file).
    """
    root = branch.root
    paths = root.paths()
    try:
        inherited = compose(branch.base, root)
    except TypeError:  # not layered on the workspace: leave it to a thread
        return False
    own = branch.changes
    if len(paths) + len(inherited) + len(own) > INLINE_MAX_FILES:
        return False
    if isinstance(root, Snapshot):
        size = sum(root.stat(path).size for path in paths)
    else:
        size = sum(len(state.data) for path in paths if (state := root.state(path)) is not None)
    for change in (*inherited.values(), *own.values()):
        if isinstance(change, Write):
            size += len(change.data)
    return size <= INLINE_MAX_BYTES


@define(eq=False)
class BranchIO:
    """What a run spent on branch directories: creating, harvesting and removing them.

    ``<kind>_seconds`` is the wall time of the operations (measured around them in their worker
    thread), ``<kind>_cpu_seconds`` their CPU time and ``<kind>_count`` how many ran, for kinds
    ``materialize``, ``harvest`` and ``remove``. ``critical_seconds`` is the wall time during
    which some step waited for its directory to be made or harvested, or the run waited for the
    last removals (``drain_seconds``, also counted in ``critical_seconds``): time that counts in
    the run's wall time. Removals run in the background otherwise, beside the next steps.
    """

    seconds: dict[str, float] = field(factory=dict)
    cpu_seconds: dict[str, float] = field(factory=dict)
    counts: dict[str, int] = field(factory=dict)
    critical_seconds: float = 0.0
    drain_seconds: float = 0.0
    _waiting: int = 0
    _since: float = 0.0

    def add(self, kind: str, count: int, seconds: float, cpu: float) -> None:
        """Count ``count`` operations of ``kind`` that took ``seconds`` (``cpu`` of CPU)."""
        self.seconds[kind] = self.seconds.get(kind, 0.0) + seconds
        self.cpu_seconds[kind] = self.cpu_seconds.get(kind, 0.0) + cpu
        self.counts[kind] = self.counts.get(kind, 0) + count

    def wait_started(self) -> None:
        """A step (or the run) starts waiting for branch I/O."""
        if self._waiting == 0:
            self._since = time.perf_counter()
        self._waiting += 1

    def wait_ended(self) -> None:
        """It stopped waiting (overlapping waits count once)."""
        self._waiting -= 1
        if self._waiting == 0:
            self.critical_seconds += time.perf_counter() - self._since

    def to_json(self) -> dict[str, float | int]:
        """The figures as one flat mapping."""
        out: dict[str, float | int] = {
            "critical_seconds": self.critical_seconds,
            "drain_seconds": self.drain_seconds,
        }
        for kind in ("materialize", "harvest", "remove"):
            out[f"{kind}_seconds"] = self.seconds.get(kind, 0.0)
            out[f"{kind}_cpu_seconds"] = self.cpu_seconds.get(kind, 0.0)
            out[f"{kind}_count"] = self.counts.get(kind, 0)
        return out


def _empty_small(workdir: Workdir, limit: int) -> list[str] | None:
    """Delete the files of ``workdir`` now if it holds at most ``limit`` entries.

    Returns its directories, deepest first, for :class:`Reaper` to remove (an ``rmdir`` may wait
    on the disk's journal); None, with nothing deleted, if the directory holds more entries (an
    agent may have installed dependencies into it).
    """
    dirs: list[str] = []
    files: list[str] = []
    pending = [workdir.root]
    while pending:
        directory = pending.pop()
        dirs.append(directory)
        with os.scandir(directory) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    pending.append(entry.path)
                else:
                    files.append(entry.path)
                if len(dirs) + len(pending) + len(files) > limit:
                    return None
    workdir.close()
    for path in files:
        os.unlink(path)
    dirs.reverse()
    return dirs


def _timed(work: Callable[[], _T]) -> Callable[[], tuple[_T, float, float]]:
    """``work`` returning also its wall and CPU time (measured in the thread that runs it)."""

    def run() -> tuple[_T, float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        result = work()
        return result, time.perf_counter() - wall, time.thread_time() - cpu

    return run


@define(eq=False)
class Reaper:
    """Removes finished branch directories in the background, on a few threads of its own.

    Deleting a directory waits on the filesystem (an ``rmdir`` can take milliseconds on a
    journaled disk that discards freed blocks) and nothing a step reports depends on it, so
    steps queue their directories here and go on: queueing costs no thread hop. The threads
    start with the first directory; :meth:`finish` lets them empty the queue and joins them
    (the run waits for that, also when it is cancelled: no thread outlives the run).
    """

    io: BranchIO
    workers: int = 2
    _queue: queue.SimpleQueue[Workdir | list[str] | str | None] = field(factory=queue.SimpleQueue)
    _threads: list[threading.Thread] = field(factory=list)
    #: per thread: [directories removed, wall seconds, CPU seconds], read after the join
    _totals: list[list[float]] = field(factory=list)

    def put(self, workdir: Workdir | list[str] | str) -> None:
        """Queue ``workdir``, empty directories (deepest first) or a directory's path, for
        removal (never waits)."""
        self._queue.put(workdir)
        if len(self._threads) < self.workers:
            totals = [0.0, 0.0, 0.0]
            thread = threading.Thread(
                target=self._serve, args=(totals,), name="branch-reaper", daemon=True
            )
            self._totals.append(totals)
            self._threads.append(thread)
            thread.start()

    def _serve(self, totals: list[float]) -> None:
        while (workdir := self._queue.get()) is not None:
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                if isinstance(workdir, list):
                    for directory in workdir:
                        os.rmdir(directory)
                elif isinstance(workdir, str):
                    remove_tree(workdir)
                else:
                    workdir.remove()
            except Exception:  # a directory left behind must not stop the others
                where = (
                    workdir[-1]
                    if isinstance(workdir, list)
                    else workdir
                    if isinstance(workdir, str)
                    else workdir.root
                )
                log.exception("removing a branch directory failed", directory=where)
            totals[0] += 1
            totals[1] += time.perf_counter() - wall
            totals[2] += time.thread_time() - cpu

    def _join(self) -> None:
        for _ in self._threads:
            self._queue.put(None)
        for thread in self._threads:
            thread.join()

    async def finish(self) -> None:
        """Wait until every queued directory is removed (shield it when cancelled)."""
        if self._threads:
            await trio.to_thread.run_sync(self._join)
        for count, seconds, cpu in self._totals:
            self.io.add("remove", int(count), seconds, cpu)
        self._threads, self._totals = [], []


def branch_diffs(branch: Branch) -> tuple[ChangeSet, str, str]:
    """A branch's net changes, their diff against the run's base, and its own diff.

    The own diff is of the branch's changes against what it forked from (:func:`diff_of`);
    for a branch forked from the workspace with nothing undone that is the same diff, made once.
    """
    net = branch.net_changes()
    own = branch.changes
    if not net and not own:
        return net, "", ""
    run_diff = diff_of(branch, net)
    if branch.base is branch.root and net == own:
        return net, run_diff, run_diff
    return net, run_diff, diff_of(branch)


@define(eq=False)
class BranchDirs:
    """The branch directories of one run, one level under ``<run_dir>/branches``.

    Every operation that touches them is timed into :attr:`io` and, unless the tree is small,
    waits in a worker thread; a harvest also computes the branch's diffs in the same thread hop
    and keeps them until the instance is recorded (:meth:`take_diffs`).
    """

    run_dir: Path
    io: BranchIO
    #: the limit on a changed file of the run's branches (None: none); see
    #: :attr:`Workdir.max_file_size <orchestrator.vfs.Workdir.max_file_size>`
    max_file_size: int | None = None
    #: finished directories kept for reuse (None: every directory is made fresh and deleted);
    #: its :attr:`~orchestrator.vfs.pool.DirPool.stats` count directories made and reused
    pool: DirPool | None = None
    _reaper: Reaper = field(init=False)
    #: directory names taken in this run (names are made unique)
    _names: set[str] = field(init=False, factory=set)
    #: branch name -> (net changes, diff against the run's base, own diff), from the harvest
    _diffs: dict[str, tuple[ChangeSet, str, str]] = field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self._reaper = Reaper(self.io)

    def directory(self, name: str, attempt: int) -> Path:
        """A fresh directory for one attempt's branch: one level under ``branches/``."""
        base = f"{safe(name)}-{attempt}"
        unique, n = base, 1
        # distinct instance names can look alike once made safe for a file name
        while unique in self._names:
            n += 1
            unique = f"{base}.{n}"
        self._names.add(unique)
        return self.run_dir / "branches" / unique

    async def materialize(
        self, branch: Branch, name: str, attempt: int, *, max_file_size: int | None = None
    ) -> Workdir:
        """Write ``branch`` out into a fresh directory for attempt ``attempt`` of ``name``.

        ``max_file_size`` replaces the run's limit on a changed file for this directory.
        """
        limit = max_file_size if max_file_size is not None else self.max_file_size
        directory = self.directory(name, attempt)
        pool = self.pool
        discarded: list[str] = []

        def make() -> Workdir:
            if pool is not None:
                reused = pool.take(branch, directory, max_file_size=limit, discard=discarded.append)
                if reused is not None:
                    return reused
            made = materialize(branch, directory, max_file_size=limit)
            if pool is not None:
                pool.adopt(made)
            return made

        try:
            result, _ = await self.run_then(
                "materialize", make, lambda: None, inline=is_small(branch)
            )
        finally:
            for path in discarded:
                self._reaper.put(path)
        return result

    def remove(self, workdir: Workdir) -> None:
        """Remove a small ``workdir`` at once, or have it removed in the background.

        A background removal of a tiny directory costs the event loop more than doing it
        here: the reaper thread's Python code competes for the GIL with every system call the
        loop makes meanwhile. A directory the pool takes is pooled (a rename) and only what the
        pool evicts is removed.
        """
        if self.pool is not None and self.pool.holds(workdir):
            for path in self.pool.give(workdir):
                self._reaper.put(path)
            return
        if is_small(workdir.branch):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                dirs = _empty_small(workdir, 2 * INLINE_MAX_FILES)
            except OSError:
                dirs = None  # the reaper tries again and logs what it cannot remove
            seconds = time.perf_counter() - wall
            self.io.critical_seconds += seconds
            self.io.add("remove", 0, seconds, time.thread_time() - cpu)
            if dirs is not None:
                self._reaper.put(dirs)
                return
        self._reaper.put(workdir)

    async def drain(self) -> None:
        """Wait for the last removals (shielded: no thread outlives the run), timed as drain."""
        if self.pool is not None:
            for path in self.pool.clear():
                self._reaper.put(path)
        self.io.wait_started()
        waiting = time.perf_counter()
        with trio.CancelScope(shield=True):
            await self._reaper.finish()
            if self.pool is not None:
                # its folder, empty now (what cannot be removed stays, as with any directory)
                await trio.to_thread.run_sync(self.pool.close)
        self.io.wait_ended()
        self.io.drain_seconds += time.perf_counter() - waiting

    async def run(self, kind: str, work: Callable[[], _T]) -> _T:
        """``work`` (directory I/O of a step) in a worker thread, timed into :attr:`io`."""
        result, _ = await self.run_then(kind, work, lambda: None)
        return result

    async def run_then(
        self, kind: str, work: Callable[[], _T], then: Callable[[], _U], *, inline: bool = False
    ) -> tuple[_T, _U]:
        """:meth:`run`, and ``then`` (not I/O, not timed) in the same thread hop.

        ``inline`` runs both right here instead, for work smaller than a thread hop.
        """
        timed = _timed(work)
        if inline:
            await trio.lowlevel.checkpoint_if_cancelled()
            result, seconds, cpu = timed()
            self.io.add(kind, 1, seconds, cpu)
            self.io.critical_seconds += seconds
            return result, then()

        def both() -> tuple[tuple[_T, float, float], _U, float]:
            first = timed()
            started = time.perf_counter()
            return first, then(), time.perf_counter() - started

        self.io.wait_started()
        try:
            (result, seconds, cpu), after, other = await trio.to_thread.run_sync(both)
        finally:
            self.io.wait_ended()
        self.io.add(kind, 1, seconds, cpu)
        # the waiting time above spans ``then`` too, which is not I/O
        self.io.critical_seconds -= other
        return result, after

    async def harvest(self, workdir: Workdir, *, enforce: bool = True) -> None:
        """Harvest the branch directory, and compute the branch's diffs in the same thread hop.

        The diffs are kept for the instance's record (and the agent step's result): nothing
        changes the branch after its last harvest. Only the harvest counts as directory I/O.
        Files left on disk over the limit on a changed file raise
        :class:`~orchestrator.vfs.FileTooLarge` naming them (unless ``enforce`` is false: they
        are left out of the branch, as every harvest leaves them out).
        """
        branch = workdir.branch
        _, diffs = await self.run_then(
            "harvest",
            lambda: workdir.harvest(full=True),
            lambda: branch_diffs(branch),
            inline=is_small(branch),
        )
        if enforce and (too_large := workdir.too_large_error()) is not None:
            raise too_large  # the instance fails: its diffs are of no use
        self._diffs[branch.name] = diffs

    def diffs(self, branch: Branch) -> tuple[ChangeSet, str, str]:
        """The diffs kept from ``branch``'s last harvest (it must have been harvested)."""
        return self._diffs[branch.name]

    def take_diffs(self, branch: Branch) -> tuple[ChangeSet, str, str] | None:
        """The diffs kept for ``branch``, forgotten here; None if it was never harvested."""
        return self._diffs.pop(branch.name, None)

    def forget(self, name: str) -> None:
        """Drop diffs kept for the branch ``name`` (a new attempt starts over)."""
        self._diffs.pop(name, None)
