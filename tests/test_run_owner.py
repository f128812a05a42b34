"""Whether a run's process is alive, from the record its lock file keeps (runs/_lock.py).

A reader never takes the lock to find out: it reads who holds it (pid, start time, boot id,
pid namespace) and checks that process, or says it cannot tell.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
import trio.testing

from orchestrator.agent.reaper import process_started
from orchestrator.errors import RunBusy
from orchestrator.runs._lock import LOCK_NAME, RunOwner, hold_run_lock, run_owner, wait_run_lock


def record(run_dir: Path) -> dict[str, Any]:
    """The owner record in ``run_dir``'s lock file."""
    value = orjson.loads((run_dir / LOCK_NAME).read_bytes())
    assert isinstance(value, dict)
    return value


def rewrite(run_dir: Path, **fields: Any) -> None:
    """Change fields of the owner record, as another process or machine would have written."""
    (run_dir / LOCK_NAME).write_bytes(orjson.dumps({**record(run_dir), **fields}))


def test_the_holder_reads_alive_and_a_second_holder_is_refused(tmp_path: Path) -> None:
    """While the lock is held its record names this process, alive; another taker is refused."""
    with hold_run_lock(tmp_path, "r1", doing="resume"):
        assert run_owner(tmp_path) == RunOwner("alive", os.getpid(), record(tmp_path)["host"])
        with pytest.raises(RunBusy), hold_run_lock(tmp_path, "r1", doing="apply"):
            pass


def test_an_exited_owner_reads_gone(tmp_path: Path) -> None:
    """The record of a process that exited reads gone (alive until then)."""
    with hold_run_lock(tmp_path, "r1", doing="resume"):
        pass
    # a process that waits for its stdin to end
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        rewrite(tmp_path, pid=child.pid, started=process_started(child.pid))
        assert run_owner(tmp_path).state == "alive"
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()
    assert run_owner(tmp_path).state == "gone"
    assert run_owner(tmp_path).reason == "its process is gone"


def test_a_reused_pid_is_not_taken_for_the_owner(tmp_path: Path) -> None:
    """A live pid that started at another time than recorded is another process: gone."""
    with hold_run_lock(tmp_path, "r1", doing="resume"):
        pass
    started = process_started(os.getpid())
    assert started is not None
    rewrite(tmp_path, started=started - 1)
    assert run_owner(tmp_path).state == "gone"


@pytest.mark.parametrize(
    "fields",
    [
        {"boot": "another-boot-or-machine"},
        {"pidNamespace": "pid:[1]"},
        {"boot": None},
        {"started": None},
    ],
)
def test_an_owner_this_process_cannot_check_is_unknown(
    tmp_path: Path, fields: dict[str, Any]
) -> None:
    """Another boot, machine or pid namespace (or a partial record): unknown, never gone."""
    with hold_run_lock(tmp_path, "r1", doing="resume"):
        pass
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], check=True,
                           capture_output=True)  # fmt: skip
    rewrite(tmp_path, pid=int(child.stdout), host="elsewhere", **fields)
    owner = run_owner(tmp_path)
    assert owner.state == "unknown"
    assert owner.reason is not None and "elsewhere" in owner.reason


def test_a_lock_without_a_record_is_unknown(tmp_path: Path) -> None:
    """A lock file an older release left empty, or none at all: unknown."""
    assert run_owner(tmp_path).state == "unknown"
    (tmp_path / LOCK_NAME).write_bytes(b"")
    assert run_owner(tmp_path).state == "unknown"


async def test_waiting_for_a_lock_held_a_moment_takes_it(tmp_path: Path) -> None:
    """A lock another holder lets go of while one waits is taken (a run moving leftovers)."""
    run_dir = tmp_path / "runs" / "r1"
    order: list[str] = []
    held = trio.Event()

    async def brief() -> None:
        with hold_run_lock(run_dir, "r1", doing="prune"):
            held.set()
            await trio.sleep(0.1)
            order.append("released")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(brief)
        await held.wait()
        async with wait_run_lock(run_dir, "r1", doing="apply"):
            order.append("taken")
    assert order == ["released", "taken"]
    with hold_run_lock(run_dir, "r1", doing="apply"):  # and let go of again
        pass


async def test_waiting_for_a_lock_held_too_long_is_refused(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A lock still held once the patience is spent: RunBusy, as without waiting."""
    run_dir = tmp_path / "runs" / "r1"
    with hold_run_lock(run_dir, "r1", doing="resume"), pytest.raises(RunBusy, match="cannot"):
        async with wait_run_lock(run_dir, "r1", doing="apply", patience=5):
            pytest.fail("the lock is held")  # pragma: no cover
