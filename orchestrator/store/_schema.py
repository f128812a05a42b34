"""The run store's schema: an ordered list of migrations, and opening a database with them.

The schema version is SQLite's ``PRAGMA user_version``: 0 for a new (empty) file, N after the
first N migrations. Opening a database runs the missing migrations, all in one transaction, so a
crash or an error leaves it at its old version. A database whose version is higher than
:data:`SCHEMA_VERSION` was written by a newer orchestrator and is refused
(:class:`~orchestrator.errors.StoreVersionError`), never modified.

Rules for whoever adds a migration: append, never edit a shipped one (databases in the field
have already run it); keep it idempotent within its transaction; no ``executescript`` (it would
commit the open transaction halfway).
"""

from __future__ import annotations

import os
import sqlite3
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeAlias

from .._log import get_logger
from ..errors import StateDirectoryError, StoreError, StoreVersionError

__all__ = ["MIGRATIONS", "SCHEMA_VERSION", "connect", "schema_version"]

log = get_logger(__name__)

Migration: TypeAlias = Callable[[sqlite3.Connection], None]

#: how long a statement waits for another connection's write lock before failing, in ms
BUSY_TIMEOUT_MS = 5000


def _sql(*statements: str) -> Migration:
    """A migration that runs ``statements`` in order."""

    def run(conn: sqlite3.Connection) -> None:
        for statement in statements:
            conn.execute(statement)

    return run


# JSON columns hold orjson text; content blobs are keyed by their SHA-256 hex digest.
_V1 = _sql(
    """
    CREATE TABLE runs (
        run_id          TEXT PRIMARY KEY NOT NULL,
        kind            TEXT NOT NULL,
        status          TEXT NOT NULL,
        created         REAL NOT NULL,
        finished        REAL,
        cwd             TEXT NOT NULL,
        pipeline        TEXT,
        pipeline_digest TEXT,
        inputs          TEXT NOT NULL,
        options         TEXT NOT NULL,
        result          TEXT,
        error           TEXT,
        applied         REAL
    )
    """,
    "CREATE INDEX runs_created ON runs (created)",
    """
    CREATE TABLE steps (
        seq          INTEGER PRIMARY KEY,
        run_id       TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        key          TEXT NOT NULL,
        step         TEXT NOT NULL,
        instance     TEXT,
        agent        TEXT,
        status       TEXT NOT NULL,
        attempt      INTEGER NOT NULL,
        started      REAL,
        finished     REAL,
        session_id   TEXT,
        result       TEXT,
        value        TEXT,
        value_stored INTEGER NOT NULL,
        error        TEXT,
        cause        TEXT,
        usage        TEXT,
        UNIQUE (run_id, key)
    )
    """,
    """
    CREATE TABLE blobs (
        digest TEXT PRIMARY KEY NOT NULL,
        size   INTEGER NOT NULL,
        data   BLOB NOT NULL
    )
    """,
    """
    CREATE TABLE change_sets (
        run_id   TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        key      TEXT NOT NULL,
        diff     TEXT NOT NULL,
        own_diff TEXT NOT NULL,
        PRIMARY KEY (run_id, key)
    )
    """,
    """
    CREATE TABLE changes (
        run_id      TEXT NOT NULL,
        key         TEXT NOT NULL,
        seq         INTEGER NOT NULL,
        path        TEXT NOT NULL,
        kind        TEXT NOT NULL,
        blob        TEXT REFERENCES blobs (digest),
        mode        INTEGER,
        base_digest TEXT,
        PRIMARY KEY (run_id, key, path),
        FOREIGN KEY (run_id, key) REFERENCES change_sets (run_id, key) ON DELETE CASCADE
    )
    """,
    # finding whether a blob is still referenced, when a change set is replaced or deleted
    "CREATE INDEX changes_blob ON changes (blob)",
    # a transcript row holds ND-JSON: one line, or a chunk of whole lines (readers split it)
    """
    CREATE TABLE transcripts (
        id     INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        source TEXT NOT NULL,
        line   BLOB NOT NULL
    )
    """,
    "CREATE INDEX transcripts_run ON transcripts (run_id, source, id)",
    """
    CREATE TABLE permissions (
        id     INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        key    TEXT NOT NULL,
        record TEXT NOT NULL
    )
    """,
    "CREATE INDEX permissions_run ON permissions (run_id, key, id)",
    """
    CREATE TABLE conflicts (
        id     INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        key    TEXT NOT NULL,
        record TEXT NOT NULL
    )
    """,
    "CREATE INDEX conflicts_run ON conflicts (run_id, id)",
)

# v2: the run timeline, and listing by status without a scan.
_V2 = _sql(
    """
    CREATE TABLE events (
        id     INTEGER PRIMARY KEY,
        run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        record TEXT NOT NULL
    )
    """,
    "CREATE INDEX events_run ON events (run_id, id)",
    "CREATE INDEX runs_status_created ON runs (status, created)",
)

# v3: what was applied from each run, when, and where (the working tree or a new git branch).
# ``keys`` is the JSON list of the change sets applied; NULL for an apply made before v3, whose
# change sets were not recorded (``runs.applied`` held only its time).
_V3 = _sql(
    """
    CREATE TABLE applies (
        id         INTEGER PRIMARY KEY,
        run_id     TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        keys       TEXT,
        at         REAL NOT NULL,
        git_branch TEXT,
        git_commit TEXT
    )
    """,
    "CREATE INDEX applies_run ON applies (run_id, id)",
    "INSERT INTO applies (run_id, keys, at) SELECT run_id, NULL, applied FROM runs "
    "WHERE applied IS NOT NULL",
)

# v4: the traceback of a step that failed with a Python exception (NULL for older rows).
_V4 = _sql("ALTER TABLE steps ADD COLUMN traceback TEXT")

# v5: why a step failed, as a kind (``orchestrator.errors.ErrorKind``; NULL for older rows).
_V5 = _sql("ALTER TABLE steps ADD COLUMN error_kind TEXT")

# v6: the batch run a run belongs to (one child run per repository; NULL for other runs).
_V6 = _sql(
    "ALTER TABLE runs ADD COLUMN parent TEXT",
    "CREATE INDEX runs_parent ON runs (parent) WHERE parent IS NOT NULL",
)

# v7: what a replay needs. The pipeline file's text as loaded (NULL for a pipeline built in
# code, and for older runs); per attempt of a step instance, the agent session that served it
# (``steps`` keeps only the last attempt); and each instance's own change set (its changes
# against what it forked from, where ``changes`` holds them against the run's base). An own
# change is a ``write`` (data and mode) or a ``delete``; it goes with its change set.
_V7 = _sql(
    "ALTER TABLE runs ADD COLUMN pipeline_source TEXT",
    """
    CREATE TABLE step_sessions (
        id         INTEGER PRIMARY KEY,
        run_id     TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
        key        TEXT NOT NULL,
        attempt    INTEGER NOT NULL,
        agent      TEXT NOT NULL,
        source     TEXT NOT NULL,
        session_id TEXT NOT NULL,
        UNIQUE (run_id, key, attempt)
    )
    """,
    "CREATE INDEX step_sessions_run ON step_sessions (run_id, id)",
    """
    CREATE TABLE own_changes (
        run_id TEXT NOT NULL,
        key    TEXT NOT NULL,
        seq    INTEGER NOT NULL,
        path   TEXT NOT NULL,
        kind   TEXT NOT NULL,
        blob   TEXT REFERENCES blobs (digest),
        mode   INTEGER,
        PRIMARY KEY (run_id, key, path),
        FOREIGN KEY (run_id, key) REFERENCES change_sets (run_id, key) ON DELETE CASCADE
    )
    """,
    "CREATE INDEX own_changes_blob ON own_changes (blob)",
)

# v8: what each own change found where it changed (the SHA-256 of the file it forked from, NULL
# if there was none): a replay writes a recorded change only over what the recording found.
# Rows written before it do not say ("unknown").
_V8 = _sql(
    "ALTER TABLE own_changes ADD COLUMN base_digest TEXT",
    "UPDATE own_changes SET base_digest = 'unknown'",
)

#: the migrations, in order: ``MIGRATIONS[i]`` takes a database from version i to i + 1
MIGRATIONS: tuple[Migration, ...] = (_V1, _V2, _V3, _V4, _V5, _V6, _V7, _V8)
#: the version this code writes
SCHEMA_VERSION = len(MIGRATIONS)


def schema_version(conn: sqlite3.Connection) -> int:
    """The database's ``user_version``."""
    row = conn.execute("PRAGMA user_version").fetchone()
    return int(row[0])


def _refuse_newer(path: Path, version: int) -> None:
    if version > SCHEMA_VERSION:
        raise StoreVersionError(
            f"the run store {path} has schema version {version}, but this orchestrator knows "
            f"only up to version {SCHEMA_VERSION}: it was written by a newer release. Upgrade "
            f"acp-orchestrator, or use another state directory."
        )


def _migrate(conn: sqlite3.Connection, path: Path) -> int:
    """Bring the database to :data:`SCHEMA_VERSION`; return the version it had."""
    version = schema_version(conn)
    _refuse_newer(path, version)
    if version == SCHEMA_VERSION:
        # the common case takes no write lock, so opening never waits for a running run
        return version
    # IMMEDIATE takes the write lock first: two processes opening a new store at once
    # serialize here, and the second sees the first one's work when it re-reads the version
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = schema_version(conn)
        _refuse_newer(path, version)
        for migration in MIGRATIONS[version:]:
            migration(conn)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    finally:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
    if version == 0:
        log.debug("run store created", path=str(path), version=SCHEMA_VERSION)
    elif version != SCHEMA_VERSION:
        log.info("run store migrated", path=str(path), old=version, new=SCHEMA_VERSION)
    return version


def _enable_wal(conn: sqlite3.Connection) -> str:
    """Switch the database to WAL mode; return the journal mode it is in.

    Switching a new file needs an exclusive lock, and when two connections try at once SQLite
    answers "database is locked" to one of them at once, without waiting for the busy timeout:
    that one tries again, within the same timeout.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_MS / 1000
    delay = 0.002
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() + delay > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


def _check_usable(path: Path) -> None:
    """Refuse a store file that is there but cannot be the store: SQLite's own errors for it
    ("unable to open database file", "attempt to write a readonly database") do not say why."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    except OSError as e:
        raise StateDirectoryError(f"the run store {path} cannot be used: {e.strerror}") from e
    if stat.S_ISLNK(st.st_mode):
        # SQLite would follow it, creating or writing whatever it leads to, anywhere
        raise StateDirectoryError(f"the run store {path} is a symbolic link, not a file")
    if not stat.S_ISREG(st.st_mode):
        raise StateDirectoryError(f"the run store {path} is not a file")
    if not os.access(path, os.R_OK | os.W_OK):
        raise StateDirectoryError(f"the run store {path} is not writable")


def connect(path: Path, opened: list[sqlite3.Connection]) -> int:
    """Open (creating and migrating as needed) the database at ``path``; blocking.

    The connection is appended to ``opened`` as soon as it exists, so a caller whose thread
    call was cancelled can still close it. Returns the version the file had before.
    """
    _check_usable(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: transactions are explicit (BEGIN IMMEDIATE for writes)
        conn = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None, check_same_thread=False
        )
        opened.append(conn)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        # before anything writes to the file: a newer release's database is left untouched
        _refuse_newer(path, schema_version(conn))
        mode = _enable_wal(conn)
        if str(mode).lower() != "wal":
            raise StoreError(f"the run store {path} cannot use WAL mode (journal mode {mode})")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        return _migrate(conn, path)
    except sqlite3.Error as e:
        raise StoreError(f"cannot open the run store {path}: {e}") from e
