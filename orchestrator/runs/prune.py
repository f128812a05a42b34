"""Pruning the state directory: deleting recorded runs with what they left on disk.

A run leaves its record in the run store (steps, change sets, transcripts, decisions, events),
content blobs it may share with other runs, and a directory ``runs/RUN`` in the state directory
(its lock, what is left of its branch directories: trash, a pool). :func:`prune` deletes the
runs chosen, never one that is running, being resumed or applied (its lock is held), one
recorded ``running`` whose process cannot be checked from here, or one whose apply a crash
interrupted (its journal still has to be finished or rolled back).

A batch run and its child runs (one per repository) are one unit: chosen together (``keep``
and ``older_than`` count runs that belong to no batch; a child alone is refused), kept together
when any of them must stay, deleted together.

Crash safety comes from the order. The chosen runs' locks are taken and held throughout; their
rows, and every blob no remaining change uses, go in one transaction (all or nothing); only
then are their directories moved (one rename each) into ``pruned/`` and deleted there. A crash
at any point leaves a consistent store, and at worst files nobody uses: a run directory without
a run (its lock free, its owner gone) or a half-deleted folder in ``pruned/``, both removed by
the next prune.
"""

from __future__ import annotations

import datetime
import os
import stat
import time
import uuid
from collections.abc import Sequence
from contextlib import ExitStack, suppress
from pathlib import Path
from typing import Any

import trio
from attrs import frozen

from .._log import get_logger
from ..errors import RunBusy, RunNotFound, UsageError
from ..state import STORE_FILES, state_directory
from ..store import RunRecord, RunStore, open_run_store
from ..vfs._fileio import remove_tree
from ._face import check_trio_face
from ._lock import hold_run_lock, probe_run_lock, run_owner
from .apply import _origin, interrupted_applies

__all__ = ["PruneOutcome", "PrunedRun", "SkippedRun", "StoreUsage", "prune", "store_usage"]

log = get_logger(__name__)

#: where the directories of pruned runs are moved to be deleted, in the state directory
PRUNED = "pruned"


@frozen
class PrunedRun:
    """A run that :func:`prune` deleted (or, in a dry run, would delete)."""

    run_id: str
    kind: str
    #: its status as recorded
    status: str
    #: when it started (seconds since the epoch)
    created: float
    #: the bytes of its directory in the state directory
    file_bytes: int
    #: the batch run it belongs to and went with, None for a run of its own
    parent: str | None = None

    def to_json(self) -> dict[str, Any]:
        """As ``--json`` shows it."""
        return {
            "runId": self.run_id,
            "kind": self.kind,
            "status": self.status,
            "created": self.created,
            "fileBytes": self.file_bytes,
            "parent": self.parent,
        }


@frozen
class SkippedRun:
    """A run chosen for pruning but kept, and why."""

    run_id: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        """As ``--json`` shows it."""
        return {"runId": self.run_id, "reason": self.reason}


@frozen
class PruneOutcome:
    """What :func:`prune` deleted (or would have, with ``dry_run``), and what it kept."""

    #: the runs deleted, newest first, a batch run followed by its child runs (oldest first)
    deleted: tuple[PrunedRun, ...]
    #: the runs chosen but kept: running, being resumed or applied, or with an interrupted apply
    skipped: tuple[SkippedRun, ...]
    #: bytes of the database freed (its free pages, reused by later runs: the file keeps its size)
    database_bytes: int
    #: bytes of files deleted: the runs' directories, and what earlier prunes left
    file_bytes: int
    #: the directories without a run that were deleted (left by a crash)
    leftovers: int
    dry_run: bool

    @property
    def bytes_freed(self) -> int:
        """Bytes freed in all: the database's and the files'."""
        return self.database_bytes + self.file_bytes

    def to_json(self) -> dict[str, Any]:
        """As ``--json`` shows it."""
        return {
            "dryRun": self.dry_run,
            "deleted": [r.to_json() for r in self.deleted],
            "skipped": [r.to_json() for r in self.skipped],
            "bytesFreed": self.bytes_freed,
            "databaseBytes": self.database_bytes,
            "fileBytes": self.file_bytes,
            "leftovers": self.leftovers,
        }


@frozen
class StoreUsage:
    """How much room the run store takes in the state directory."""

    #: the database and its journals
    database_bytes: int
    #: the run directories (locks, branch directories, trash) and what prunes are deleting
    file_bytes: int

    @property
    def total_bytes(self) -> int:
        """The two together."""
        return self.database_bytes + self.file_bytes


def tree_bytes(path: str) -> int:
    """The bytes of the files under ``path`` (apparent sizes; symlinks not followed)."""
    total = 0
    try:
        entries = list(os.scandir(path))
    except OSError:
        return 0
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if stat.S_ISDIR(st.st_mode):
            total += tree_bytes(entry.path)
        else:
            total += st.st_size
    return total


def _usage(state: Path) -> StoreUsage:
    database = 0
    for name in STORE_FILES:
        with suppress(OSError):
            database += (state / name).lstat().st_size
    return StoreUsage(database, tree_bytes(str(state / "runs")) + tree_bytes(str(state / PRUNED)))


async def store_usage(*, state_dir: str | os.PathLike[str] | None = None) -> StoreUsage:
    """The room the run store takes: its database, and the runs' directories."""
    return await trio.to_thread.run_sync(_usage, state_directory(state_dir))


def _cutoff(older_than: datetime.datetime | datetime.timedelta) -> float:
    if isinstance(older_than, datetime.timedelta):
        if older_than < datetime.timedelta(0):
            raise UsageError(f"older_than must not be a negative age, not {older_than}")
        return time.time() - older_than.total_seconds()
    # a naive time is local time, as `runs` shows them
    return older_than.timestamp()


#: a run chosen for pruning and the child runs that go with it (a batch's, one per repository)
_Group = tuple[RunRecord, list[RunRecord]]


async def _chosen(
    store: RunStore,
    run_ids: Sequence[str],
    older_than: datetime.datetime | datetime.timedelta | None,
    keep: int | None,
) -> list[_Group]:
    """The runs the selectors choose, newest first, each with its child runs.

    ``keep`` and ``older_than`` count the runs that belong to no batch; a child run goes only
    with its batch: chosen by id alone, it is refused (a usage error).
    """
    if run_ids and (older_than is not None or keep is not None):
        raise UsageError("prune takes run ids, or older_than and keep, not both")
    if run_ids:
        found: dict[str, RunRecord] = {}
        for given in run_ids:
            record = await store.get_run(given)  # RunNotFound (a usage error) for an unknown id
            found[record.run_id] = record
        runs = []
        for record in found.values():
            if record.parent is not None and record.parent in found:
                continue  # it goes with its batch, chosen too
            if record.parent is not None and await _recorded(store, record.parent):
                raise UsageError(
                    f"run {record.run_id} belongs to batch run {record.parent}: it is pruned "
                    f"with its batch, never alone (pruning {record.parent} deletes the batch "
                    "with all its runs)"
                )
            runs.append(record)
        runs.sort(key=lambda r: r.created, reverse=True)
    else:
        if older_than is None and keep is None:
            raise UsageError("prune needs run ids, older_than or keep: nothing was chosen")
        if keep is not None and keep < 0:
            raise UsageError(f"keep must not be below 0, not {keep}")
        runs = await store.list_runs(limit=None, top_level=True)
        if keep is not None:
            runs = runs[keep:]
        if older_than is not None:
            cutoff = _cutoff(older_than)
            runs = [r for r in runs if r.created < cutoff]
    return [(r, await store.children(r.run_id)) for r in runs]


async def _recorded(store: RunStore, run_id: str) -> bool:
    """Whether run ``run_id`` (a full id) is recorded."""
    try:
        return (await store.get_run(run_id)).run_id == run_id
    except RunNotFound:
        return False


def _why_kept(
    record: RunRecord, run_dir: Path, interrupted: set[str], locks: ExitStack | None
) -> str | None:
    """Why the run must stay (None: it can go). With ``locks``, its lock is taken and held
    there; else (a dry run) only tried."""
    if record.run_id in interrupted:
        return "an apply of it was interrupted: its journal needs the run until it is finished"
    if record.status == "running":
        owner = run_owner(run_dir)
        if owner.state == "unknown":
            return owner.reason or "unknown whether it is running"
    if locks is None:
        return None if probe_run_lock(run_dir) else "it is running, resumed or applied"
    try:
        locks.enter_context(hold_run_lock(run_dir, record.run_id, doing="prune"))
    except RunBusy:
        return "it is running, resumed or applied"
    return None


def _orphans(state: Path, known: set[str]) -> list[str]:
    """The run directories without a run whose process is surely gone: left by a crash."""
    runs = state / "runs"
    try:
        names = sorted(os.listdir(runs))
    except OSError:
        return []
    found = []
    for name in names:
        run_dir = runs / name
        if name in known or not run_dir.is_dir() or run_dir.is_symlink():
            continue
        # a run starting holds its lock, or has not written who it is yet (unknown)
        if run_owner(run_dir).state == "gone" and probe_run_lock(run_dir):
            found.append(name)
    return found


def _remove(state: Path, run_dir: Path) -> None:
    """Move ``run_dir`` into ``pruned/`` (one rename: it is gone from ``runs/`` at once) and
    delete it there."""
    pruned = state / PRUNED
    pruned.mkdir(exist_ok=True)
    target = pruned / f"{run_dir.name}.{uuid.uuid4().hex[:8]}"
    try:
        os.rename(run_dir, target)
    except FileNotFoundError:
        return
    remove_tree(str(target))


def _sweep(state: Path) -> None:
    """Delete what an interrupted prune left in ``pruned/``."""
    pruned = state / PRUNED
    try:
        names = os.listdir(pruned)
    except OSError:
        return
    for name in names:
        remove_tree(str(pruned / name))


def _files(state: Path, deleted: list[RunRecord], orphans: list[str], dry_run: bool) -> int:
    """Delete (or, in a dry run, measure) the runs' directories, the orphans and ``pruned/``;
    the bytes of the orphans and of ``pruned/``."""
    runs = state / "runs"
    total = tree_bytes(str(state / PRUNED))
    total += sum(tree_bytes(str(runs / name)) for name in orphans)
    if not dry_run:
        for record in deleted:
            _remove(state, runs / record.run_id)
        for name in orphans:
            _remove(state, runs / name)
        _sweep(state)
    return total


async def prune(
    run_ids: Sequence[str] = (),
    *,
    older_than: datetime.datetime | datetime.timedelta | None = None,
    keep: int | None = None,
    dry_run: bool = False,
    state_dir: str | os.PathLike[str] | None = None,
) -> PruneOutcome:
    """Delete recorded runs with their transcripts, run directories and the content blobs no
    remaining run uses.

    Choose the runs by id (``run_ids``: full ids or unique prefixes), or by ``older_than`` (a
    time, naive meaning local, or an age) and ``keep`` (the newest ``keep`` runs stay); both
    together choose the runs older than that beyond the newest ``keep``. A batch run goes with
    its child runs (one per repository), all or none: ``keep`` and ``older_than`` count the
    runs that belong to no batch, and a child run chosen by id without its batch is refused (a
    usage error). A batch stays when any of its runs must. A run that is running,
    being resumed or applied, one recorded ``running`` whose process cannot be checked from
    here, and one whose apply was interrupted are kept and listed in
    :attr:`PruneOutcome.skipped`. ``dry_run`` deletes nothing and says what would go.

    Raises :class:`~orchestrator.errors.UsageError` when nothing is chosen or the selectors
    clash, and :class:`~orchestrator.errors.RunNotFound` for an unknown id (nothing deleted).
    """
    check_trio_face("prune")  # before anything starts
    state = state_directory(state_dir)
    interrupted = {
        run_id for run_id, _, _ in (_origin(a) for a in await interrupted_applies(state)) if run_id
    }
    async with open_run_store(state) as store:
        chosen = await _chosen(store, run_ids, older_than, keep)
        with ExitStack() as locks:
            going: list[RunRecord] = []
            skipped: list[SkippedRun] = []
            each: dict[str, int] = {}
            for top, children in chosen:
                # a batch goes with all its runs or not at all: its lock, then theirs
                with ExitStack() as group_locks:
                    why = None
                    for record in (top, *children):
                        run_dir = state / "runs" / record.run_id
                        # measured before its lock is taken (which rewrites the lock file)
                        each[record.run_id] = await trio.to_thread.run_sync(
                            tree_bytes, str(run_dir)
                        )
                        reason = await trio.to_thread.run_sync(
                            _why_kept,
                            record,
                            run_dir,
                            interrupted,
                            None if dry_run else group_locks,
                        )
                        if reason is not None:
                            why = reason if record is top else f"its run {record.run_id}: {reason}"
                            break
                    if why is None:
                        going += [top, *children]
                        locks.enter_context(group_locks.pop_all())  # held until the end
                    else:
                        skipped.append(SkippedRun(top.run_id, why))
            # the records first, in one transaction: a crash after it leaves only files
            database = await store.delete_runs([r.run_id for r in going], dry_run=dry_run)
            # the runs kept, and those going (their directories are removed as theirs)
            known = {r.run_id for r in await store.list_runs(limit=None)}
            known |= {r.run_id for r in going}
            orphans = await trio.to_thread.run_sync(_orphans, state, known)
            files = await trio.to_thread.run_sync(_files, state, going, orphans, dry_run)
            files += sum(each[r.run_id] for r in going)
    tops = {top.run_id for top, _ in chosen}
    outcome = PruneOutcome(
        deleted=tuple(
            PrunedRun(
                r.run_id,
                r.kind,
                r.status,
                r.created,
                each[r.run_id],
                None if r.run_id in tops else r.parent,
            )
            for r in going
        ),
        skipped=tuple(skipped),
        database_bytes=database,
        file_bytes=files,
        leftovers=len(orphans),
        dry_run=dry_run,
    )
    log.info(
        "runs pruned" if not dry_run else "runs that would be pruned",
        deleted=len(going),
        skipped=len(skipped),
        bytes=outcome.bytes_freed,
    )
    return outcome
