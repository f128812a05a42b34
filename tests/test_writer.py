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
                assert stats["ops"] == 101 and stats["coalesced"] == 1 and stats["queued"] == 0
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
            assert writer.statistics() == {"batches": 0, "ops": 0, "coalesced": 0, "queued": 0}


async def test_a_step_recorded_twice_in_one_batch_is_written_once_where_it_was_first(
    tmp_path: Path,
) -> None:
    """A queued step record is replaced by a later one of the same step, keeping its place."""
    with trio.fail_after(20):
        async with open_run_store(tmp_path) as store:
            await store.create_run(run_record("r3"))
            async with open_store_writer(store) as writer:
                writer.put(PutStep(StepRecord(run_id="r3", key="a", step="a", status="pending")))
                writer.put(PutStep(StepRecord(run_id="r3", key="b", step="b", status="pending")))
                writer.put(AddEvent("r3", {"type": "step_started", "step": "a"}))
                writer.put(PutStep(StepRecord(run_id="r3", key="a", step="a", status="running")))
                await writer.flush()
                stats = writer.statistics()
            steps = await store.steps("r3")
            events = await store.events("r3")
    assert stats["coalesced"] == 1 and stats["ops"] == 3
    assert [(s.key, s.status) for s in steps] == [("a", "running"), ("b", "pending")]
    assert [e["type"] for e in events] == ["step_started"]


async def test_records_of_a_step_in_different_batches_are_all_written(tmp_path: Path) -> None:
    """Once a step's record is written, a later record of it is a write of its own."""
    with trio.fail_after(20):
        async with open_run_store(tmp_path) as store:
            await store.create_run(run_record("r4"))
            async with open_store_writer(store) as writer:
                writer.put(PutStep(StepRecord(run_id="r4", key="a", step="a", status="running")))
                await writer.flush()
                writer.put(PutStep(StepRecord(run_id="r4", key="a", step="a", status="failed")))
                await writer.flush()
                stats = writer.statistics()
            [step] = await store.steps("r4")
    assert stats["coalesced"] == 0 and stats["ops"] == 2 and stats["batches"] == 2
    assert step.status == "failed"


async def test_concurrent_flushes_all_return_once_written(tmp_path: Path) -> None:
    """Several tasks flushing at once all wake when the queue is written."""
    with trio.fail_after(20):
        async with open_run_store(tmp_path) as store:
            await store.create_run(run_record("r5"))
            async with open_store_writer(store) as writer:
                flushed: list[int] = []

                async def flusher(n: int) -> None:
                    await writer.flush()
                    flushed.append(n)

                async with trio.open_nursery() as nursery:
                    for n in range(3):
                        writer.put(AddEvent("r5", {"type": "update", "n": n}))
                        nursery.start_soon(flusher, n)
                        await trio.lowlevel.checkpoint()
                assert sorted(flushed) == [0, 1, 2]
                assert writer.statistics()["queued"] == 0
            assert [e["n"] for e in await store.events("r5")] == [0, 1, 2]
