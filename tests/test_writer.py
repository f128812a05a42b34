"""The run store's write-behind queue: batched, ordered, and nothing lost at the end."""

from __future__ import annotations

import time
from pathlib import Path

import trio

from orchestrator.pipeline._writer import open_store_writer
from orchestrator.store import AddEvent, PutStep, RunRecord, StepRecord, open_run_store


def run_record(run_id: str) -> RunRecord:
    return RunRecord(run_id=run_id, kind="pipeline", status="running", created=time.time(), cwd="/")


async def test_queued_writes_land_in_order_in_few_batches(tmp_path: Path) -> None:
    """Many queued records are written in a handful of transactions, in queue order."""
    with trio.fail_after(20):
        async with open_run_store(tmp_path) as store:
            await store.create_run(run_record("r1"))
            async with open_store_writer(store) as writer:
                for i in range(100):
                    writer.put(AddEvent("r1", {"type": "update", "n": i}))
                writer.put(PutStep(StepRecord(run_id="r1", key="a", step="a", status="running")))
                writer.put(PutStep(StepRecord(run_id="r1", key="a", step="a", status="succeeded")))
                await writer.flush()
                stats = writer.statistics()
                assert stats["ops"] == 102 and stats["queued"] == 0
                assert stats["batches"] <= 3
            events = await store.events("r1")
            [step] = await store.steps("r1")
    assert [e["n"] for e in events] == list(range(100))
    assert step.status == "succeeded"  # the later record of the same step wins


async def test_queue_is_written_when_the_block_is_cancelled(tmp_path: Path) -> None:
    """Records queued before a cancellation are still written when the block exits."""
    with trio.fail_after(20):
        async with open_run_store(tmp_path) as store:
            await store.create_run(run_record("r2"))
            with trio.CancelScope() as scope:
                async with open_store_writer(store) as writer:
                    writer.put(AddEvent("r2", {"type": "step_started"}))
                    scope.cancel()
                    await trio.sleep_forever()
            assert [e["type"] for e in await store.events("r2")] == ["step_started"]


async def test_flush_with_nothing_queued_returns_at_once(tmp_path: Path) -> None:
    """flush() on an empty queue does not wait for the batching interval."""
    with trio.fail_after(20):
        async with open_run_store(tmp_path) as store, open_store_writer(store) as writer:
            await writer.flush()
            assert writer.statistics() == {"batches": 0, "ops": 0, "queued": 0}
