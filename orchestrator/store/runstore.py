"""The run store: every run recorded in ``<state_dir>/runs.sqlite3``.

One SQLite connection per :class:`RunStore`, used from worker threads one call at a time (a
:class:`trio.Lock` serializes them), so the event loop never blocks on the disk. Each call is
one transaction; writes take the write lock up front (``BEGIN IMMEDIATE``) so two processes
never deadlock upgrading a read lock. A thread is never abandoned on cancellation: a cancelled
call finishes (or rolls back) its transaction before ``trio.Cancelled`` is raised, so a write is
never half done (that plumbing is in ``_db``; the statements writes share are in ``_sql``).
Several writes can share one thread hop and one transaction: :meth:`RunStore.write_many` takes
them as op values (see ``ops``). WAL mode lets another process (``orchestrator runs`` during a
run) read while this one writes; a writer waits up to 5 s for another's write lock.

File contents of change sets are kept once per content (a ``blobs`` table keyed by SHA-256),
shared by every step and run that wrote the same bytes, and dropped when no change refers to
them any more.

Per-run calls take the run's full id and raise :class:`~orchestrator.errors.RunNotFound` for an
unknown one; :meth:`RunStore.get_run` also accepts a unique prefix.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import stat
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson
import trio
from attrs import define

from .._log import get_logger
from .._names import name_from_column
from ..errors import RunNotFound, StoreError, UsageError
from . import _sql
from ._db import Database
from ._rows import (
    RUN_COLUMNS,
    STEP_COLUMNS,
    run_from_row,
    run_values,
    step_from_row,
    transcript_rows,
)
from ._schema import SCHEMA_VERSION, connect
from .ops import (
    AddConflicts,
    AddEvent,
    AddPermissions,
    PutChanges,
    PutSession,
    PutStep,
    StoreOp,
    UpdateRun,
)
from .records import (
    RUN_KINDS,
    RUN_STATUSES,
    ApplyRecord,
    ChangeEntry,
    RunRecord,
    SessionRecord,
    StepRecord,
    StoredChange,
)

__all__ = ["STORE_FILENAME", "RunStore", "open_run_store"]

log = get_logger(__name__)

#: the database's file name inside the state directory
STORE_FILENAME = "runs.sqlite3"
#: the file type bits of a mode
_FILE_TYPE = 0o170000
#: the runs that belong to no batch (or to one no longer recorded)
_TOP_LEVEL = (
    "(parent IS NULL OR NOT EXISTS (SELECT 1 FROM runs AS batch WHERE batch.run_id = runs.parent))"
)


@define(eq=False)
class RunStore(Database):
    """The SQLite store of runs; open it with :func:`open_run_store` (or :meth:`open`).

    Every method that touches the database is async and runs it in a worker thread; calls
    from many tasks are serialized. Safe to share between the tasks of one trio run, and to
    open from several processes at once.
    """

    @classmethod
    async def open(cls, state_dir: str | os.PathLike[str]) -> RunStore:
        """Open (create, migrate) ``<state_dir>/runs.sqlite3``; close it with :meth:`aclose`.

        Raises :class:`~orchestrator.errors.StoreVersionError` for a database written by a
        newer release and :class:`~orchestrator.errors.StoreError` for one that cannot be used.
        """
        path = Path(os.fspath(state_dir)) / STORE_FILENAME
        opened: list[sqlite3.Connection] = []
        try:
            old = await trio.to_thread.run_sync(connect, path, opened)
        except BaseException:
            # cancelled after the thread connected, or the file was refused
            for conn in opened:
                conn.close()
            raise
        log.debug("run store opened", path=str(path), version=SCHEMA_VERSION, migrated_from=old)
        return cls(path, opened[0], old)

    # ----------------------------------------------------------------------- runs

    async def create_run(self, run: RunRecord, *, pipeline_source: str | None = None) -> None:
        """Record a new run; ``StoreError`` if its id is taken.

        ``pipeline_source`` is the pipeline file's text as the run loaded it (None: a pipeline
        built in code, or a run of no pipeline file): :meth:`pipeline_source` gives it back.
        """
        values = run_values(run)

        def insert(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(
                    f"INSERT INTO runs ({RUN_COLUMNS}, pipeline_source) "
                    f"VALUES ({', '.join('?' * (len(values) + 1))})",
                    (*values, pipeline_source),
                )
            except sqlite3.IntegrityError as e:
                raise StoreError(f"run {run.run_id!r} already exists in {self.path}") from e

        await self._write(insert)

    async def pipeline_source(self, run_id: str) -> str | None:
        """The text of the pipeline file as run ``run_id`` loaded it; None for a pipeline
        built in code, or a run recorded before the store kept it."""

        def select(conn: sqlite3.Connection) -> str | None:
            _sql.require_run(conn, run_id)
            row = conn.execute(
                "SELECT pipeline_source FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            return None if row[0] is None else str(row[0])

        return await self._read(select)

    async def update_run(self, run_id: str, /, **fields: Any) -> RunRecord:
        """Change fields of a run (``status=``, ``finished=``, ``result=``, ...); return it.

        Values are validated as :class:`RunRecord` validates them; ``run_id`` cannot change.
        """
        return await self._write_staged(_sql.stage_update_run(UpdateRun(run_id, fields)))

    async def get_run(self, run_id_or_prefix: str) -> RunRecord:
        """The run with this id, or the only run whose id starts with it.

        Raises :class:`~orchestrator.errors.RunNotFound` when none matches, or when the prefix
        matches several (the message lists them).
        """
        return await self._read(lambda conn: _sql.find_run(conn, self.path, run_id_or_prefix))

    async def list_runs(
        self,
        *,
        limit: int | None = 50,
        status: str | None = None,
        kind: str | None = None,
        top_level: bool = False,
    ) -> list[RunRecord]:
        """Runs, newest first; optionally only those with ``status`` or of ``kind``.

        With ``top_level``, only the runs that belong to no batch (a child run whose batch is
        no longer recorded counts as one of them), so ``limit`` counts those.
        """
        if status is not None and status not in RUN_STATUSES:
            raise UsageError(
                f"unknown run status {status!r}; one of: {', '.join(sorted(RUN_STATUSES))}"
            )
        if kind is not None and kind not in RUN_KINDS:
            raise UsageError(f"unknown run kind {kind!r}; one of: {', '.join(sorted(RUN_KINDS))}")
        if limit is not None and limit < 0:
            raise UsageError(f"limit must be None or a number not below 0, not {limit!r}")
        where: list[str] = []
        args: list[Any] = []
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        if top_level:
            where.append(_TOP_LEVEL)
        sql = f"SELECT {RUN_COLUMNS} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created DESC, rowid DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)

        def select(conn: sqlite3.Connection) -> list[RunRecord]:
            return [run_from_row(row) for row in conn.execute(sql, args)]

        return await self._read(select)

    async def children(self, run_id: str) -> list[RunRecord]:
        """The child runs of batch run ``run_id`` (one per repository), oldest first."""

        def select(conn: sqlite3.Connection) -> list[RunRecord]:
            _sql.require_run(conn, run_id)
            rows = conn.execute(
                f"SELECT {RUN_COLUMNS} FROM runs WHERE parent = ? ORDER BY created, rowid",
                (run_id,),
            )
            return [run_from_row(row) for row in rows]

        return await self._read(select)

    async def set_parent(self, run_id: str, parent: str | None) -> RunRecord:
        """Make run ``run_id`` a child of batch run ``parent`` (None: a run of its own again);
        return it as changed.

        Raises :class:`~orchestrator.errors.RunNotFound` for an unknown run or parent, and
        :class:`~orchestrator.errors.StoreError` when ``parent`` is not a batch run, or
        ``run_id`` is one (batches do not nest).
        """

        def update(conn: sqlite3.Connection) -> RunRecord:
            row = conn.execute(
                f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if row is None:
                raise RunNotFound(f"no run {run_id!r} in the run store")
            run = run_from_row(row)
            if parent is not None:
                found = conn.execute("SELECT kind FROM runs WHERE run_id = ?", (parent,)).fetchone()
                if found is None:
                    raise RunNotFound(f"no run {parent!r} in the run store")
                if found[0] != "batch":
                    raise StoreError(f"run {parent} is a {found[0]} run, not a batch run")
                if run.kind == "batch":
                    raise StoreError(f"run {run_id} is a batch run: it cannot belong to another")
            conn.execute("UPDATE runs SET parent = ? WHERE run_id = ?", (parent, run_id))
            return attrs.evolve(run, parent=parent)

        return await self._write(update)

    async def mark_interrupted(self, run_id: str) -> None:
        """Mark a running run, and its running and pending steps, ``interrupted``.

        A run that already ended keeps its status. Call it from a shielded scope when the run
        is being cancelled (Ctrl-C), or it is cancelled too.
        """
        now = time.time()

        def mark(conn: sqlite3.Connection) -> None:
            _sql.require_run(conn, run_id)
            conn.execute(
                "UPDATE runs SET status = 'interrupted', finished = coalesce(finished, ?) "
                "WHERE run_id = ? AND status = 'running'",
                (now, run_id),
            )
            # a step that never started keeps no finish time
            conn.execute(
                "UPDATE steps SET status = 'interrupted', finished = CASE WHEN status = "
                "'running' THEN coalesce(finished, ?) ELSE finished END "
                "WHERE run_id = ? AND status IN ('running', 'pending')",
                (now, run_id),
            )

        await self._write(mark)

    async def delete_run(self, run_id: str) -> None:
        """Forget a run and everything recorded for it (contents no other run shares too)."""

        def delete(conn: sqlite3.Connection) -> None:
            _sql.require_run(conn, run_id)
            blobs = _sql.change_set_blobs(conn, "run_id = ?", (run_id,))
            conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
            _sql.drop_unreferenced_blobs(conn, blobs)

        await self._write(delete)

    async def delete_runs(self, run_ids: Sequence[str], *, dry_run: bool = False) -> int:
        """Forget the runs ``run_ids`` and everything recorded for them, then every content
        blob that no remaining change uses, in one transaction; how many bytes of the database
        that frees (pages SQLite reuses for later writes; the file keeps its size).

        All or nothing: an unknown id raises :class:`~orchestrator.errors.RunNotFound` and
        nothing is deleted. With ``dry_run`` the same deletion is made and rolled back, so the
        bytes are those it would free. The blobs are collected by reference from the runs that
        remain, so content a failed earlier deletion left unreferenced goes too.
        """
        ids = list(dict.fromkeys(run_ids))

        def delete(conn: sqlite3.Connection) -> int:
            free = _sql.free_bytes(conn)
            for run_id in ids:
                _sql.require_run(conn, run_id)
                conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
            _sql.drop_all_unreferenced_blobs(conn)
            freed = max(0, _sql.free_bytes(conn) - free)
            if dry_run:
                raise _RolledBack(freed)
            return freed

        try:
            return await self._write(delete)
        except _RolledBack as done:
            return done.freed

    # ----------------------------------------------------------------------- steps

    async def put_step(self, step: StepRecord) -> None:
        """Record a step, replacing the record with the same ``(run_id, key)``.

        A replaced step keeps its place in :meth:`steps` order.
        """
        await self._write_staged(_sql.stage(PutStep(step)))

    async def steps(self, run_id: str) -> list[StepRecord]:
        """The run's steps, in the order they were first recorded."""

        def select(conn: sqlite3.Connection) -> list[StepRecord]:
            _sql.require_run(conn, run_id)
            rows = conn.execute(
                f"SELECT {STEP_COLUMNS} FROM steps WHERE run_id = ? ORDER BY seq", (run_id,)
            )
            return [step_from_row(row) for row in rows]

        return await self._read(select)

    async def put_session(self, session: SessionRecord) -> None:
        """Record the agent session that served an attempt of a step instance.

        It replaces what was recorded of that attempt and of the instance's later attempts (a
        resumed run runs the instance again from there).
        """
        await self._write_staged(_sql.stage(PutSession(session)))

    async def sessions(self, run_id: str, key: str | None = None) -> list[SessionRecord]:
        """The agent sessions of the run's step instances (of ``key`` only, if given), each
        attempt's, in the order they were recorded."""

        def select(conn: sqlite3.Connection) -> list[SessionRecord]:
            _sql.require_run(conn, run_id)
            sql = (
                "SELECT key, attempt, agent, source, session_id FROM step_sessions WHERE run_id = ?"
            )
            args: tuple[str, ...] = (run_id,)
            if key is not None:
                sql += " AND key = ?"
                args += (key,)
            rows = conn.execute(sql + " ORDER BY id", args)
            return [SessionRecord(run_id, k, a, agent, src, sid) for k, a, agent, src, sid in rows]

        return await self._read(select)

    # ----------------------------------------------------------------------- changes

    async def put_changes(
        self,
        run_id: str,
        key: str,
        changes: Sequence[StoredChange],
        *,
        diff: str,
        own_diff: str = "",
        own: Sequence[StoredChange] = (),
    ) -> None:
        """Record the change set of step ``key`` (replacing any earlier one) and its diffs.

        ``diff`` is the unified diff against the run's base; ``own_diff`` the step's own
        changes against what it forked from, and ``own`` the same as values (``write`` or
        ``delete``: :meth:`own_changes`). Contents are stored once per SHA-256.
        """
        op = PutChanges(run_id, key, changes, diff, own_diff, own)
        await self._write_staged(_sql.stage(op))

    async def changes(self, run_id: str, key: str) -> list[StoredChange]:
        """The change set of step ``key``, in the order it was given (empty if none)."""

        return await self._read(lambda conn: _sql.stored_changes(conn, "changes", run_id, key))

    async def own_changes(self, run_id: str, key: str) -> list[StoredChange]:
        """The own changes of step ``key`` (what its turns changed against what it forked
        from, each a ``write`` with its content and mode or a ``delete``), in order; empty if
        none were recorded (and for runs recorded before the store kept them)."""

        return await self._read(lambda conn: _sql.stored_changes(conn, "own_changes", run_id, key))

    async def change_entries(self, run_id: str, key: str) -> list[ChangeEntry]:
        """The change set of step ``key`` without the contents (a symlink's target aside), in
        the order it was given: what a listing needs, whatever the size of the files."""

        def select(conn: sqlite3.Connection) -> list[ChangeEntry]:
            _sql.require_run(conn, run_id)
            rows = conn.execute(
                "SELECT c.path, c.kind, c.mode, c.base_digest, b.size, "
                "CASE WHEN c.mode & ? = ? THEN b.data END FROM changes AS c "
                "LEFT JOIN blobs AS b ON b.digest = c.blob "
                "WHERE c.run_id = ? AND c.key = ? ORDER BY c.seq",
                (_FILE_TYPE, stat.S_IFLNK, run_id, key),
            )
            return [
                ChangeEntry(name_from_column(path), kind, mode, base_digest, size, target)
                for path, kind, mode, base_digest, size, target in rows
            ]

        return await self._read(select)

    async def change_keys(self, run_id: str) -> list[str]:
        """The steps of a run that have a recorded change set."""

        def select(conn: sqlite3.Connection) -> list[str]:
            _sql.require_run(conn, run_id)
            rows = conn.execute(
                "SELECT key FROM change_sets WHERE run_id = ? ORDER BY rowid", (run_id,)
            )
            return [row[0] for row in rows]

        return await self._read(select)

    async def _diff_column(self, run_id: str, key: str, column: str) -> str:
        def select(conn: sqlite3.Connection) -> str:
            _sql.require_run(conn, run_id)
            row = conn.execute(
                f"SELECT {column} FROM change_sets WHERE run_id = ? AND key = ?", (run_id, key)
            ).fetchone()
            return "" if row is None else str(row[0])

        return await self._read(select)

    async def diff(self, run_id: str, key: str) -> str:
        """The unified diff of step ``key`` against the run's base ("" if none recorded)."""
        return await self._diff_column(run_id, key, "diff")

    async def own_diff(self, run_id: str, key: str) -> str:
        """The diff of step ``key``'s own changes against what it forked from ("" if none)."""
        return await self._diff_column(run_id, key, "own_diff")

    # ----------------------------------------------------------------------- transcripts

    async def add_transcript(
        self, run_id: str, source: str, lines: Sequence[bytes | Mapping[str, Any]]
    ) -> None:
        """Append wire-transcript lines for ``source`` (e.g. ``"claude#1"``).

        ``bytes`` items are ND-JSON kept byte for byte (an item may hold several lines);
        mappings are encoded.
        """

        await self._write_staged(_sql.stage_add_transcript(run_id, source, lines))

    async def transcript(self, run_id: str, source: str | None = None) -> list[dict[str, Any]]:
        """The transcript lines of ``source`` (or of every source), in the order added."""

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            _sql.require_run(conn, run_id)
            if source is None:
                rows = conn.execute(
                    "SELECT line FROM transcripts WHERE run_id = ? ORDER BY id", (run_id,)
                )
            else:
                rows = conn.execute(
                    "SELECT line FROM transcripts WHERE run_id = ? AND source = ? ORDER BY id",
                    (run_id, source),
                )
            return transcript_rows([row[0] for row in rows])

        return await self._read(select)

    async def transcript_sources(self, run_id: str) -> list[str]:
        """The sources that have transcript lines, in the order they first appeared."""

        def select(conn: sqlite3.Connection) -> list[str]:
            _sql.require_run(conn, run_id)
            rows = conn.execute(
                "SELECT source FROM transcripts WHERE run_id = ? GROUP BY source ORDER BY min(id)",
                (run_id,),
            )
            return [row[0] for row in rows]

        return await self._read(select)

    # ----------------------------------------------------------------------- audit records

    async def add_permissions(
        self, run_id: str, key: str, records: Sequence[Mapping[str, Any]]
    ) -> None:
        """Append permission decisions (audit records as JSON objects) of step ``key``."""
        await self._write_staged(_sql.stage(AddPermissions(run_id, key, records)))

    async def permissions(self, run_id: str, key: str | None = None) -> list[dict[str, Any]]:
        """The permission decisions of step ``key`` (or of the whole run), in order.

        Each record gets ``"stepKey"``: the key it was added under (records keep their own
        ``"step"``, the step's name).
        """

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            _sql.require_run(conn, run_id)
            sql = "SELECT key, record FROM permissions WHERE run_id = ?"
            args: tuple[str, ...] = (run_id,)
            if key is not None:
                sql += " AND key = ?"
                args += (key,)
            rows = conn.execute(sql + " ORDER BY id", args)
            return [{**orjson.loads(record), "stepKey": k} for k, record in rows]

        return await self._read(select)

    async def add_conflicts(
        self, run_id: str, key: str, conflicts: Sequence[Mapping[str, Any]]
    ) -> None:
        """Append the merge conflicts (as JSON objects) met at step ``key``."""
        await self._write_staged(_sql.stage(AddConflicts(run_id, key, conflicts)))

    async def clear_conflicts(self, run_id: str) -> None:
        """Forget the merge conflicts recorded for run ``run_id``.

        A resume merges again every branch it reaches (reused instances' branches too) and
        records the conflicts as they stand now; those of an earlier attempt would stand beside
        them, unresolved ones that a changed merge strategy now settles among them.
        """

        def clear(conn: sqlite3.Connection) -> None:
            _sql.require_run(conn, run_id)
            conn.execute("DELETE FROM conflicts WHERE run_id = ?", (run_id,))

        await self._write(clear)

    async def conflicts(self, run_id: str) -> list[dict[str, Any]]:
        """The run's conflicts in order, each with ``"step"``: the key it was added under."""

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            _sql.require_run(conn, run_id)
            rows = conn.execute(
                "SELECT key, record FROM conflicts WHERE run_id = ? ORDER BY id", (run_id,)
            )
            return [{**orjson.loads(record), "step": k} for k, record in rows]

        return await self._read(select)

    # ----------------------------------------------------------------------- applies

    async def add_apply(self, record: ApplyRecord) -> None:
        """Record an apply; one to the workspace also sets the run's ``applied`` time.

        Both in one transaction, so a run is never marked applied without the record of what.
        """
        keys = None if record.keys is None else orjson.dumps(list(record.keys)).decode()

        def insert(conn: sqlite3.Connection) -> None:
            _sql.require_run(conn, record.run_id)
            conn.execute(
                "INSERT INTO applies (run_id, keys, at, git_branch, git_commit) "
                "VALUES (?, ?, ?, ?, ?)",
                (record.run_id, keys, record.at, record.git_branch, record.git_commit),
            )
            if record.git_branch is None:
                conn.execute(
                    "UPDATE runs SET applied = ? WHERE run_id = ?", (record.at, record.run_id)
                )

        await self._write(insert)

    async def applies(self, run_id: str) -> list[ApplyRecord]:
        """The run's applies, oldest first."""

        def select(conn: sqlite3.Connection) -> list[ApplyRecord]:
            _sql.require_run(conn, run_id)
            rows = conn.execute(
                "SELECT keys, at, git_branch, git_commit FROM applies WHERE run_id = ? ORDER BY id",
                (run_id,),
            )
            return [
                ApplyRecord(
                    run_id,
                    None if keys is None else tuple(orjson.loads(keys)),
                    at,
                    branch,
                    commit,
                )
                for keys, at, branch, commit in rows
            ]

        return await self._read(select)

    # ----------------------------------------------------------------------- timeline

    async def add_event(self, run_id: str, event: Mapping[str, Any]) -> None:
        """Append an event to the run's timeline (``{"type", "step", "time", ...}``)."""
        await self._write_staged(_sql.stage(AddEvent(run_id, event)))

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's timeline, in the order added."""

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            _sql.require_run(conn, run_id)
            rows = conn.execute("SELECT record FROM events WHERE run_id = ? ORDER BY id", (run_id,))
            return [orjson.loads(row[0]) for row in rows]

        return await self._read(select)

    # ----------------------------------------------------------------------- batches

    async def write_many(self, ops: Sequence[StoreOp]) -> None:
        """Make several writes in one worker-thread hop and one transaction, in order.

        Each op does what the method it is named after does (:class:`~orchestrator.store.PutStep`
        is :meth:`put_step`, and so on). Every op is checked and encoded before anything is
        written, and if one fails (an unknown run, a bad value) none of them is written: the
        error is raised and the store is as it was. An empty batch does nothing. The batch
        counts as one write in :meth:`statistics`.
        """
        batch = list(ops)
        staged = _sql.stage_batch(batch)
        if not batch:
            self._require_open()
            await trio.lowlevel.checkpoint()
            return
        await self._write_staged(staged)


class _RolledBack(Exception):
    """Raised inside a transaction to roll it back, carrying what it measured."""

    def __init__(self, freed: int) -> None:
        super().__init__(freed)
        self.freed = freed


@contextlib.asynccontextmanager
async def open_run_store(state_dir: str | os.PathLike[str]) -> AsyncIterator[RunStore]:
    """The run store of ``state_dir`` (``runs.sqlite3`` in it), closed on exit."""
    store = await RunStore.open(state_dir)
    try:
        yield store
    finally:
        await store.aclose()
