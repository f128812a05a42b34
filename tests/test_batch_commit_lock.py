"""A batch's commit waits a moment for its finished run's lock, and a transcript file's buffer
lives only while the file is open (both found by benchmarks/bench_batch.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from orchestrator.agent.transcript import TranscriptFile
from orchestrator.errors import RunBusy
from orchestrator.runs._lock import hold_run_lock

batch_module = sys.modules["orchestrator.runs.batch"]


async def test_commit_lock_taken_once_a_momentary_holder_lets_go(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """Held elsewhere when the commit asks (a sweep looking at the run), the lock is taken
    as soon as it is released, not refused."""
    run_dir = tmp_path / "runs" / "r1"
    taken: list[float] = []

    async def commit() -> None:
        async with batch_module._run_lock(run_dir, "r1"):
            taken.append(trio.current_time())

    holder = hold_run_lock(run_dir, "r1", doing="look")
    holder.__enter__()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(commit)
        await trio.sleep(0.1)  # the commit is polling meanwhile (virtual time)
        assert taken == []
        holder.__exit__(None, None, None)
    assert len(taken) == 1
    assert taken[0] < batch_module.RUN_LOCK_WAIT


async def test_commit_lock_refused_when_held_past_the_wait(
    tmp_path: Path, autojump_clock: trio.abc.Clock
) -> None:
    """A lock someone keeps (an apply or resume elsewhere) is refused after RUN_LOCK_WAIT."""
    run_dir = tmp_path / "runs" / "r2"
    with hold_run_lock(run_dir, "r2", doing="apply"):
        began = trio.current_time()
        with pytest.raises(RunBusy, match="cannot apply it now"):
            async with batch_module._run_lock(run_dir, "r2"):
                pass  # pragma: no cover
        assert trio.current_time() - began >= batch_module.RUN_LOCK_WAIT
    # released: taken at once
    async with batch_module._run_lock(run_dir, "r2"):
        pass


def test_transcript_buffer_allocated_at_first_line_and_let_go_at_close(tmp_path: Path) -> None:
    """No buffer before a line, one while lines come, none after close; what was written
    is in the file."""
    path = tmp_path / "t.ndjson"
    out = TranscriptFile(path, max_buffer=4096)
    assert len(out._buffer) == 0
    out.write(b'{"a":1}\n')
    assert len(out._buffer) == 4096
    out.close()
    assert len(out._buffer) == 0
    assert path.read_bytes() == b'{"a":1}\n'
