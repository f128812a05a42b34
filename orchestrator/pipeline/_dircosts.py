"""What a run's branch directories cost: the time their I/O takes and the disk they hold.

:class:`BranchIO` times each operation (in the worker thread that runs it) and the waits of the
steps for them; :class:`BranchCosts` counts the directories made and reused, the bytes written
and the most bytes on disk at once. :func:`is_small` tells which trees are cheap enough to make
and harvest on the event loop itself, and :func:`copy_budget` the copy and delete jobs a run
runs at once. Used by :class:`~orchestrator.pipeline._branchio.BranchDirs`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import trio
from attrs import define, field

from .._util import usable_cpus
from ..vfs import Branch, Snapshot, Write
from ..vfs.tree import compose

__all__ = [
    "INLINE_MAX_BYTES",
    "INLINE_MAX_FILES",
    "BranchCosts",
    "BranchIO",
    "copy_budget",
    "is_small",
    "timed",
]

_T = TypeVar("_T")

#: Trees up to this many files and bytes are made and harvested on the event loop itself: the
#: system calls take less time than handing the work to a thread and back (two wake-ups).
INLINE_MAX_FILES = 16
INLINE_MAX_BYTES = 256 * 1024


def copy_budget() -> trio.CapacityLimiter:
    """A run's budget of copy and delete jobs at once: one per CPU this process may use."""
    return trio.CapacityLimiter(usable_cpus())


@define(eq=False)
class BranchCosts:
    """What a run's branch directories cost: how many were made and reused, the bytes written
    into them, and the most bytes they held on disk at once.

    Bytes are counted as the directories are made and deleted, never by scanning: a directory
    counts the files it was made with, then what its last harvest found (ignored files, such as
    installed dependencies, are not counted), until it is deleted from the trash.
    """

    made: int = 0
    reused: int = 0
    #: bytes written into directories made afresh (copied, or content the branch holds)
    bytes_copied: int = 0
    #: bytes of files made as reflinks of the workspace's (sharing its blocks: no data written)
    bytes_reflinked: int = 0
    #: bytes of the branch directories on disk now, live ones and those in the trash
    live_bytes: int = 0
    peak_bytes: int = 0

    def grew(self, size: int) -> None:
        """``size`` more bytes are on disk."""
        self.live_bytes += size
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)

    def shrank(self, size: int) -> None:
        """``size`` bytes were deleted."""
        self.live_bytes -= size

    def to_json(self) -> dict[str, int]:
        """The figures as the run's ``branches`` object gives them."""
        return {
            "made": self.made,
            "reused": self.reused,
            "bytesCopied": self.bytes_copied,
            "bytesReflinked": self.bytes_reflinked,
            "peakBytes": self.peak_bytes,
        }


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


def timed(work: Callable[[], _T]) -> Callable[[], tuple[_T, float, float]]:
    """``work`` returning also its wall and CPU time (measured in the thread that runs it)."""

    def run() -> tuple[_T, float, float]:
        wall, cpu = time.perf_counter(), time.thread_time()
        result = work()
        return result, time.perf_counter() - wall, time.thread_time() - cpu

    return run
