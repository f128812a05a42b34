"""The run store: every run recorded in ``<state_dir>/runs.sqlite3``.

One SQLite connection per :class:`RunStore`, used from worker threads one call at a time (a
:class:`trio.Lock` serializes them), so the event loop never blocks on the disk. Each call is
one transaction; writes take the write lock up front (``BEGIN IMMEDIATE``) so two processes
never deadlock upgrading a read lock. A thread is never abandoned on cancellation: a cancelled
call finishes (or rolls back) its transaction before ``trio.Cancelled`` is raised, so a write is
never half done. WAL mode lets another process (``orchestrator runs`` during a run) read while
this one writes; a writer waits up to 5 s for another's write lock.

File contents of change sets are kept once per content (a ``blobs`` table keyed by SHA-256),
shared by every step and run that wrote the same bytes, and dropped when no change refers to
them any more.

Per-run calls take the run's full id and raise :class:`~orchestrator.errors.RunNotFound` for an
unknown one; :meth:`RunStore.get_run` also accepts a unique prefix.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import attrs
import orjson
import structlog
import trio
from attrs import define, field

from ..errors import RunNotFound, StoreError, UsageError
from . import _schema
from ._schema import SCHEMA_VERSION, connect
from .records import RUN_KINDS, RUN_STATUSES, RunRecord, StepRecord, StoredChange

__all__ = ["STORE_FILENAME", "RunStore", "open_run_store"]

log = structlog.get_logger(__name__)

T = TypeVar("T")

#: the database's file name inside the state directory
STORE_FILENAME = "runs.sqlite3"

#: how many candidates an ambiguous-prefix message lists
_MAX_CANDIDATES = 10

_RUN_UPDATABLE = frozenset(a.name for a in attrs.fields(RunRecord)) - {"run_id"}

_RUN_COLUMNS = (
    "run_id, kind, status, created, finished, cwd, pipeline, pipeline_digest, inputs, options, "
    "result, error, applied"
)
_STEP_COLUMNS = (
    "run_id, key, step, instance, agent, status, attempt, started, finished, session_id, "
    "result, value, value_stored, error, cause, usage"
)


# --------------------------------------------------------------------------- JSON and rows


def _dumps(value: Any, what: str) -> str:
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as e:
        raise TypeError(f"{what} is not JSON-serializable: {e}") from e


def _dumps_or_none(value: Any, what: str) -> str | None:
    return None if value is None else _dumps(value, what)


def _loads(text: str | bytes | None) -> Any:
    return None if text is None else orjson.loads(text)


def _run_values(run: RunRecord) -> tuple[Any, ...]:
    """The row of ``run`` in ``_RUN_COLUMNS`` order."""
    return (
        run.run_id,
        run.kind,
        run.status,
        run.created,
        run.finished,
        run.cwd,
        run.pipeline,
        run.pipeline_digest,
        _dumps(dict(run.inputs), "run inputs"),
        _dumps(dict(run.options), "run options"),
        None if run.result is None else _dumps(dict(run.result), "run result"),
        run.error,
        run.applied,
    )


def _run_from_row(row: Sequence[Any]) -> RunRecord:
    (run_id, kind, status, created, finished, cwd, pipeline, digest) = row[:8]
    inputs, options, result, error, applied = row[8:]
    return RunRecord(
        run_id=run_id,
        kind=kind,
        status=status,
        created=created,
        cwd=cwd,
        finished=finished,
        pipeline=pipeline,
        pipeline_digest=digest,
        inputs=_loads(inputs),
        options=_loads(options),
        result=_loads(result),
        error=error,
        applied=applied,
    )


def _step_values(step: StepRecord) -> tuple[Any, ...]:
    """The row of ``step`` in ``_STEP_COLUMNS`` order."""
    what = f"step {step.key!r}"
    return (
        step.run_id,
        step.key,
        step.step,
        step.instance,
        step.agent,
        step.status,
        step.attempt,
        step.started,
        step.finished,
        step.session_id,
        None if step.result is None else _dumps(dict(step.result), f"{what} result"),
        _dumps(step.value, f"{what} value") if step.value_stored else None,
        int(step.value_stored),
        step.error,
        step.cause,
        None if step.usage is None else _dumps(dict(step.usage), f"{what} usage"),
    )


def _step_from_row(row: Sequence[Any]) -> StepRecord:
    (run_id, key, step, instance, agent, status, attempt, started, finished) = row[:9]
    session_id, result, value, value_stored, error, cause, usage = row[9:]
    return StepRecord(
        run_id=run_id,
        key=key,
        step=step,
        instance=instance,
        agent=agent,
        status=status,
        attempt=attempt,
        started=started,
        finished=finished,
        session_id=session_id,
        result=_loads(result),
        value=_loads(value) if value_stored else None,
        value_stored=bool(value_stored),
        error=error,
        cause=cause,
        usage=_loads(usage),
    )


def _transcript_lines(lines: Sequence[bytes | Mapping[str, Any]]) -> list[bytes]:
    """ND-JSON lines as stored: bytes items split at newlines (blank lines dropped)."""
    out: list[bytes] = []
    for item in lines:
        if isinstance(item, bytes | bytearray | memoryview):
            out.extend(line for line in bytes(item).split(b"\n") if line.strip())
        else:
            out.append(orjson.dumps(dict(item)))
    return out


def _transcript_line(line: bytes) -> dict[str, Any]:
    """A stored line decoded; a line that is not a JSON object is kept as ``{"raw": text}``."""
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        value = None
    if isinstance(value, dict):
        return value
    return {"raw": bytes(line).decode("utf-8", "replace")}


# --------------------------------------------------------------------------- thread side


@contextlib.contextmanager
def _transaction(conn: sqlite3.Connection, *, write: bool) -> Iterator[None]:
    """One transaction: committed when the block ends, rolled back when it raises."""
    conn.execute("BEGIN IMMEDIATE" if write else "BEGIN")
    try:
        yield
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                log.exception("run store rollback failed")


def _require_run(conn: sqlite3.Connection, run_id: str) -> None:
    if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
        raise RunNotFound(f"no run {run_id!r} in the run store")


def _prefix_bound(prefix: str) -> str | None:
    """The smallest string above every string starting with ``prefix``, if one is encodable."""
    nxt = ord(prefix[-1]) + 1
    if nxt > 0x10FFFF or 0xD800 <= nxt <= 0xDFFF:
        return None
    return prefix[:-1] + chr(nxt)


def _find_run(conn: sqlite3.Connection, path: Path, id_or_prefix: str) -> RunRecord:
    row = conn.execute(
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (id_or_prefix,)
    ).fetchone()
    if row is not None:
        return _run_from_row(row)
    if not id_or_prefix:
        raise RunNotFound("an empty run id names no run")
    bound = _prefix_bound(id_or_prefix)
    args: tuple[str | int, ...]
    if bound is not None:
        # a range over the primary key: exactly the ids starting with the prefix
        where, args = "run_id >= ? AND run_id < ?", (id_or_prefix, bound)
    else:
        where, args = "substr(run_id, 1, ?) = ?", (len(id_or_prefix), id_or_prefix)
    rows = conn.execute(
        f"SELECT {_RUN_COLUMNS} FROM runs WHERE {where} ORDER BY created DESC, rowid DESC "
        f"LIMIT {_MAX_CANDIDATES + 1}",
        args,
    ).fetchall()
    if not rows:
        raise RunNotFound(f"no run {id_or_prefix!r} in {path} (`orchestrator runs` lists them)")
    if len(rows) > 1:
        (total,) = conn.execute(f"SELECT count(*) FROM runs WHERE {where}", args).fetchone()
        names = ", ".join(row[0] for row in rows[:_MAX_CANDIDATES])
        more = f" and {total - _MAX_CANDIDATES} more" if total > _MAX_CANDIDATES else ""
        raise RunNotFound(
            f"run id prefix {id_or_prefix!r} is ambiguous: {total} runs match ({names}{more}); "
            f"give more characters"
        )
    return _run_from_row(rows[0])


def _store_blob(conn: sqlite3.Connection, digest: str, data: bytes) -> None:
    """Keep ``data`` under ``digest`` unless it is already there."""
    conn.execute(
        "INSERT OR IGNORE INTO blobs (digest, size, data) VALUES (?, ?, ?)",
        (digest, len(data), data),
    )


def _drop_unreferenced_blobs(conn: sqlite3.Connection, digests: Iterable[str]) -> None:
    """Delete those of ``digests`` that no change refers to any more."""
    conn.executemany(
        "DELETE FROM blobs WHERE digest = ? "
        "AND NOT EXISTS (SELECT 1 FROM changes WHERE blob = blobs.digest)",
        ((d,) for d in set(digests)),
    )


def _change_set_blobs(conn: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> list[str]:
    rows = conn.execute(
        f"SELECT DISTINCT blob FROM changes WHERE {where} AND blob IS NOT NULL", args
    ).fetchall()
    return [row[0] for row in rows]


def _describe(path: Path, error: sqlite3.Error) -> str:
    text = str(error)
    if "locked" in text or "busy" in text:
        return (
            f"the run store {path} is busy: another process held its write lock for more "
            f"than {_schema.BUSY_TIMEOUT_MS / 1000:g} s ({text})"
        )
    return f"run store {path}: {text}"


# --------------------------------------------------------------------------- the store


@define(eq=False)
class RunStore:
    """The SQLite store of runs; open it with :func:`open_run_store` (or :meth:`open`).

    Every method that touches the database is async and runs it in a worker thread; calls
    from many tasks are serialized. Safe to share between the tasks of one trio run, and to
    open from several processes at once.
    """

    #: the database file
    path: Path
    _conn: sqlite3.Connection | None = field(alias="conn", repr=False)
    #: the schema version the file had when opened (0 for a new file)
    migrated_from: int = 0
    _lock: trio.Lock = field(factory=trio.Lock, init=False, repr=False)
    _reads: int = field(default=0, init=False, repr=False)
    _writes: int = field(default=0, init=False, repr=False)
    _seconds: float = field(default=0.0, init=False, repr=False)

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

    async def aclose(self) -> None:
        """Close the connection (idempotent); later calls raise ``StoreError``."""
        # shielded: closing on the way out of a cancelled scope must still happen
        with trio.CancelScope(shield=True):
            async with self._lock:
                conn, self._conn = self._conn, None
                if conn is not None:
                    await trio.to_thread.run_sync(conn.close)

    @property
    def closed(self) -> bool:
        """Whether :meth:`aclose` was called."""
        return self._conn is None

    def statistics(self) -> dict[str, Any]:
        """Where the store is, its schema version, and the calls made through this object."""
        return {
            "path": str(self.path),
            "schemaVersion": SCHEMA_VERSION,
            "migratedFrom": self.migrated_from,
            "calls": self._reads + self._writes,
            "reads": self._reads,
            "writes": self._writes,
            "seconds": round(self._seconds, 6),
        }

    # ----------------------------------------------------------------------- plumbing

    def _run_blocking(
        self, fn: Callable[[sqlite3.Connection], T], write: bool, own_transaction: bool
    ) -> T:
        conn = self._conn
        if conn is None:
            raise StoreError(f"the run store {self.path} is closed")
        start = time.perf_counter()
        try:
            if own_transaction:
                return fn(conn)
            with _transaction(conn, write=write):
                return fn(conn)
        except sqlite3.Error as e:
            raise StoreError(_describe(self.path, e)) from e
        finally:
            self._seconds += time.perf_counter() - start

    async def _call(
        self, fn: Callable[[sqlite3.Connection], T], *, write: bool, own_transaction: bool
    ) -> T:
        async with self._lock:
            if write:
                self._writes += 1
            else:
                self._reads += 1
            # not abandoned on cancel: the transaction ends (commit or rollback) first
            return await trio.to_thread.run_sync(self._run_blocking, fn, write, own_transaction)

    async def _read(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._call(fn, write=False, own_transaction=False)

    async def _write(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        return await self._call(fn, write=True, own_transaction=False)

    async def _write_with_prelude(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """A write whose ``fn`` prepares data first, then opens :func:`_transaction` itself."""
        return await self._call(fn, write=True, own_transaction=True)

    # ----------------------------------------------------------------------- runs

    async def create_run(self, run: RunRecord) -> None:
        """Record a new run; ``StoreError`` if its id is taken."""
        values = _run_values(run)

        def insert(conn: sqlite3.Connection) -> None:
            try:
                conn.execute(
                    f"INSERT INTO runs ({_RUN_COLUMNS}) VALUES ({', '.join('?' * len(values))})",
                    values,
                )
            except sqlite3.IntegrityError as e:
                raise StoreError(f"run {run.run_id!r} already exists in {self.path}") from e

        await self._write(insert)

    async def update_run(self, run_id: str, /, **fields: Any) -> RunRecord:
        """Change fields of a run (``status=``, ``finished=``, ``result=``, ...); return it.

        Values are validated as :class:`RunRecord` validates them; ``run_id`` cannot change.
        """
        unknown = set(fields) - _RUN_UPDATABLE
        if unknown:
            raise TypeError(f"update_run: not a changeable run field: {', '.join(sorted(unknown))}")

        def update(conn: sqlite3.Connection) -> RunRecord:
            row = conn.execute(
                f"SELECT {_RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)
            ).fetchone()
            if row is None:
                raise RunNotFound(f"no run {run_id!r} in the run store")
            run = attrs.evolve(_run_from_row(row), **fields)
            values = _run_values(run)
            columns = [c.strip() for c in _RUN_COLUMNS.split(",")][1:]
            conn.execute(
                f"UPDATE runs SET {', '.join(f'{c} = ?' for c in columns)} WHERE run_id = ?",
                (*values[1:], run_id),
            )
            return run

        return await self._write(update)

    async def get_run(self, run_id_or_prefix: str) -> RunRecord:
        """The run with this id, or the only run whose id starts with it.

        Raises :class:`~orchestrator.errors.RunNotFound` when none matches, or when the prefix
        matches several (the message lists them).
        """
        return await self._read(lambda conn: _find_run(conn, self.path, run_id_or_prefix))

    async def list_runs(
        self, *, limit: int | None = 50, status: str | None = None, kind: str | None = None
    ) -> list[RunRecord]:
        """Runs, newest first; optionally only those with ``status`` or of ``kind``."""
        if status is not None and status not in RUN_STATUSES:
            raise UsageError(
                f"unknown run status {status!r}; one of: {', '.join(sorted(RUN_STATUSES))}"
            )
        if kind is not None and kind not in RUN_KINDS:
            raise UsageError(f"unknown run kind {kind!r}; one of: {', '.join(sorted(RUN_KINDS))}")
        if limit is not None and limit < 0:
            raise ValueError("limit must not be negative")
        where: list[str] = []
        args: list[Any] = []
        if status is not None:
            where.append("status = ?")
            args.append(status)
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        sql = f"SELECT {_RUN_COLUMNS} FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created DESC, rowid DESC"
        if limit is not None:
            sql += " LIMIT ?"
            args.append(limit)

        def select(conn: sqlite3.Connection) -> list[RunRecord]:
            return [_run_from_row(row) for row in conn.execute(sql, args)]

        return await self._read(select)

    async def mark_interrupted(self, run_id: str) -> None:
        """Mark a running run, and its running and pending steps, ``interrupted``.

        A run that already ended keeps its status. Call it from a shielded scope when the run
        is being cancelled (Ctrl-C), or it is cancelled too.
        """
        now = time.time()

        def mark(conn: sqlite3.Connection) -> None:
            _require_run(conn, run_id)
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
            _require_run(conn, run_id)
            blobs = _change_set_blobs(conn, "run_id = ?", (run_id,))
            conn.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))
            _drop_unreferenced_blobs(conn, blobs)

        await self._write(delete)

    # ----------------------------------------------------------------------- steps

    async def put_step(self, step: StepRecord) -> None:
        """Record a step, replacing the record with the same ``(run_id, key)``.

        A replaced step keeps its place in :meth:`steps` order.
        """
        values = _step_values(step)
        columns = [c.strip() for c in _STEP_COLUMNS.split(",")]
        updates = ", ".join(f"{c} = excluded.{c}" for c in columns[2:])

        def upsert(conn: sqlite3.Connection) -> None:
            _require_run(conn, step.run_id)
            conn.execute(
                f"INSERT INTO steps ({_STEP_COLUMNS}) VALUES ({', '.join('?' * len(values))}) "
                f"ON CONFLICT (run_id, key) DO UPDATE SET {updates}",
                values,
            )

        await self._write(upsert)

    async def steps(self, run_id: str) -> list[StepRecord]:
        """The run's steps, in the order they were first recorded."""

        def select(conn: sqlite3.Connection) -> list[StepRecord]:
            _require_run(conn, run_id)
            rows = conn.execute(
                f"SELECT {_STEP_COLUMNS} FROM steps WHERE run_id = ? ORDER BY seq", (run_id,)
            )
            return [_step_from_row(row) for row in rows]

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
    ) -> None:
        """Record the change set of step ``key`` (replacing any earlier one) and its diffs.

        ``diff`` is the unified diff against the run's base; ``own_diff`` the step's own
        changes against what it forked from. Contents are stored once per SHA-256.
        """
        seen: set[str] = set()
        for change in changes:
            if change.path in seen:
                raise ValueError(f"path {change.path!r} appears twice in the change set of {key!r}")
            seen.add(change.path)
        items = list(changes)

        def replace(conn: sqlite3.Connection) -> None:
            digests = [
                None if c.data is None else hashlib.sha256(c.data).hexdigest() for c in items
            ]
            with _transaction(conn, write=True):
                _require_run(conn, run_id)
                old = _change_set_blobs(conn, "run_id = ? AND key = ?", (run_id, key))
                conn.execute("DELETE FROM change_sets WHERE run_id = ? AND key = ?", (run_id, key))
                conn.execute(
                    "INSERT INTO change_sets (run_id, key, diff, own_diff) VALUES (?, ?, ?, ?)",
                    (run_id, key, diff, own_diff),
                )
                for seq, (change, digest) in enumerate(zip(items, digests, strict=True)):
                    if change.data is not None and digest is not None:
                        _store_blob(conn, digest, change.data)
                    conn.execute(
                        "INSERT INTO changes (run_id, key, seq, path, kind, blob, mode, "
                        "base_digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                        (
                            run_id,
                            key,
                            seq,
                            change.path,
                            change.kind,
                            digest,
                            change.mode,
                            change.base_digest,
                        ),
                    )
                _drop_unreferenced_blobs(conn, old)

        # hashing happens in the thread, before the write lock is taken
        await self._write_with_prelude(replace)

    async def changes(self, run_id: str, key: str) -> list[StoredChange]:
        """The change set of step ``key``, in the order it was given (empty if none)."""

        def select(conn: sqlite3.Connection) -> list[StoredChange]:
            _require_run(conn, run_id)
            rows = conn.execute(
                "SELECT c.path, c.kind, b.data, c.mode, c.base_digest FROM changes AS c "
                "LEFT JOIN blobs AS b ON b.digest = c.blob "
                "WHERE c.run_id = ? AND c.key = ? ORDER BY c.seq",
                (run_id, key),
            )
            return [
                StoredChange(path, kind, data, mode, base_digest)
                for path, kind, data, mode, base_digest in rows
            ]

        return await self._read(select)

    async def change_keys(self, run_id: str) -> list[str]:
        """The steps of a run that have a recorded change set."""

        def select(conn: sqlite3.Connection) -> list[str]:
            _require_run(conn, run_id)
            rows = conn.execute(
                "SELECT key FROM change_sets WHERE run_id = ? ORDER BY rowid", (run_id,)
            )
            return [row[0] for row in rows]

        return await self._read(select)

    async def _diff_column(self, run_id: str, key: str, column: str) -> str:
        def select(conn: sqlite3.Connection) -> str:
            _require_run(conn, run_id)
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

        def append(conn: sqlite3.Connection) -> None:
            encoded = _transcript_lines(lines)
            with _transaction(conn, write=True):
                _require_run(conn, run_id)
                conn.executemany(
                    "INSERT INTO transcripts (run_id, source, line) VALUES (?, ?, ?)",
                    ((run_id, source, line) for line in encoded),
                )

        await self._write_with_prelude(append)

    async def transcript(self, run_id: str, source: str | None = None) -> list[dict[str, Any]]:
        """The transcript lines of ``source`` (or of every source), in the order added."""

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            _require_run(conn, run_id)
            if source is None:
                rows = conn.execute(
                    "SELECT line FROM transcripts WHERE run_id = ? ORDER BY id", (run_id,)
                )
            else:
                rows = conn.execute(
                    "SELECT line FROM transcripts WHERE run_id = ? AND source = ? ORDER BY id",
                    (run_id, source),
                )
            return [_transcript_line(row[0]) for row in rows]

        return await self._read(select)

    async def transcript_sources(self, run_id: str) -> list[str]:
        """The sources that have transcript lines, in the order they first appeared."""

        def select(conn: sqlite3.Connection) -> list[str]:
            _require_run(conn, run_id)
            rows = conn.execute(
                "SELECT source FROM transcripts WHERE run_id = ? GROUP BY source ORDER BY min(id)",
                (run_id,),
            )
            return [row[0] for row in rows]

        return await self._read(select)

    # ----------------------------------------------------------------------- audit records

    async def _add_records(
        self, table: str, run_id: str, key: str, records: Sequence[Mapping[str, Any]]
    ) -> None:
        encoded = [_dumps(dict(r), f"{table} record") for r in records]

        def insert(conn: sqlite3.Connection) -> None:
            _require_run(conn, run_id)
            conn.executemany(
                f"INSERT INTO {table} (run_id, key, record) VALUES (?, ?, ?)",
                ((run_id, key, text) for text in encoded),
            )

        await self._write(insert)

    async def add_permissions(
        self, run_id: str, key: str, records: Sequence[Mapping[str, Any]]
    ) -> None:
        """Append permission decisions (audit records as JSON objects) of step ``key``."""
        await self._add_records("permissions", run_id, key, records)

    async def permissions(self, run_id: str, key: str | None = None) -> list[dict[str, Any]]:
        """The permission decisions of step ``key`` (or of the whole run), in order.

        Each record gets ``"stepKey"``: the key it was added under (records keep their own
        ``"step"``, the step's name).
        """

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            _require_run(conn, run_id)
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
        await self._add_records("conflicts", run_id, key, conflicts)

    async def conflicts(self, run_id: str) -> list[dict[str, Any]]:
        """The run's conflicts in order, each with ``"step"``: the key it was added under."""

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            _require_run(conn, run_id)
            rows = conn.execute(
                "SELECT key, record FROM conflicts WHERE run_id = ? ORDER BY id", (run_id,)
            )
            return [{**orjson.loads(record), "step": k} for k, record in rows]

        return await self._read(select)

    # ----------------------------------------------------------------------- timeline

    async def add_event(self, run_id: str, event: Mapping[str, Any]) -> None:
        """Append an event to the run's timeline (``{"type", "step", "time", ...}``)."""
        text = _dumps(dict(event), "event")

        def insert(conn: sqlite3.Connection) -> None:
            _require_run(conn, run_id)
            conn.execute("INSERT INTO events (run_id, record) VALUES (?, ?)", (run_id, text))

        await self._write(insert)

    async def events(self, run_id: str) -> list[dict[str, Any]]:
        """The run's timeline, in the order added."""

        def select(conn: sqlite3.Connection) -> list[dict[str, Any]]:
            _require_run(conn, run_id)
            rows = conn.execute("SELECT record FROM events WHERE run_id = ? ORDER BY id", (run_id,))
            return [orjson.loads(row[0]) for row in rows]

        return await self._read(select)


@contextlib.asynccontextmanager
async def open_run_store(state_dir: str | os.PathLike[str]) -> AsyncIterator[RunStore]:
    """The run store of ``state_dir`` (``runs.sqlite3`` in it), closed on exit."""
    store = await RunStore.open(state_dir)
    try:
        yield store
    finally:
        await store.aclose()
