"""The run store's statements that more than one call shares, run in its worker thread.

Lookups (a run by id or prefix, content blobs) and the writes that both the single-write methods
of :class:`~orchestrator.store.RunStore` and :meth:`~orchestrator.store.RunStore.write_many` make.
A write is *staged* (see ``_db``): ``stage_*`` checks and encodes its op in the caller, so a bad
value fails before the database is touched; what it returns runs in the worker thread.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import attrs

from .._names import name_column, name_from_column
from ..errors import RunNotFound
from ._db import Apply, Staged
from ._rows import RUN_COLUMNS, STEP_COLUMNS, dumps, run_from_row, run_values, step_values
from ._rows import transcript_lines as encode_transcript_lines
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
from .records import RunRecord, StoredChange

__all__ = [
    "change_set_blobs",
    "drop_all_unreferenced_blobs",
    "drop_unreferenced_blobs",
    "find_run",
    "free_bytes",
    "read_blob",
    "require_run",
    "stage",
    "stage_add_transcript",
    "stage_batch",
    "stage_update_run",
    "store_blob",
]

#: how many candidates an ambiguous-prefix message lists
_MAX_CANDIDATES = 10


# --------------------------------------------------------------------------- lookups


def require_run(conn: sqlite3.Connection, run_id: str) -> None:
    """Raise :class:`~orchestrator.errors.RunNotFound` unless the run is recorded."""
    if conn.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone() is None:
        raise RunNotFound(f"no run {run_id!r} in the run store")


def _prefix_bound(prefix: str) -> str | None:
    """The smallest string above every string starting with ``prefix``, if one is encodable."""
    nxt = ord(prefix[-1]) + 1
    if nxt > 0x10FFFF or 0xD800 <= nxt <= 0xDFFF:
        return None
    return prefix[:-1] + chr(nxt)


def find_run(conn: sqlite3.Connection, path: Path, id_or_prefix: str) -> RunRecord:
    """The run with this id, or the only one whose id starts with it (else ``RunNotFound``)."""
    row = conn.execute(
        f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?", (id_or_prefix,)
    ).fetchone()
    if row is not None:
        return run_from_row(row)
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
        f"SELECT {RUN_COLUMNS} FROM runs WHERE {where} ORDER BY created DESC, rowid DESC "
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
    return run_from_row(rows[0])


#: content larger than this is written and read in pieces of this size, through an incremental
#: blob handle: bound or selected whole, SQLite would make a copy of all of it
BLOB_PIECE = 1 << 20


def store_blob(conn: sqlite3.Connection, digest: str, data: bytes) -> None:
    """Keep ``data`` under ``digest`` unless it is already there (then it is not copied)."""
    if conn.execute("SELECT 1 FROM blobs WHERE digest = ?", (digest,)).fetchone() is not None:
        return
    size = len(data)
    if size <= BLOB_PIECE:
        conn.execute(
            "INSERT INTO blobs (digest, size, data) VALUES (?, ?, ?)", (digest, size, data)
        )
        return
    cursor = conn.execute(
        "INSERT INTO blobs (digest, size, data) VALUES (?, ?, zeroblob(?))", (digest, size, size)
    )
    assert cursor.lastrowid is not None
    view = memoryview(data)
    with conn.blobopen("blobs", "data", cursor.lastrowid) as blob:
        for at in range(0, size, BLOB_PIECE):
            blob.write(view[at : at + BLOB_PIECE])


def read_blob(conn: sqlite3.Connection, rowid: int) -> bytes:
    """The content of the blob in row ``rowid``, read straight into one ``bytes``."""
    with conn.blobopen("blobs", "data", rowid, readonly=True) as blob:
        return blob.read()


#: a blob no change and no own change refers to (``blobs`` being the row looked at)
_UNREFERENCED = (
    "NOT EXISTS (SELECT 1 FROM changes WHERE blob = blobs.digest) "
    "AND NOT EXISTS (SELECT 1 FROM own_changes WHERE blob = blobs.digest)"
)


def drop_unreferenced_blobs(conn: sqlite3.Connection, digests: Iterable[str]) -> None:
    """Delete those of ``digests`` that no change (nor own change) refers to any more."""
    conn.executemany(
        f"DELETE FROM blobs WHERE digest = ? AND {_UNREFERENCED}",
        ((d,) for d in set(digests)),
    )


def drop_all_unreferenced_blobs(conn: sqlite3.Connection) -> None:
    """Delete every content blob that no change (nor own change) refers to (a collection by
    reference)."""
    conn.execute(f"DELETE FROM blobs WHERE {_UNREFERENCED}")


def free_bytes(conn: sqlite3.Connection) -> int:
    """The bytes of the database's free pages (those SQLite reuses before growing the file)."""
    pages = conn.execute("PRAGMA freelist_count").fetchone()[0]
    size = conn.execute("PRAGMA page_size").fetchone()[0]
    return int(pages) * int(size)


def change_set_blobs(conn: sqlite3.Connection, where: str, args: tuple[Any, ...]) -> list[str]:
    """The distinct content blobs that the changes and own changes matching ``where`` refer to."""
    rows = conn.execute(
        f"SELECT blob FROM changes WHERE {where} AND blob IS NOT NULL UNION "
        f"SELECT blob FROM own_changes WHERE {where} AND blob IS NOT NULL",
        args + args,
    ).fetchall()
    return [row[0] for row in rows]


# --------------------------------------------------------------------------- writes


def _ready(apply: Apply[Any]) -> Staged[None]:
    """A staged write with nothing to prepare in the thread."""
    return lambda: apply


def _stage_put_step(op: PutStep) -> Staged[None]:
    step = op.step
    values = step_values(step)
    columns = [c.strip() for c in STEP_COLUMNS.split(",")]
    updates = ", ".join(f"{c} = excluded.{c}" for c in columns[2:])

    def upsert(conn: sqlite3.Connection) -> None:
        require_run(conn, step.run_id)
        conn.execute(
            f"INSERT INTO steps ({STEP_COLUMNS}) VALUES ({', '.join('?' * len(values))}) "
            f"ON CONFLICT (run_id, key) DO UPDATE SET {updates}",
            values,
        )

    return _ready(upsert)


def _stage_put_changes(op: PutChanges) -> Staged[None]:
    run_id, key, items, own = op.run_id, op.key, op.changes, op.own

    # hashing happens in the thread, before the write lock is taken
    def hash_contents() -> Apply[None]:
        digests = [None if c.data is None else hashlib.sha256(c.data).hexdigest() for c in items]
        own_digests = [None if c.data is None else hashlib.sha256(c.data).hexdigest() for c in own]

        def replace(conn: sqlite3.Connection) -> None:
            require_run(conn, run_id)
            old = change_set_blobs(conn, "run_id = ? AND key = ?", (run_id, key))
            conn.execute("DELETE FROM change_sets WHERE run_id = ? AND key = ?", (run_id, key))
            conn.execute(
                "INSERT INTO change_sets (run_id, key, diff, own_diff) VALUES (?, ?, ?, ?)",
                (run_id, key, op.diff, op.own_diff),
            )
            for seq, (change, digest) in enumerate(zip(items, digests, strict=True)):
                if change.data is not None and digest is not None:
                    store_blob(conn, digest, change.data)
                conn.execute(
                    "INSERT INTO changes (run_id, key, seq, path, kind, blob, mode, "
                    "base_digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run_id,
                        key,
                        seq,
                        name_column(change.path),  # text, or the bytes of a non-UTF-8 name
                        change.kind,
                        digest,
                        change.mode,
                        change.base_digest,
                    ),
                )
            for seq, (change, digest) in enumerate(zip(own, own_digests, strict=True)):
                if change.data is not None and digest is not None:
                    store_blob(conn, digest, change.data)
                conn.execute(
                    "INSERT INTO own_changes (run_id, key, seq, path, kind, blob, mode, "
                    "base_digest) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    (
                        run_id,
                        key,
                        seq,
                        name_column(change.path),
                        change.kind,
                        digest,
                        change.mode,
                        change.base_digest,
                    ),
                )
            drop_unreferenced_blobs(conn, old)

        return replace

    return hash_contents


def _stage_put_session(op: PutSession) -> Staged[None]:
    record = op.session

    def replace(conn: sqlite3.Connection) -> None:
        require_run(conn, record.run_id)
        # the attempt starts over: what a resumed run recorded of it, and of the attempts after
        # it, is no longer this instance's (the record holds its attempts as they ran last)
        conn.execute(
            "DELETE FROM step_sessions WHERE run_id = ? AND key = ? AND attempt >= ?",
            (record.run_id, record.key, record.attempt),
        )
        conn.execute(
            "INSERT INTO step_sessions (run_id, key, attempt, agent, source, session_id) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                record.run_id,
                record.key,
                record.attempt,
                record.agent,
                record.source,
                record.session_id,
            ),
        )

    return _ready(replace)


def _stage_add_records(
    table: str, run_id: str, key: str, records: Sequence[Mapping[str, Any]]
) -> Staged[None]:
    encoded = [dumps(dict(r), f"{table} record") for r in records]

    def insert(conn: sqlite3.Connection) -> None:
        require_run(conn, run_id)
        conn.executemany(
            f"INSERT INTO {table} (run_id, key, record) VALUES (?, ?, ?)",
            ((run_id, key, text) for text in encoded),
        )

    return _ready(insert)


def _stage_add_event(op: AddEvent) -> Staged[None]:
    run_id = op.run_id
    text = dumps(dict(op.event), "event")

    def insert(conn: sqlite3.Connection) -> None:
        require_run(conn, run_id)
        conn.execute("INSERT INTO events (run_id, record) VALUES (?, ?)", (run_id, text))

    return _ready(insert)


def stage_update_run(op: UpdateRun) -> Staged[RunRecord]:
    """Change fields of a run; the write returns the run as changed."""
    run_id, fields = op.run_id, dict(op.fields)

    def update(conn: sqlite3.Connection) -> RunRecord:
        row = conn.execute(f"SELECT {RUN_COLUMNS} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            raise RunNotFound(f"no run {run_id!r} in the run store")
        run = attrs.evolve(run_from_row(row), **fields)
        values = run_values(run)
        columns = [c.strip() for c in RUN_COLUMNS.split(",")][1:]
        conn.execute(
            f"UPDATE runs SET {', '.join(f'{c} = ?' for c in columns)} WHERE run_id = ?",
            (*values[1:], run_id),
        )
        return run

    return lambda: update


def stage_add_transcript(
    run_id: str, source: str, lines: Sequence[bytes | Mapping[str, Any]]
) -> Staged[None]:
    """Append wire-transcript lines; they are encoded in the thread."""

    def encode() -> Apply[None]:
        encoded = encode_transcript_lines(lines)

        def append(conn: sqlite3.Connection) -> None:
            require_run(conn, run_id)
            conn.executemany(
                "INSERT INTO transcripts (run_id, source, line) VALUES (?, ?, ?)",
                ((run_id, source, line) for line in encoded),
            )

        return append

    return encode


def stage(op: StoreOp) -> Staged[object]:
    """The write that ``op`` stands for, checked and encoded now."""
    if isinstance(op, PutStep):
        return _stage_put_step(op)
    if isinstance(op, PutChanges):
        return _stage_put_changes(op)
    if isinstance(op, PutSession):
        return _stage_put_session(op)
    if isinstance(op, AddPermissions):
        return _stage_add_records("permissions", op.run_id, op.key, op.records)
    if isinstance(op, AddConflicts):
        return _stage_add_records("conflicts", op.run_id, op.key, op.conflicts)
    if isinstance(op, AddEvent):
        return _stage_add_event(op)
    if isinstance(op, UpdateRun):
        return stage_update_run(op)
    raise TypeError(f"not a run store op: {type(op).__name__}")


def stage_batch(ops: Sequence[StoreOp]) -> Staged[None]:
    """All of ``ops`` as one write, applied in order; every op is checked before any runs."""
    stages = [stage(op) for op in ops]

    def prepare() -> Apply[None]:
        applies = [s() for s in stages]

        def apply_all(conn: sqlite3.Connection) -> None:
            for apply in applies:
                apply(conn)

        return apply_all

    return prepare


def stored_changes(
    conn: sqlite3.Connection, table: Literal["changes", "own_changes"], run_id: str, key: str
) -> list[StoredChange]:
    """The rows of ``table`` for step ``key``, in order, with their contents. Blocking."""
    require_run(conn, run_id)
    base = "c.base_digest"
    # a large content is read through its own handle, without SQLite's copy of it
    rows = conn.execute(
        f"SELECT c.path, c.kind, b.rowid, CASE WHEN b.size <= ? THEN b.data END, c.mode, {base} "
        f"FROM {table} AS c LEFT JOIN blobs AS b ON b.digest = c.blob "
        "WHERE c.run_id = ? AND c.key = ? ORDER BY c.seq",
        (BLOB_PIECE, run_id, key),
    ).fetchall()
    return [
        StoredChange(
            name_from_column(path),
            kind,
            data if data is not None or rowid is None else read_blob(conn, rowid),
            mode,
            base_digest,
        )
        for path, kind, rowid, data, mode, base_digest in rows
    ]
