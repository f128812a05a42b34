"""The run store's plumbing: one SQLite connection driven from worker threads.

Calls are serialized by a :class:`trio.Lock` and each runs in a worker thread as one transaction,
so the event loop never blocks on the disk. Writes take the write lock up front
(``BEGIN IMMEDIATE``) so two processes never deadlock upgrading a read lock. A thread is never
abandoned on cancellation: a cancelled call finishes (or rolls back) its transaction before
``trio.Cancelled`` is raised, so a write is never half done.

A call is *staged*: a function run in the thread before the transaction opens (to hash or encode
without holding the write lock) returns the function that runs inside it.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeAlias, TypeVar

import trio
from attrs import define, field

from .._log import get_logger
from ..errors import StoreError
from . import _schema
from ._schema import SCHEMA_VERSION

__all__ = ["Apply", "Database", "Staged", "transaction"]

log = get_logger(__name__)

T = TypeVar("T")

#: what runs inside the transaction
Apply: TypeAlias = Callable[[sqlite3.Connection], T]
#: what runs in the worker thread before the transaction, returning what runs inside it
Staged: TypeAlias = Callable[[], Callable[[sqlite3.Connection], T]]


@contextlib.contextmanager
def transaction(conn: sqlite3.Connection, *, write: bool) -> Iterator[None]:
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


def _describe(path: Path, error: sqlite3.Error) -> str:
    text = str(error)
    if "locked" in text or "busy" in text:
        return (
            f"the run store {path} is busy: another process held its write lock for more "
            f"than {_schema.BUSY_TIMEOUT_MS / 1000:g} s ({text})"
        )
    return f"run store {path}: {text}"


@define(eq=False)
class Database:
    """The database connection of a run store, used one call at a time from worker threads.

    The base of :class:`~orchestrator.store.RunStore`, which adds the table operations.
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

    def _require_open(self) -> sqlite3.Connection:
        conn = self._conn
        if conn is None:
            raise StoreError(f"the run store {self.path} is closed")
        return conn

    def _run_blocking(self, stage: Staged[T], write: bool) -> T:
        conn = self._require_open()
        start = time.perf_counter()
        try:
            apply = stage()
            with transaction(conn, write=write):
                return apply(conn)
        except sqlite3.Error as e:
            raise StoreError(_describe(self.path, e)) from e
        finally:
            self._seconds += time.perf_counter() - start

    async def _call(self, stage: Staged[T], *, write: bool) -> T:
        async with self._lock:
            if write:
                self._writes += 1
            else:
                self._reads += 1
            # not abandoned on cancel: the transaction ends (commit or rollback) first
            return await trio.to_thread.run_sync(self._run_blocking, stage, write)

    async def _read(self, fn: Apply[T]) -> T:
        return await self._call(lambda: fn, write=False)

    async def _write(self, fn: Apply[T]) -> T:
        return await self._call(lambda: fn, write=True)

    async def _write_staged(self, stage: Staged[T]) -> T:
        """A write whose ``stage`` prepares data in the thread before the write lock is taken."""
        return await self._call(stage, write=True)
