"""Write-behind for the run store: the runner queues its records, one task writes them in batches.

A step makes a dozen small writes (its records, events, changes, audit records); each one as its
own thread hop and transaction would cost more than the scheduling itself. The runner queues
them without waiting; a writer task sends whatever has queued up as one ``write_many`` (one
thread hop, one transaction), in order. A step record that replaces one still queued (a step
going from pending to running to finished within one batch) takes the queued one's place
instead of being written twice: the store keeps only the last record of a step anyway, listed
where it was first recorded. Leaving :func:`open_store_writer` (also on cancellation or Ctrl-C)
writes what is still queued, so nothing recorded is lost.

A batch the store refuses (a content it cannot hold, a full disk) ends the block with a
:class:`~orchestrator.errors.StoreError` saying what it held: work that could not be recorded
must not count as done (the run fails and applies nothing).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from attrs import define, field

from .._util import single_error
from ..errors import StoreError
from ..store import PutChanges, PutStep, RunStore, StoreOp

__all__ = ["StoreWriter", "open_store_writer"]


@define(eq=False)
class StoreWriter:
    """Queues run-store writes; a background task writes them in order, in batches."""

    store: RunStore
    _pending: list[StoreOp] = field(factory=list)
    #: (run id, step key) -> where that step's record is in ``_pending``
    _queued_steps: dict[tuple[str, str], int] = field(factory=dict)
    _wake: trio.Event = field(factory=trio.Event)
    _writing: int = 0
    _idle: trio.Event = field(factory=trio.Event)
    #: how long queued records may wait to be written with the next ones
    interval: float = 0.005
    batches: int = 0
    ops: int = 0
    #: step records that replaced a queued one (never written on their own)
    coalesced: int = 0

    def put(self, op: StoreOp) -> None:
        """Queue ``op`` (never waits)."""
        if isinstance(op, PutStep):
            key = (op.step.run_id, op.step.key)
            index = self._queued_steps.get(key)
            if index is not None:
                # an upsert of the whole record: the last one queued is all that counts
                self._pending[index] = op
                self.coalesced += 1
                return
            self._queued_steps[key] = len(self._pending)
        self._pending.append(op)
        self._wake.set()

    async def flush(self) -> None:
        """Wait until everything queued so far is written."""
        while self._pending or self._writing:
            if self._idle.is_set():  # a stale one, from an earlier flush: waiters share a fresh one
                self._idle = trio.Event()
            idle = self._idle
            self._wake.set()
            await idle.wait()

    async def _write_pending(self) -> None:
        batch, self._pending = self._pending, []
        self._queued_steps = {}
        if not batch:
            return
        self._writing += 1
        try:
            # a batch in flight always completes: half a step's records would mislead resume
            with trio.CancelScope(shield=True):
                await self.store.write_many(batch)
        except StoreError as e:
            steps = sorted({op.key for op in batch if isinstance(op, PutChanges)})
            what = f"the changes of {', '.join(steps)}" if steps else "the run's progress"
            raise StoreError(f"recording {what} failed: {e}") from e
        finally:
            self._writing -= 1
        self.batches += 1
        self.ops += len(batch)

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Write batches as they queue up (run it in a nursery)."""
        task_status.started()
        while True:
            await self._wake.wait()
            # let a few milliseconds of records gather: one transaction for all of them
            await trio.sleep(self.interval)
            self._wake = trio.Event()
            await self._write_pending()
            if not self._pending:
                self._idle.set()

    def statistics(self) -> dict[str, int]:
        """Batches and ops written, step records coalesced, and ops still queued."""
        return {
            "batches": self.batches,
            "ops": self.ops,
            "coalesced": self.coalesced,
            "queued": len(self._pending),
        }


@asynccontextmanager
async def open_store_writer(store: RunStore) -> AsyncIterator[StoreWriter]:
    """A writer for ``store`` for the block; what is queued at the end is written then."""
    writer = StoreWriter(store)
    try:
        # a refused batch comes out as its StoreError, not inside an exception group
        with single_error():
            async with trio.open_nursery() as nursery:
                await nursery.start(writer.serve)
                try:
                    yield writer
                finally:
                    nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            await writer._write_pending()
