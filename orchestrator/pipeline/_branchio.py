"""Branch directories of a run: making, harvesting and removing them, and what that costs.

:class:`BranchDirs` is the runner's one way to branch directory I/O, timed into a
:class:`BranchIO` and counted into :class:`BranchCosts`. Each operation on a large tree runs in
a worker thread; a small tree (:func:`is_small`) is made and harvested on the event loop, where
the system calls cost less than two thread wake-ups.

Copying and deleting share one budget per run (:func:`copy_budget`: a job per CPU), so that
many materializations at once queue instead of contending for the CPUs; fresh copies of large
trees are fewer still (:func:`~orchestrator.pipeline._supply.fresh_copies`), and a branch whose
tree has directories in use waits for one of them when that costs less than a copy (see
:mod:`orchestrator.pipeline._supply`). A finished directory is
renamed into the run's trash at once (a small one's files are deleted first, right there) and
the trash is deleted in the background, a directory per job of the budget; a directory counts
against the run's limit of directories on disk until it is deleted, so a new one waits for an
old one rather than piling copies up. What is left in the trash by a run that died is deleted by the
next attempt of the run (and :mod:`orchestrator.runs` moves a dead run's leftovers into the
trash of the next run). With a :class:`~orchestrator.vfs.pool.DirPool`, finished directories
are pooled instead and reset for the next branch of the same tree (see
:mod:`orchestrator.vfs.pool`); what it evicts or cannot prove clean goes to the trash.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TypeVar

import trio
from attrs import define, field

from .._log import get_logger
from ..vfs import Branch, ChangeSet, Workdir, materialize
from ..vfs._fileio import remove_tree
from ..vfs.pool import DirPool, tree_key
from ._branchstate import branch_diffs, changes_since, undo_writes
from ._calls import safe
from ._dircosts import (
    INLINE_MAX_BYTES,
    INLINE_MAX_FILES,
    BranchCosts,
    BranchIO,
    copy_budget,
    is_small,
    timed,
)
from ._supply import CpuUse, TreeUse, fresh_copies

__all__ = [
    "INLINE_MAX_BYTES",
    "INLINE_MAX_FILES",
    "TRASH",
    "BranchCosts",
    "BranchDirs",
    "BranchIO",
    "changes_since",
    "copy_budget",
    "is_small",
]

log = get_logger(__name__)

_T = TypeVar("_T")
_U = TypeVar("_U")

#: the folder of a run's directory that finished branch directories are renamed into
TRASH = "trash"


#: an entry of the trash: its path, its workdir to close first (or None), the bytes counted for
#: it, whether it holds a place among the directories on disk
_Trashed = tuple[str, Workdir | None, int, bool]


def _empty_small(workdir: Workdir, limit: int) -> bool:
    """Delete ``workdir`` now if it holds at most ``limit`` entries (with
    :func:`~orchestrator.vfs._fileio.remove_tree`: never through a symlink or into a mount
    point).

    False, with nothing deleted, if the directory holds more entries (an agent may have
    installed dependencies into it); also False if something is left (a mount point, a file
    that will not go): the trash tries again and says what stays. Here, not in a worker
    thread: for a few entries the thread hops would cost the event loop more than the system
    calls.
    """
    root = workdir.root
    if os.path.isdir(root) and not os.path.islink(root):  # else it is only a name to remove
        count = 0
        pending = [root]
        while pending:
            with os.scandir(pending.pop()) as entries:
                for entry in entries:
                    count += 1
                    if count > limit:
                        return False
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(entry.path)
    workdir.close()
    remove_tree(root)
    return not os.path.lexists(root)


def _trash_entries(trash: Path) -> list[str]:
    """The entries of the run's trash folder (made if missing)."""
    trash.mkdir(parents=True, exist_ok=True)
    return [str(trash / name) for name in sorted(os.listdir(trash))]


@define(eq=False)
class BranchDirs:
    """The branch directories of one run, one level under ``<run_dir>/branches``.

    Every operation that touches them is timed into :attr:`io` and, unless the tree is small,
    waits in a worker thread; a harvest also computes the branch's diffs in the same thread hop
    and keeps them until the instance is recorded (:meth:`take_diffs`). Materializations and
    deletions share :attr:`budget`; at most :attr:`limit` directories of trees that are not
    small are on disk at once, the ones waiting in the trash included (see the module doc).
    Use it within :meth:`serving`, which deletes the trash meanwhile.
    """

    run_dir: Path
    io: BranchIO
    #: the limit on a changed file of the run's branches (None: none); see
    #: :attr:`Workdir.max_file_size <orchestrator.vfs.Workdir.max_file_size>`
    max_file_size: int | None = None
    #: finished directories kept for reuse (None: every directory is made fresh and deleted);
    #: its :attr:`~orchestrator.vfs.pool.DirPool.stats` count directories made and reused
    pool: DirPool | None = None
    #: directories on disk at once (live or in the trash; pooled ones are bounded by the pool):
    #: the run's limit on instances at once
    limit: int = 8
    #: copy and delete jobs at once, shared by every materialization and deletion of the run
    budget: trio.CapacityLimiter = field(factory=copy_budget)
    #: fresh copies of large trees at once (each one job of :attr:`budget`): copies at once
    #: contend for one disk
    copies: trio.CapacityLimiter = field(factory=lambda: trio.CapacityLimiter(fresh_copies()))
    costs: BranchCosts = field(factory=BranchCosts)
    #: held by each directory counted against :attr:`limit` until it is deleted
    _disk: trio.Semaphore = field(init=False)
    #: directory names taken in this run (names are made unique)
    _names: set[str] = field(init=False, factory=set)
    #: branch name -> (net changes, diff against the run's base, own diff), from the harvest
    _diffs: dict[str, tuple[ChangeSet, str, str]] = field(init=False, factory=dict)
    #: live directory -> (bytes counted for it, whether it holds a place of :attr:`_disk`)
    _live: dict[str, tuple[int, bool]] = field(init=False, factory=dict)
    _trash: list[_Trashed] = field(init=False, factory=list)
    _nursery: trio.Nursery | None = field(init=False, default=None)
    #: tasks deleting the trash now
    _deleters: int = field(init=False, default=0)
    #: set when the last deleter ends
    _idle: trio.Event = field(init=False, factory=trio.Event)
    #: bytes counted for the directories the pool holds, and how many it holds
    _pooled: list[int] = field(init=False, factory=lambda: [0, 0])
    #: instances of the run waiting to start (each will want a directory): the runner's queue
    pending: Callable[[], int] | None = None
    #: what the directories of each snapshot's large trees are doing (see :mod:`._supply`)
    _uses: dict[int, TreeUse] = field(init=False, factory=dict)
    #: live directory -> the use of its tree
    _handed: dict[str, TreeUse] = field(init=False, factory=dict)
    #: takes from the pool under way
    _taking: int = field(init=False, default=0)
    #: set (and replaced) when a directory comes back or a copy ends
    _changed: trio.Event = field(init=False, factory=trio.Event)
    #: the CPUs this process used lately, sampled as directories are handed out and come back
    _cpu: CpuUse = field(init=False, factory=CpuUse)
    #: fresh copies under way (no CPU sample is taken meanwhile)
    _copying: int = field(init=False, default=0)

    def __attrs_post_init__(self) -> None:
        self._disk = trio.Semaphore(max(self.limit, 1))

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

    @asynccontextmanager
    async def serving(self) -> AsyncIterator[None]:
        """Delete the trash in the background for the block, and wait at its end (also when
        cancelled) until every directory is deleted. What an earlier process left in the
        run's trash is deleted too."""
        trash = self.run_dir / TRASH
        left = await trio.to_thread.run_sync(_trash_entries, trash)
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            for path in left:
                self._throw_away(path, None, 0, holds=False)
            try:
                yield
            finally:
                await self.drain()  # with the deleters of the nursery, if not cancelled
                self._nursery = None
                # a finished run leaves no folder for the next runs to sweep
                for empty in (trash, self.run_dir / "branches"):
                    with contextlib.suppress(OSError):
                        empty.rmdir()

    async def materialize(
        self, branch: Branch, name: str, attempt: int, *, max_file_size: int | None = None
    ) -> Workdir:
        """Write ``branch`` out into a fresh directory for attempt ``attempt`` of ``name``.

        ``max_file_size`` replaces the run's limit on a changed file for this directory. A tree
        that is not small waits for a place among the directories on disk, then takes a pooled
        directory of its tree, or copies the tree afresh when waiting for one would cost more
        (see :mod:`orchestrator.pipeline._supply`); fresh copies are made a few at a time.
        """
        limit = max_file_size if max_file_size is not None else self.max_file_size
        directory = self.directory(name, attempt)
        discarded: list[str] = []
        try:
            if is_small(branch):
                pool = self.pool

                def make() -> tuple[Workdir, bool]:
                    if pool is not None:
                        taken = pool.take(
                            branch, directory, max_file_size=limit, discard=discarded.append
                        )
                        if taken is not None:
                            return taken, True
                    return self._fresh(branch, directory, limit), False

                (result, reused), _ = await self.run_then(
                    "materialize", make, lambda: None, inline=True
                )
                holds = False
            else:
                self.io.wait_started()
                try:
                    await self._disk.acquire()
                finally:
                    self.io.wait_ended()
                try:
                    result, reused = await self._supply(branch, directory, limit, discarded)
                except BaseException:
                    self._disk.release()
                    raise
                holds = True
        finally:
            for path in discarded:
                self._throw_away(path, None, self._unpool(), holds=False)
        size = result.recorded_bytes()
        self._live[result.root] = (size, holds)
        if reused:
            self.costs.reused += 1
            self.costs.grew(size - self._unpool())
        else:
            self.costs.made += 1
            self.costs.bytes_copied += result.copies.copied_bytes
            self.costs.bytes_reflinked += result.copies.reflinked_bytes
            self.costs.grew(size)
        return result

    def _fresh(self, branch: Branch, directory: Path, limit: int | None) -> Workdir:
        """``branch`` copied afresh into ``directory`` (blocking), adopted by the pool."""
        made = materialize(branch, directory, max_file_size=limit)
        if self.pool is not None:
            self.pool.adopt(made)
        return made

    async def _supply(
        self, branch: Branch, directory: Path, limit: int | None, discarded: list[str]
    ) -> tuple[Workdir, bool]:
        """A directory of ``branch``'s large tree: a pooled one reset, or a fresh copy (see
        :mod:`orchestrator.pipeline._supply`); whether it was reused."""
        pool = self.pool
        # a tree too small to be pooled never gets a directory back: nothing to wait for
        key = (
            tree_key(branch)
            if pool is not None and len(branch.root.paths()) >= pool.min_files
            else None
        )
        if pool is None or key is None:
            # every branch copies: one copy at a time among the run's fresh copies
            async with self.copies:
                return await self._copy(branch, directory, limit, None), False
        # a pooled directory serves any tree of its snapshot (reset to the differing paths):
        # the directories of one snapshot are one supply
        use = self._uses.setdefault(key[0], TreeUse())
        use.waiting += 1
        try:
            while True:
                if self._pooled[1] > self._taking:
                    taken = await self._take(use, branch, directory, limit, discarded)
                    if taken is not None:
                        return taken, True
                pending = self.pending() if self.pending is not None else 0
                decision = use.decide(trio.current_time(), pending, self._cpu.busy)
                if decision.copy:
                    try:
                        self.copies.acquire_nowait()
                    except trio.WouldBlock:
                        pass
                    else:
                        try:
                            return await self._copy(branch, directory, limit, use), False
                        finally:
                            self.copies.release()
                            self._supplied()
                changed = self._changed
                with trio.move_on_after(
                    decision.recheck if decision.recheck is not None else math.inf
                ):
                    await changed.wait()
        finally:
            use.waiting -= 1

    async def _take(
        self,
        use: TreeUse,
        branch: Branch,
        directory: Path,
        limit: int | None,
        discarded: list[str],
    ) -> Workdir | None:
        """A pooled directory reset to ``branch``'s tree (one job of the budget), handed out
        in ``use``; None if the pool had none it could prove clean."""
        pool = self.pool
        assert pool is not None
        # counted as in use while it is reset: no other branch copies meanwhile
        discards = len(discarded)
        use.copying += 1
        self._taking += 1
        try:
            taken = await self._in_budget(
                "materialize",
                lambda: pool.take(branch, directory, max_file_size=limit, discard=discarded.append),
            )
        finally:
            use.copying -= 1
            self._taking -= 1
            if discards != len(discarded):
                self._supplied()  # one fewer in the pool: others decide again
        if taken is not None:
            self._sample_cpu()
            use.handed(taken.root, trio.current_time())
            self._handed[taken.root] = use
        return taken

    async def _copy(
        self, branch: Branch, directory: Path, limit: int | None, use: TreeUse | None
    ) -> Workdir:
        """A fresh copy of ``branch`` (one job of the budget), timed into ``use``."""
        if use is not None:
            use.copying += 1
        self._copying += 1
        started, cpu = trio.current_time(), time.process_time()
        try:
            # a job may copy on a few threads of its own (see materialize: where copying waits
            # on the disk they overlap the waits); the budget bounds the jobs, so the threads
            # stay within a few per CPU, not a few per session
            made = await self._in_budget(
                "materialize", lambda: self._fresh(branch, directory, limit)
            )
        finally:
            if use is not None:
                use.copying -= 1
            self._copying -= 1
            if not self._copying:
                self._cpu.restart(trio.current_time(), time.process_time())
        if use is not None:
            now = trio.current_time()
            # what the copy costs the run: its time, or, on a machine it kept busy, the CPU
            # time it took from the run (its threads', and what ran meanwhile: the larger)
            use.copied(max(now - started, time.process_time() - cpu))
            use.handed(made.root, now)
            self._handed[made.root] = use
        return made

    def _sample_cpu(self) -> None:
        """A sample of this process's CPU use, unless a fresh copy is under way."""
        if not self._copying:
            self._cpu.sample(trio.current_time(), time.process_time())

    def _supplied(self) -> None:
        """Wake the branches waiting for a directory: one may be there, or a copy may start."""
        self._changed.set()
        self._changed = trio.Event()

    def _unpool(self) -> int:
        """A directory left the pool: the bytes counted for it (the pool's directories are of
        one tree or a few: their mean)."""
        total, count = self._pooled
        if count <= 0:
            return 0
        share = total // count
        self._pooled[0], self._pooled[1] = total - share, count - 1
        return share

    async def _in_budget(self, kind: str, work: Callable[[], _T]) -> _T:
        """``work`` in a worker thread, as one job of :attr:`budget`."""
        self.io.wait_started()
        try:
            await self.budget.acquire()
        finally:
            self.io.wait_ended()
        try:
            return await self.run(kind, work)
        finally:
            self.budget.release()

    def remove(self, workdir: Workdir) -> None:
        """Rename ``workdir`` into the trash at once, to be deleted in the background.

        A small one's files are deleted right here first: a background removal of a tiny
        directory costs the event loop more than doing it here (the deleting thread's Python
        code competes for the GIL with every system call the loop makes meanwhile).
        """
        counted, holds = self._live.pop(workdir.root, (0, False))
        use = self._handed.pop(workdir.root, None)
        if use is not None:
            self._sample_cpu()
            use.returned(workdir.root, trio.current_time())
            # pooled or not, a waiting branch decides again (with one directory fewer in use)
            self._supplied()
        # what the directory holds as its last harvest found it: what the agent wrote counts
        size = workdir.recorded_bytes()
        self.costs.grew(size - counted)
        if self.pool is not None and self.pool.holds(workdir):
            if holds:
                # pooled, it leaves the live directories (the pool bounds what it holds)
                self._disk.release()
            self._pooled[0] += size
            self._pooled[1] += 1
            for path in self.pool.give(workdir):
                self._throw_away(path, None, self._unpool(), holds=False)
            return
        closed = False
        if is_small(workdir.branch):
            wall, cpu = time.perf_counter(), time.thread_time()
            try:
                closed = _empty_small(workdir, 2 * INLINE_MAX_FILES)
            except OSError:
                closed = False  # the trash deletes what is left
            seconds = time.perf_counter() - wall
            self.io.critical_seconds += seconds
            self.io.add("remove", int(closed), seconds, time.thread_time() - cpu)
            if closed:
                self.costs.shrank(size)
                if holds:
                    self._disk.release()
                return
        path = workdir.root
        trashed = os.path.join(
            self.run_dir, TRASH, f"{os.path.basename(path)}.{secrets.token_hex(4)}"
        )
        try:
            os.makedirs(os.path.dirname(trashed), exist_ok=True)
            os.rename(path, trashed)
        except OSError:
            trashed = path  # deleted where it is
        self._throw_away(trashed, workdir, size, holds=holds)

    def _throw_away(
        self,
        path: str,
        workdir: Workdir | None,
        size: int,
        *,
        holds: bool,
    ) -> None:
        """Queue ``path`` for deletion, and start deleters for it: as many as the budget has
        jobs, at most one per directory."""
        self._trash.append((path, workdir, size, holds))
        if self._nursery is None:
            return
        while self._deleters < min(self.budget.total_tokens, len(self._trash)):
            self._deleters += 1
            self._nursery.start_soon(self._empty)

    async def _empty(self) -> None:
        """Delete the trash, a job of the budget at a time, until it is empty (counted in
        :attr:`_deleters` by the caller)."""
        try:
            while self._trash:
                async with self.budget:
                    if not self._trash:
                        break  # another deleter took the last entry while this one waited
                    # taken with the budget held: a job cancelled before it starts loses none
                    entry = self._trash.pop(0)
                    seconds, cpu = await trio.to_thread.run_sync(self._delete, entry)
                self.io.add("remove", 1, seconds, cpu)
        finally:
            self._deleters -= 1
            if self._deleters == 0:
                self._idle.set()
                self._idle = trio.Event()

    def _delete(self, entry: _Trashed) -> tuple[float, float]:
        """Delete one entry of the trash (in a worker thread) and give its place and bytes back
        to the run; the wall and CPU time taken."""
        wall, cpu = time.perf_counter(), time.thread_time()
        path, workdir, size, holds = entry
        try:
            if workdir is not None:
                workdir.close()
            left = remove_tree(path)
            if os.path.lexists(path):  # a mount point, a file that will not go (immutable)
                log.warning(
                    "a deleted branch directory is left on disk", directory=path, mounts=left
                )
        except Exception:  # a directory left behind must not stop the others
            log.exception("removing a branch directory failed", directory=path)
        if size or holds:  # a round trip to the loop only when there is something to give
            trio.from_thread.run_sync(self._deleted, size, holds)
        return time.perf_counter() - wall, time.thread_time() - cpu

    def _deleted(self, size: int, holds: bool) -> None:
        self.costs.shrank(size)
        if holds:
            self._disk.release()

    async def drain(self) -> None:
        """Wait until the trash is deleted (shielded: no thread outlives the run), timed as
        drain."""
        if self.pool is not None:
            for path in self.pool.clear():
                self._throw_away(path, None, self._unpool(), holds=False)
        self.io.wait_started()
        waiting = time.perf_counter()
        with trio.CancelScope(shield=True):
            while self._trash or self._deleters:
                if self._deleters:
                    await self._idle.wait()
                else:
                    self._deleters += 1
                    await self._empty()
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
        measured = timed(work)
        if inline:
            await trio.lowlevel.checkpoint_if_cancelled()
            result, seconds, cpu = measured()
            self.io.add(kind, 1, seconds, cpu)
            self.io.critical_seconds += seconds
            return result, then()

        def both() -> tuple[tuple[_T, float, float], _U, float]:
            first = measured()
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

    async def changes_since(self, before: Branch, branch: Branch) -> str:
        """:func:`changes_since`, in a worker thread unless the branch is small."""
        if is_small(branch):
            return changes_since(before, branch)
        return await trio.to_thread.run_sync(changes_since, before, branch)

    async def discard_writes(self, workdir: Workdir, before: Branch) -> None:
        """Put the directory and its branch back as ``before`` holds them, undoing what was
        written there since (by a step's check: see :func:`undo_writes`)."""
        await self.run_then(
            "harvest", lambda: undo_writes(workdir, before), lambda: None,
            inline=is_small(workdir.branch),
        )  # fmt: skip

    def diffs(self, branch: Branch) -> tuple[ChangeSet, str, str]:
        """The diffs kept from ``branch``'s last harvest (it must have been harvested)."""
        return self._diffs[branch.name]

    def take_diffs(self, branch: Branch) -> tuple[ChangeSet, str, str] | None:
        """The diffs kept for ``branch``, forgotten here; None if it was never harvested."""
        return self._diffs.pop(branch.name, None)

    def forget(self, name: str) -> None:
        """Drop diffs kept for the branch ``name`` (a new attempt starts over)."""
        self._diffs.pop(name, None)
