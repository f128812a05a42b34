"""Whether a branch that needs a directory copies its tree afresh or waits for a used one.

With directory reuse, a branch forked from a tree that has directories in use can wait for one of
them to come back and be reset (see :mod:`orchestrator.vfs.pool`), or copy the tree again.
Copying costs the tree (seconds on a big repository, competing with everything else for the disk
and the CPUs); waiting costs the turns ahead of it. :func:`decide` weighs the two from what the
run has seen of this tree: how long a fresh copy took and how long a directory stays in use. It
is pure: :class:`~orchestrator.pipeline._branchio.BranchDirs` feeds it the figures and the clock.

- Nothing of the tree is in use or being made: copy (nothing would come back).
- The first copy is under way: wait for it (it tells how long a copy takes).
- No directory has come back yet, or only one (the first turns start the agents: their time
  says little of the next, and is left out of the usual hold): wait as long as a copy takes,
  measured from the start of the oldest use (the rent-or-buy rule: at most twice the better
  choice's cost), then copy.
- Otherwise the work queued for the directories there are (branches waiting for one of them,
  and instances waiting to start, each holding a directory as long as they have so far) is
  compared with the copy: a copy is made only when that work exceeds :data:`MARGIN` copies. A
  new directory shortens the queue only once it is made, and competes with the directories in
  use while it is made; below that, the directories there are finish the queue as soon.
- A copy's cost is its time, or the CPU time it took (its threads', and what ran meanwhile),
  whichever is larger: on a machine the run keeps busy, that is what the copy takes from it.
- While directories are in use and the run's process has lately been using about a whole CPU
  (:data:`BUSY`: its Python code runs one thread at a time), a directory more cannot make the
  turns go faster: their time is the run's own work, not a wait for the agents. No copy then.

Fresh copies are made one after another (per tree and across trees, see :func:`fresh_copies`):
copies at once contend for the same disk and slow each other down.
"""

from __future__ import annotations

from collections.abc import Iterable

from attrs import define, field, frozen

from .._util import usable_cpus

__all__ = ["BUSY", "MARGIN", "CpuUse", "Decision", "TreeUse", "decide", "fresh_copies"]

#: a copy is made when the queued work exceeds this many copies' time
MARGIN = 3.0
#: the run's process using this many CPUs or more is busy: a directory more would not help
BUSY = 0.8
#: weight of the latest figure in the running estimates
_SMOOTHING = 0.3


def fresh_copies() -> int:
    """Copies of whole trees made at once: one per four CPUs (a copy runs a few threads of its
    own where the disk is slow), at least one."""
    return max(1, usable_cpus() // 4)


@frozen
class Decision:
    """What a branch waiting for a directory does now."""

    #: copy the tree afresh (if a copy may start), rather than wait
    copy: bool
    #: wait at most this many seconds before deciding again, if nothing comes back meanwhile
    #: (None: until something does)
    recheck: float | None = None


COPY = Decision(True)


def decide(
    held: Iterable[float],
    copying: int,
    demand: int,
    hold: float | None,
    copy: float | None,
    busy: float | None = None,
) -> Decision:
    """Copy the tree now, or wait for a directory of it to come back.

    ``held``: for how long each directory of the tree in use has been held; ``copying``: copies
    of it under way; ``demand``: the branches that want one of its directories (the deciding one
    included, and instances of the run waiting to start); ``hold``: the usual time a directory
    is held; ``copy``: the usual cost of a fresh copy (None: none measured yet); ``busy``: the
    CPUs the run's process used lately (None: not known).
    """
    spans = list(held)
    if not spans and not copying:
        return COPY
    if busy is not None and busy >= BUSY and copy is not None:
        return Decision(False, copy)
    if copy is None:
        # the first copy is under way (or none was ever finished): it will tell
        return COPY if not copying else Decision(False)
    if hold is None:
        oldest = max(spans, default=0.0)
        if oldest >= copy:
            return COPY
        return Decision(False, copy - oldest)
    # a directory held longer than usual makes the usual figure too hopeful
    usual = max(hold, min(spans)) if spans else hold
    queued = max(demand, 1) * usual / (len(spans) + copying)
    if queued > MARGIN * copy:
        return COPY
    return Decision(False, copy)


@define
class TreeUse:
    """What the run's directories of one tree are doing, and the running estimates."""

    #: directory -> when it was handed out (for as long as it is in use)
    held: dict[str, float] = field(factory=dict)
    #: directories being made: copied afresh, or reset from the pool
    copying: int = 0
    waiting: int = 0
    hold: float | None = None
    copy: float | None = None
    #: directories that came back so far
    returns: int = 0

    def handed(self, directory: str, now: float) -> None:
        """``directory`` is in use from ``now``."""
        self.held[directory] = now

    def returned(self, directory: str, now: float) -> None:
        """``directory`` is no longer in use. The first one back is no usual hold: its turn
        started the agent."""
        since = self.held.pop(directory, None)
        if since is not None:
            if self.returns:
                self.hold = _smooth(self.hold, now - since)
            self.returns += 1

    def copied(self, seconds: float) -> None:
        """A fresh copy took ``seconds``."""
        self.copy = _smooth(self.copy, seconds)

    def decide(self, now: float, pending: int, busy: float | None = None) -> Decision:
        """:func:`decide` for a branch waiting now, with ``pending`` instances yet to start
        (``busy``: the CPUs the run's process used lately, if known)."""
        return decide(
            (now - since for since in self.held.values()),
            self.copying,
            self.waiting + pending,
            self.hold if self.returns >= 2 else None,
            self.copy,
            busy,
        )


@define
class CpuUse:
    """The CPUs a process used lately, from samples of its CPU time: each over at least
    :attr:`window` seconds since the one before, smoothed. A span in which a fresh copy ran
    is no sample: it tells what the copy costs, not what the turns do."""

    window: float = 0.1
    busy: float | None = None
    _mark: tuple[float, float] | None = None

    def restart(self, now: float, cpu: float) -> None:
        """Start the next span at ``now`` (a copy ended, or runs: no sample until it ends)."""
        self._mark = (now, cpu)

    def sample(self, now: float, cpu: float) -> float | None:
        """Take a sample (``now``: wall clock, ``cpu``: the process's CPU time); :attr:`busy`."""
        if self._mark is None:
            self._mark = (now, cpu)
        elif now - self._mark[0] >= self.window:
            rate = (cpu - self._mark[1]) / (now - self._mark[0])
            self.busy = _smooth(self.busy, rate)
            self._mark = (now, cpu)
        return self.busy


def _smooth(current: float | None, sample: float) -> float:
    return sample if current is None else current + _SMOOTHING * (sample - current)
