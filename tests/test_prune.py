"""Pruning the state directory (runs/prune.py): which runs go, what stays, and a crash midway."""

from __future__ import annotations

import datetime
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pytest
import trio

from orchestrator.errors import RunNotFound, UsageError
from orchestrator.runs import get_run_json, list_runs, prune
from orchestrator.runs._lock import LOCK_NAME, hold_run_lock
from orchestrator.runs.prune import PRUNED, store_usage
from orchestrator.store import RunRecord, StoredChange, open_run_store

DAY = 86400.0
PAGE = 4096  # SQLite's default page size
SHARED = b"shared content\n" * 4000  # ~60 KB: whole pages of its own in the database


async def record(
    state: Path, run_id: str, *, age_days: float, files: dict[str, bytes], status: str = "succeeded"
) -> None:
    """A run started ``age_days`` ago whose one step wrote ``files``, with a run directory."""
    async with open_run_store(state) as store:
        created = time.time() - age_days * DAY
        await store.create_run(RunRecord(run_id, "pipeline", status, created, "/ws"))
        changes = [StoredChange(path, "write", data) for path, data in files.items()]
        await store.put_changes(run_id, "edit", changes, diff=f"diff of {run_id}\n")
        await store.add_transcript(run_id, "demo#1", [{"jsonrpc": "2.0", "method": "x"}])
    with hold_run_lock(state / "runs" / run_id, run_id, doing="run"):
        pass
    trash = state / "runs" / run_id / "trash" / "left"
    trash.mkdir(parents=True)
    (trash / "copy.txt").write_bytes(b"x" * 1000)


def blob_count(state: Path) -> int:
    """How many content blobs the store holds."""
    with sqlite3.connect(state / "runs.sqlite3") as conn:
        return int(conn.execute("SELECT count(*) FROM blobs").fetchone()[0])


def tree(state: Path) -> dict[str, bytes]:
    """Every file of the state directory with its bytes (the database by its rows)."""
    out = {
        p.relative_to(state).as_posix(): p.read_bytes()
        for p in sorted(state.rglob("*"))
        if p.is_file() and not p.name.startswith("runs.sqlite3")
    }
    with sqlite3.connect(state / "runs.sqlite3") as conn:
        for table in ("runs", "steps", "change_sets", "changes", "blobs", "transcripts"):
            rows = conn.execute(f"SELECT * FROM {table} ORDER BY 1").fetchall()
            out[f"table {table}"] = orjson.dumps([list(map(repr, r)) for r in rows])
    return out


async def ids(state: Path) -> list[str]:
    """The recorded runs, newest first."""
    return [r.run_id for r in await list_runs(state_dir=state, limit=None)]


async def test_older_than_and_keep_choose_the_runs(state_dir: Path) -> None:
    """An age, a date and keep-the-newest choose the runs beyond them; others stay."""
    for i, run_id in enumerate(["aaaaaaaaaaa1", "aaaaaaaaaaa2", "aaaaaaaaaaa3", "aaaaaaaaaaa4"]):
        await record(state_dir, run_id, age_days=10 - 2 * i, files={"f": run_id.encode()})
    # ages 10, 8, 6, 4 days
    done = await prune(older_than=datetime.timedelta(days=9), state_dir=state_dir)
    assert [r.run_id for r in done.deleted] == ["aaaaaaaaaaa1"]
    assert not (state_dir / "runs" / "aaaaaaaaaaa1").exists()
    cutoff = datetime.datetime.fromtimestamp(time.time() - 7 * DAY)
    done = await prune(older_than=cutoff, state_dir=state_dir)
    assert [r.run_id for r in done.deleted] == ["aaaaaaaaaaa2"]
    done = await prune(keep=1, state_dir=state_dir)
    assert [r.run_id for r in done.deleted] == ["aaaaaaaaaaa3"]
    assert await ids(state_dir) == ["aaaaaaaaaaa4"]
    assert sorted(os.listdir(state_dir / "runs")) == ["aaaaaaaaaaa4"]


async def test_bad_selectors_are_usage_errors_and_delete_nothing(state_dir: Path) -> None:
    """No selector, ids with a filter, or an unknown id: a usage error, nothing deleted."""
    await record(state_dir, "bbbbbbbbbbb1", age_days=3, files={"f": b"1"})
    before = tree(state_dir)
    with pytest.raises(UsageError, match="nothing was chosen"):
        await prune(state_dir=state_dir)
    with pytest.raises(UsageError, match="not both"):
        await prune(["bbbb"], keep=0, state_dir=state_dir)
    with pytest.raises(RunNotFound):
        await prune(["bbbb", "ffff"], state_dir=state_dir)
    assert tree(state_dir) == before


async def test_shared_blobs_stay_with_the_kept_run_and_the_others_go(state_dir: Path) -> None:
    """A blob the kept run uses survives (its change set reads whole); the pruned run's own go."""
    await record(state_dir, "ccccccccccc1", age_days=5, files={"a": SHARED, "b": b"own of 1\n"})
    await record(state_dir, "ccccccccccc2", age_days=1, files={"a": SHARED, "c": b"own of 2\n"})
    assert blob_count(state_dir) == 3
    done = await prune(["ccccccccccc1"], state_dir=state_dir)
    assert [r.run_id for r in done.deleted] == ["ccccccccccc1"]
    assert blob_count(state_dir) == 2
    async with open_run_store(state_dir) as store:
        kept = {c.path: c.data for c in await store.changes("ccccccccccc2", "edit")}
        assert kept == {"a": SHARED, "c": b"own of 2\n"}
        assert await store.diff("ccccccccccc2", "edit") == "diff of ccccccccccc2\n"
        with pytest.raises(RunNotFound):
            await store.get_run("ccccccccccc1")
    # the last user of the shared content gone, it goes too
    done = await prune(["ccccccccccc2"], state_dir=state_dir)
    assert blob_count(state_dir) == 0
    assert done.database_bytes >= len(SHARED) - PAGE  # its pages, the last one shared


async def test_dry_run_deletes_nothing_and_says_what_the_real_one_frees(state_dir: Path) -> None:
    """A dry run leaves every row and file; the real prune then frees what it announced."""
    await record(state_dir, "ddddddddddd1", age_days=5, files={"a": SHARED})
    await record(state_dir, "ddddddddddd2", age_days=1, files={"b": b"kept\n"})
    before = tree(state_dir)
    dry = await prune(keep=1, dry_run=True, state_dir=state_dir)
    assert tree(state_dir) == before
    assert [r.run_id for r in dry.deleted] == ["ddddddddddd1"] and dry.dry_run
    assert dry.file_bytes >= 1000 and dry.database_bytes >= len(SHARED) - PAGE
    real = await prune(keep=1, state_dir=state_dir)
    assert (real.deleted, real.database_bytes, real.file_bytes) == (
        dry.deleted,
        dry.database_bytes,
        dry.file_bytes,
    )
    assert await ids(state_dir) == ["ddddddddddd2"]


HOLD = """
import sys
from pathlib import Path
from orchestrator.runs._lock import hold_run_lock
with hold_run_lock(Path(sys.argv[1]), "r", doing="resume"):
    print("held", flush=True)
    sys.stdin.read()
"""


async def test_a_run_whose_lock_is_held_elsewhere_is_never_pruned(state_dir: Path) -> None:
    """A run locked by another process (running, resumed, applied) is kept, with the reason;
    so is one recorded running whose process cannot be checked from here."""
    await record(state_dir, "eeeeeeeeeee1", age_days=5, files={"a": b"1"})
    await record(state_dir, "eeeeeeeeeee2", age_days=4, files={"a": b"2"}, status="running")
    await record(state_dir, "eeeeeeeeeee3", age_days=3, files={"a": b"3"})
    # run 2's owner is on another machine: it may be running there
    lock = state_dir / "runs" / "eeeeeeeeeee2" / LOCK_NAME
    lock.write_bytes(orjson.dumps({**orjson.loads(lock.read_bytes()), "boot": "elsewhere"}))
    holder = await trio.lowlevel.open_process(
        [sys.executable, "-c", HOLD, str(state_dir / "runs" / "eeeeeeeeeee1")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        said = b""
        while not said.endswith(b"\n"):
            said += await holder.stdout.receive_some()
        assert said == b"held\n"
        for dry_run in (True, False):
            done = await prune(keep=0, dry_run=dry_run, state_dir=state_dir)
            assert [r.run_id for r in done.deleted] == ["eeeeeeeeeee3"]
            reasons = {s.run_id: s.reason for s in done.skipped}
            assert reasons["eeeeeeeeeee1"] == "it is running, resumed or applied"
            assert "cannot be checked from here" in reasons["eeeeeeeeeee2"]
        assert await ids(state_dir) == ["eeeeeeeeeee2", "eeeeeeeeeee1"]
        assert (state_dir / "runs" / "eeeeeeeeeee1" / "trash" / "left" / "copy.txt").is_file()
    finally:
        await holder.stdin.aclose()  # the holder exits at the end of its stdin
        await holder.wait()
        await holder.stdout.aclose()
    # once its process let go, it can go
    done = await prune(["eeeeeeeeeee1"], state_dir=state_dir)
    assert [r.run_id for r in done.deleted] == ["eeeeeeeeeee1"]


async def test_a_directory_without_a_run_is_removed_only_once_its_process_is_gone(
    state_dir: Path,
) -> None:
    """A run directory with no record is removed when its owner is gone, kept while a process
    holds it or before it says who holds it (a run starting)."""
    await record(state_dir, "fffffffffff1", age_days=1, files={"a": b"1"})
    runs = state_dir / "runs"
    with hold_run_lock(runs / "0rphan000001", "0rphan000001", doing="run"):
        pass  # its process is this one's... recorded as gone below
    lock = runs / "0rphan000001" / LOCK_NAME
    lock.write_bytes(orjson.dumps({**orjson.loads(lock.read_bytes()), "pid": 2**22 + 1}))
    (runs / "starting0001").mkdir()
    (runs / "starting0001" / LOCK_NAME).write_bytes(b"")  # a run between its mkdir and its lock
    with hold_run_lock(runs / "starting0002", "starting0002", doing="run"):
        done = await prune(keep=1, state_dir=state_dir)
        assert (done.deleted, done.leftovers) == ((), 1)
        assert sorted(os.listdir(runs)) == ["fffffffffff1", "starting0001", "starting0002"]


KILL_AT = """
import importlib, os, signal, sys, trio
pruning = importlib.import_module("orchestrator.runs.prune")

def die(*args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)

# _files: the records deleted, no directory touched yet; remove_tree: the first directory
# renamed into pruned/, not yet deleted
setattr(pruning, sys.argv[2], die)
trio.run(lambda: pruning.prune(keep=1, state_dir=sys.argv[1]))
"""


@pytest.mark.parametrize("point", ["_files", "remove_tree"])
async def test_a_prune_killed_midway_leaves_a_store_the_next_prune_finishes(
    state_dir: Path, point: str
) -> None:
    """SIGKILL after the records are deleted (before or while the directories are): the store
    opens and reads, the kept run is whole, and the next prune removes what was left."""
    await record(state_dir, "99999999999a", age_days=5, files={"a": SHARED, "b": b"1"})
    await record(state_dir, "99999999999b", age_days=4, files={"b": b"2"})
    await record(state_dir, "99999999999c", age_days=1, files={"a": SHARED})
    killed = await trio.run_process(
        [sys.executable, "-c", KILL_AT, str(state_dir), point], check=False
    )
    assert killed.returncode == -signal.SIGKILL
    # the records went in one transaction; the directories are left
    assert await ids(state_dir) == ["99999999999c"]
    pruned = state_dir / PRUNED
    moved = {name.split(".")[0] for name in os.listdir(pruned)} if pruned.exists() else set()
    assert set(os.listdir(state_dir / "runs")) | moved == {
        "99999999999a",
        "99999999999b",
        "99999999999c",
    }
    assert len(moved) == (1 if point == "remove_tree" else 0)
    shown = await get_run_json("99999999999c", state_dir=state_dir)
    assert shown["runId"] == "99999999999c"
    async with open_run_store(state_dir) as store:
        assert [c.data for c in await store.changes("99999999999c", "edit")] == [SHARED]
    assert blob_count(state_dir) == 1
    done = await prune(keep=1, state_dir=state_dir)
    assert (done.deleted, done.leftovers) == ((), 2 - len(moved))
    assert done.file_bytes >= 2000  # the two runs' trash, wherever it was left
    assert os.listdir(state_dir / "runs") == ["99999999999c"]
    assert os.listdir(state_dir / PRUNED) == []
    usage = await store_usage(state_dir=state_dir)
    assert usage.file_bytes == sum(
        p.stat().st_size for p in (state_dir / "runs").rglob("*") if p.is_file()
    )


async def record_batch(state: Path, batch_id: str, children: list[str], *, age_days: float) -> None:
    """A finished batch run started ``age_days`` ago, with a run directory, and its child runs
    (each as :func:`record` makes one, started after it)."""
    async with open_run_store(state) as store:
        created = time.time() - age_days * DAY
        await store.create_run(RunRecord(batch_id, "batch", "failed", created, "/batch"))
    with hold_run_lock(state / "runs" / batch_id, batch_id, doing="batch"):
        pass
    for i, child in enumerate(children):
        await record(state, child, age_days=age_days - (i + 1) / DAY, files={"f": child.encode()})
        async with open_run_store(state) as store:
            await store.set_parent(child, batch_id)


async def test_a_batch_goes_with_all_its_runs_or_stays_with_them(state_dir: Path) -> None:
    """keep counts runs of their own; a batch whose one run is held elsewhere (applied, say)
    stays whole, saying which; once let go, the batch and its runs go, with their blobs."""
    await record_batch(state_dir, "b0000000000a", ["c0000000000a", "c0000000000b"], age_days=5)
    await record(state_dir, "a0000000000a", age_days=4, files={"g": SHARED})
    await record(state_dir, "a0000000000b", age_days=1, files={"h": SHARED})
    assert blob_count(state_dir) == 3
    # the newest two of their own: the batch is the third, whatever its runs' times
    done = await prune(keep=2, dry_run=True, state_dir=state_dir)
    assert [(r.run_id, r.parent) for r in done.deleted] == [
        ("b0000000000a", None),
        ("c0000000000a", "b0000000000a"),
        ("c0000000000b", "b0000000000a"),
    ]
    holder = await trio.lowlevel.open_process(
        [sys.executable, "-c", HOLD, str(state_dir / "runs" / "c0000000000b")],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        said = b""
        while not said.endswith(b"\n"):
            said += await holder.stdout.receive_some()
        for dry_run in (True, False):
            done = await prune(keep=1, dry_run=dry_run, state_dir=state_dir)
            assert [r.run_id for r in done.deleted] == ["a0000000000a"]
            [kept] = done.skipped
            assert (kept.run_id, kept.reason) == (
                "b0000000000a",
                "its run c0000000000b: it is running, resumed or applied",
            )
        # the batch's own lock was let go again: a resume of it may start
        with hold_run_lock(state_dir / "runs" / "b0000000000a", "b0000000000a", doing="resume"):
            pass
    finally:
        await holder.stdin.aclose()
        await holder.wait()
        await holder.stdout.aclose()
    assert await ids(state_dir) == ["a0000000000b", "c0000000000b", "c0000000000a", "b0000000000a"]
    with pytest.raises(UsageError, match="belongs to batch run b0000000000a"):
        await prune(["c0000000000a"], state_dir=state_dir)
    # the batch and one of its runs named: the run goes with its batch
    done = await prune(["c0000000000a", "b0000"], state_dir=state_dir)
    assert [r.run_id for r in done.deleted] == ["b0000000000a", "c0000000000a", "c0000000000b"]
    assert await ids(state_dir) == ["a0000000000b"]
    assert sorted(os.listdir(state_dir / "runs")) == ["a0000000000b"]
    assert blob_count(state_dir) == 1  # SHARED, the kept run's


async def test_a_prune_killed_midway_takes_a_batch_whole(state_dir: Path) -> None:
    """SIGKILL after the records are deleted: the batch and its runs went in the one
    transaction (none of its runs is left without it); the next prune removes their files."""
    await record_batch(state_dir, "b0000000000b", ["c0000000000c", "c0000000000d"], age_days=5)
    await record(state_dir, "a0000000000c", age_days=1, files={"a": SHARED})
    killed = await trio.run_process(
        [sys.executable, "-c", KILL_AT, str(state_dir), "_files"], check=False
    )
    assert killed.returncode == -signal.SIGKILL
    assert await ids(state_dir) == ["a0000000000c"]
    assert blob_count(state_dir) == 1
    done = await prune(keep=1, state_dir=state_dir)
    assert (done.deleted, done.leftovers) == ((), 3)
    assert os.listdir(state_dir / "runs") == ["a0000000000c"]
