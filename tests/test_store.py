"""Tests for orchestrator.store: the SQLite run store, its schema migrations and concurrency."""

from __future__ import annotations

import functools
import hashlib
import sqlite3
import sys
import textwrap
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from orchestrator.errors import (
    RunNotFound,
    StoreError,
    StoreVersionError,
    UsageError,
)
from orchestrator.store import (
    SCHEMA_VERSION,
    STORE_FILENAME,
    AddConflicts,
    AddEvent,
    AddPermissions,
    ApplyRecord,
    PutChanges,
    PutSession,
    PutStep,
    RunRecord,
    RunStore,
    SessionRecord,
    StepRecord,
    StoredChange,
    StoreOp,
    UpdateRun,
    _schema,
    _sql,
    open_run_store,
)

REPO = Path(__file__).resolve().parents[1]
LIMIT = 10


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[RunStore]:
    async with open_run_store(tmp_path / "state") as s:
        yield s


def run(run_id: str = "r1", *, created: float = 100.0, **kw: Any) -> RunRecord:
    fields: dict[str, Any] = {"kind": "pipeline", "status": "running", "cwd": "/ws"}
    fields.update(kw)
    return RunRecord(run_id=run_id, created=created, **fields)


def sql(store: RunStore, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """Run a query on a separate connection, as another process would."""
    conn = sqlite3.connect(store.path)
    try:
        return conn.execute(query, args).fetchall()
    finally:
        conn.close()


# --------------------------------------------------------------------------- opening


async def test_open_creates_the_state_dir_and_database(tmp_path: Path) -> None:
    """Opening a store in a missing directory creates it and runs.sqlite3 at the latest version."""
    target = tmp_path / "a" / "b"
    async with open_run_store(target) as s:
        assert s.path == target / STORE_FILENAME
        assert s.path.is_file()
        assert s.migrated_from == 0
    assert sql(s, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


async def test_wal_mode_is_on(store: RunStore) -> None:
    """The database is in WAL mode, which other connections see too."""
    assert sql(store, "PRAGMA journal_mode") == [("wal",)]


async def test_store_pragmas_on_its_connection(store: RunStore) -> None:
    """The store's connection has foreign keys on, synchronous NORMAL and a busy timeout."""
    conn = store._conn
    assert conn is not None
    assert conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
    assert conn.execute("PRAGMA synchronous").fetchone() == (1,)  # NORMAL
    assert conn.execute("PRAGMA busy_timeout").fetchone() == (_schema.BUSY_TIMEOUT_MS,)


async def test_not_a_database_is_a_store_error(tmp_path: Path) -> None:
    """A runs.sqlite3 that is not SQLite raises StoreError naming the file."""
    (tmp_path / STORE_FILENAME).write_bytes(b"this is not a database, just text" * 100)
    with pytest.raises(StoreError, match=r"runs\.sqlite3"):
        await RunStore.open(tmp_path)


async def test_closed_store_refuses_calls_and_closes_twice(tmp_path: Path) -> None:
    """After aclose every call raises StoreError, and aclose again is harmless."""
    s = await RunStore.open(tmp_path)
    await s.aclose()
    await s.aclose()
    assert s.closed
    with pytest.raises(StoreError, match="closed"):
        await s.list_runs()


async def test_aclose_in_a_cancelled_scope_still_closes(tmp_path: Path) -> None:
    """Leaving open_run_store through a cancellation closes the connection all the same."""
    with trio.CancelScope() as scope:
        async with open_run_store(tmp_path) as s:
            scope.cancel()
            await trio.lowlevel.checkpoint()
    assert scope.cancelled_caught
    assert s.closed


async def test_statistics_count_calls(store: RunStore) -> None:
    """statistics() gives the path, the schema version and the reads and writes made."""
    await store.create_run(run())
    await store.get_run("r1")
    await store.list_runs()
    stats = store.statistics()
    assert stats["path"] == str(store.path)
    assert stats["schemaVersion"] == SCHEMA_VERSION
    assert (stats["calls"], stats["reads"], stats["writes"]) == (3, 2, 1)
    assert stats["seconds"] >= 0


# --------------------------------------------------------------------------- records


def test_records_validate_kinds_and_statuses() -> None:
    """Unknown run kinds and statuses, step statuses and change kinds are refused."""
    with pytest.raises(ValueError, match="run kind"):
        run(kind="sweep")
    with pytest.raises(ValueError, match="run status"):
        run(status="done")
    with pytest.raises(ValueError, match="step status"):
        StepRecord("r1", "k", "k", status="done")
    with pytest.raises(ValueError, match="change kind"):
        StoredChange("a", "rename")  # type: ignore[arg-type]


def test_stored_change_shapes() -> None:
    """A write needs data, a delete or mode change carries none, a mode change needs a mode."""
    with pytest.raises(ValueError, match="without data"):
        StoredChange("a", "write")
    with pytest.raises(ValueError, match="must not carry data"):
        StoredChange("a", "delete", b"x")
    with pytest.raises(ValueError, match="without a mode"):
        StoredChange("a", "mode")
    with pytest.raises(ValueError, match="path"):
        StoredChange("", "delete")


def test_to_json_is_camel_case() -> None:
    """to_json() of every record uses camelCase keys."""
    assert run(pipeline_digest="d").to_json()["pipelineDigest"] == "d"
    step = StepRecord("r1", "k", "k", session_id="s", value_stored=True, value=[1])
    assert step.to_json()["sessionId"] == "s"
    assert step.to_json()["valueStored"] is True
    change = StoredChange("a", "write", b"hi", base_digest="b")
    assert change.to_json() == {
        "path": "a",
        "kind": "write",
        "mode": None,
        "baseDigest": "b",
        "size": 2,
        "digest": hashlib.sha256(b"hi").hexdigest(),
    }


# --------------------------------------------------------------------------- runs


async def test_run_round_trip(store: RunStore) -> None:
    """Every field of a run, JSON mappings included, comes back as it went in."""
    record = RunRecord(
        run_id="r1",
        kind="pipeline",
        status="succeeded",
        created=1.5,
        cwd="/ws",
        finished=2.5,
        pipeline="/p/pipe.py",
        pipeline_digest="abc",
        inputs={"task": "x", "n": 3},
        options={"agents": ["claude", "codex"], "nested": {"a": None}},
        result={"ok": True},
        error="none really",
        applied=3.5,
    )
    await store.create_run(record)
    assert await store.get_run("r1") == record


async def test_create_run_twice_is_an_error(store: RunStore) -> None:
    """A second run with the same id raises StoreError and leaves the first alone."""
    await store.create_run(run(status="running"))
    with pytest.raises(StoreError, match="already exists"):
        await store.create_run(run(status="failed"))
    assert (await store.get_run("r1")).status == "running"


async def test_json_that_is_not_json_is_refused(store: RunStore) -> None:
    """A run whose inputs cannot be JSON raises TypeError and nothing is stored."""
    with pytest.raises(TypeError, match="inputs"):
        await store.create_run(run(inputs={"x": object()}))
    assert await store.list_runs() == []


async def test_update_run(store: RunStore) -> None:
    """update_run changes the given fields, validates them and returns the new record."""
    await store.create_run(run())
    updated = await store.update_run("r1", status="succeeded", finished=9.0, result={"a": 1})
    assert updated == await store.get_run("r1")
    assert (updated.status, updated.finished, updated.result) == ("succeeded", 9.0, {"a": 1})
    assert updated.created == 100.0
    with pytest.raises(ValueError, match="run status"):
        await store.update_run("r1", status="bogus")
    with pytest.raises(TypeError, match="run_id"):
        await store.update_run("r1", run_id="r2")
    with pytest.raises(TypeError, match="colour"):
        await store.update_run("r1", colour="red")
    with pytest.raises(RunNotFound):
        await store.update_run("nope", status="failed")
    assert (await store.get_run("r1")).status == "succeeded"


async def test_get_run_by_unique_prefix(store: RunStore) -> None:
    """A unique prefix finds its run; a full id wins even when it prefixes another id."""
    for rid in ("abc123", "abd456", "ab"):
        await store.create_run(run(rid))
    assert (await store.get_run("abc")).run_id == "abc123"
    assert (await store.get_run("abd4")).run_id == "abd456"
    assert (await store.get_run("ab")).run_id == "ab"


async def test_get_run_ambiguous_prefix_lists_candidates(store: RunStore) -> None:
    """An ambiguous prefix raises RunNotFound (a UsageError) naming the candidates."""
    for rid in ("abc123", "abd456", "xyz"):
        await store.create_run(run(rid))
    with pytest.raises(RunNotFound, match="ambiguous") as info:
        await store.get_run("a")
    assert isinstance(info.value, UsageError)
    assert "abc123" in str(info.value)
    assert "abd456" in str(info.value)
    assert "xyz" not in str(info.value)


async def test_get_run_many_candidates_are_summarized(store: RunStore) -> None:
    """With more candidates than fit, the message lists ten and counts the rest."""
    for i in range(13):
        await store.create_run(run(f"run{i:02d}"))
    with pytest.raises(RunNotFound, match="13 runs match") as info:
        await store.get_run("run")
    assert "and 3 more" in str(info.value)


async def test_get_run_missing(store: RunStore) -> None:
    """An id or prefix that matches nothing, or an empty one, raises RunNotFound."""
    await store.create_run(run("abc"))
    with pytest.raises(RunNotFound, match="no run 'abd'"):
        await store.get_run("abd")
    with pytest.raises(RunNotFound, match="empty"):
        await store.get_run("")


async def test_get_run_prefix_with_unusual_characters(store: RunStore) -> None:
    """Prefixes are literal: %, _ and the highest code point match only themselves."""
    for rid in ("a%b", "a_c", "axc", "z\U0010ffffq"):
        await store.create_run(run(rid))
    assert (await store.get_run("a%")).run_id == "a%b"
    assert (await store.get_run("a_")).run_id == "a_c"
    assert (await store.get_run("z\U0010ffff")).run_id == "z\U0010ffffq"


async def test_list_runs_newest_first_with_filters(store: RunStore) -> None:
    """list_runs sorts newest first and filters by status and kind, up to a limit."""
    await store.create_run(run("old", created=1.0, status="succeeded"))
    await store.create_run(run("mid", created=2.0, status="failed", kind="prompt"))
    await store.create_run(run("new", created=3.0, status="succeeded", kind="compare"))
    await store.create_run(run("tie", created=3.0, status="running"))
    assert [r.run_id for r in await store.list_runs()] == ["tie", "new", "mid", "old"]
    assert [r.run_id for r in await store.list_runs(limit=2)] == ["tie", "new"]
    assert [r.run_id for r in await store.list_runs(limit=None)] == ["tie", "new", "mid", "old"]
    assert [r.run_id for r in await store.list_runs(status="succeeded")] == ["new", "old"]
    assert [r.run_id for r in await store.list_runs(kind="prompt")] == ["mid"]
    assert await store.list_runs(status="interrupted") == []
    with pytest.raises(UsageError, match="unknown run status"):
        await store.list_runs(status="done")
    with pytest.raises(UsageError, match="unknown run kind"):
        await store.list_runs(kind="sweep")


async def test_mark_interrupted(store: RunStore) -> None:
    """The run and its running and pending steps become interrupted; finished steps stay."""
    await store.create_run(run())
    await store.put_step(StepRecord("r1", "a", "a", status="succeeded", started=1, finished=2))
    await store.put_step(StepRecord("r1", "b", "b", status="running", started=3))
    await store.put_step(StepRecord("r1", "c", "c", status="pending"))
    await store.put_step(StepRecord("r1", "d", "d", status="failed", started=1, finished=2))
    await store.mark_interrupted("r1")
    r = await store.get_run("r1")
    assert r.status == "interrupted"
    assert r.finished is not None
    steps = {s.key: s for s in await store.steps("r1")}
    assert {k: s.status for k, s in steps.items()} == {
        "a": "succeeded",
        "b": "interrupted",
        "c": "interrupted",
        "d": "failed",
    }
    assert steps["b"].finished is not None
    assert steps["c"].finished is None
    assert steps["a"].finished == 2


async def test_mark_interrupted_keeps_a_finished_runs_status(store: RunStore) -> None:
    """A run that already ended keeps its status and finish time; an unknown run is an error."""
    await store.create_run(run(status="succeeded", finished=5.0))
    await store.mark_interrupted("r1")
    r = await store.get_run("r1")
    assert (r.status, r.finished) == ("succeeded", 5.0)
    with pytest.raises(RunNotFound):
        await store.mark_interrupted("r2")


async def test_delete_run_removes_everything(store: RunStore) -> None:
    """delete_run removes the run and all its rows (foreign keys cascade)."""
    await store.create_run(run())
    await store.put_step(StepRecord("r1", "s", "s"))
    await store.put_changes("r1", "s", [StoredChange("a", "write", b"x")], diff="d")
    await store.add_transcript("r1", "claude#1", [{"dir": "send"}])
    await store.add_permissions("r1", "s", [{"verdict": "allow"}])
    await store.add_conflicts("r1", "s", [{"path": "a"}])
    await store.add_event("r1", {"type": "started"})
    await store.delete_run("r1")
    with pytest.raises(RunNotFound):
        await store.get_run("r1")
    for table in (
        "steps",
        "change_sets",
        "changes",
        "blobs",
        "transcripts",
        "permissions",
        "conflicts",
        "events",
    ):
        assert sql(store, f"SELECT count(*) FROM {table}") == [(0,)], table


async def test_delete_runs_is_all_or_nothing_and_collects_blobs_by_reference(
    store: RunStore,
) -> None:
    """delete_runs: an unknown id deletes nothing; else the runs go with every blob no
    remaining change uses (one left unreferenced before too); a dry run rolls back."""
    await store.create_run(run("r1"))
    await store.create_run(run("r2"))
    own = b"r1 only" * 5000
    await store.put_changes(
        "r1", "s", [StoredChange("a", "write", b"shared"), StoredChange("b", "write", own)], diff=""
    )
    await store.put_changes("r2", "s", [StoredChange("a", "write", b"shared")], diff="")
    other = sqlite3.connect(store.path)  # another process, leaving a blob nothing uses
    with other:
        other.execute("INSERT INTO blobs (digest, size, data) VALUES ('stray', 1, x'00')")
    other.close()
    with pytest.raises(RunNotFound):
        await store.delete_runs(["r1", "nope"])
    assert len(await store.list_runs()) == 2
    dry = await store.delete_runs(["r1"], dry_run=True)
    assert len(await store.list_runs()) == 2 and len(sql(store, "SELECT * FROM blobs")) == 3
    assert await store.delete_runs(["r1"]) == dry > 0
    assert [r.run_id for r in await store.list_runs()] == ["r2"]
    assert sql(store, "SELECT data FROM blobs") == [(b"shared",)]


# --------------------------------------------------------------------------- steps


async def test_step_round_trip(store: RunStore) -> None:
    """Every field of a step comes back as it went in."""
    await store.create_run(run())
    step = StepRecord(
        run_id="r1",
        key="implement[codex]",
        step="implement",
        instance="codex",
        agent="codex",
        status="failed",
        attempt=2,
        started=1.0,
        finished=2.0,
        session_id="sess-1",
        result={"stopReason": "end_turn", "text": "done"},
        value={"files": ["a", "b"]},
        value_stored=True,
        error="boom",
        cause="timeout",
        usage={"tokens": {"input": 3}},
        traceback='Traceback (most recent call last):\n  File "p.py", line 1\nValueError: x\n',
    )
    await store.put_step(step)
    assert await store.steps("r1") == [step]


async def test_step_value_stored_flag(store: RunStore) -> None:
    """A stored None value is told apart from a value that was not stored."""
    await store.create_run(run())
    await store.put_step(StepRecord("r1", "a", "a", value=None, value_stored=True))
    await store.put_step(StepRecord("r1", "b", "b", value="ignored", value_stored=False))
    a, b = await store.steps("r1")
    assert (a.value, a.value_stored) == (None, True)
    assert (b.value, b.value_stored) == (None, False)


async def test_put_step_replaces_in_place(store: RunStore) -> None:
    """Putting a step with an existing key replaces it and keeps its place in the order."""
    await store.create_run(run())
    for key in ("c", "a", "b"):
        await store.put_step(StepRecord("r1", key, key, status="running"))
    await store.put_step(StepRecord("r1", "a", "a", status="succeeded", attempt=2))
    steps = await store.steps("r1")
    assert [s.key for s in steps] == ["c", "a", "b"]
    assert (steps[1].status, steps[1].attempt) == ("succeeded", 2)
    assert sql(store, "SELECT count(*) FROM steps") == [(3,)]


async def test_steps_are_per_run(store: RunStore) -> None:
    """Steps of one run do not show in another; an unknown run is RunNotFound."""
    await store.create_run(run("r1"))
    await store.create_run(run("r2"))
    await store.put_step(StepRecord("r1", "a", "a"))
    await store.put_step(StepRecord("r2", "a", "a", status="running"))
    assert [s.status for s in await store.steps("r1")] == ["pending"]
    assert [s.status for s in await store.steps("r2")] == ["running"]
    with pytest.raises(RunNotFound):
        await store.put_step(StepRecord("nope", "a", "a"))
    with pytest.raises(RunNotFound):
        await store.steps("nope")


# --------------------------------------------------------------------------- changes


async def test_changes_round_trip(store: RunStore) -> None:
    """A change set (writes, deletes, mode changes) and its diffs come back in order."""
    await store.create_run(run())
    changes = [
        StoredChange("src/b.py", "write", b"print(1)\n", 0o100644, "1" * 64),
        StoredChange("new.bin", "write", bytes(range(256)), 0o100755, None),
        StoredChange("gone.txt", "delete", None, None, "2" * 64),
        StoredChange("run.sh", "mode", None, 0o100755, "3" * 64),
        StoredChange("empty", "write", b""),
    ]
    await store.put_changes("r1", "s", changes, diff="--- a\n+++ b\n", own_diff="own")
    assert await store.changes("r1", "s") == changes
    assert await store.diff("r1", "s") == "--- a\n+++ b\n"
    assert await store.own_diff("r1", "s") == "own"
    assert await store.change_keys("r1") == ["s"]


async def test_changes_of_a_step_without_any(store: RunStore) -> None:
    """A step with no recorded change set has no changes and empty diffs."""
    await store.create_run(run())
    assert await store.changes("r1", "s") == []
    assert await store.diff("r1", "s") == ""
    assert await store.own_diff("r1", "s") == ""
    assert await store.change_keys("r1") == []
    with pytest.raises(RunNotFound):
        await store.changes("nope", "s")


async def test_put_changes_replaces_the_set(store: RunStore) -> None:
    """A second put_changes for a step replaces its changes and diffs entirely."""
    await store.create_run(run())
    await store.put_changes("r1", "s", [StoredChange("a", "write", b"1")], diff="d1", own_diff="o")
    await store.put_changes("r1", "s", [StoredChange("b", "delete")], diff="d2")
    assert await store.changes("r1", "s") == [StoredChange("b", "delete")]
    assert await store.diff("r1", "s") == "d2"
    assert await store.own_diff("r1", "s") == ""


async def test_own_changes_round_trip_and_go_with_their_change_set(store: RunStore) -> None:
    """A step's own changes (writes with content and mode, deletions) come back in order; a
    new change set replaces them, and a step without any has none."""
    await store.create_run(run())
    big = bytes(range(256)) * (_sql.BLOB_PIECE // 256 + 1)  # read through a blob handle
    own = [
        StoredChange("README.md", "write", b"new\n", 0o100644),
        StoredChange("big.bin", "write", big, 0o100755),
        StoredChange("gone.txt", "delete"),
        StoredChange("link", "write", b"README.md", 0o120777),
    ]
    net = [StoredChange("README.md", "write", b"new\n", None, "1" * 64)]
    await store.put_changes("r1", "s", net, diff="d", own_diff="o", own=own)
    assert await store.own_changes("r1", "s") == own
    assert await store.changes("r1", "s") == net
    assert await store.own_changes("r1", "other") == []
    await store.put_changes("r1", "s", net, diff="d")
    assert await store.own_changes("r1", "s") == []
    with pytest.raises(RunNotFound):
        await store.own_changes("nope", "s")


async def test_own_changes_are_writes_or_deletions(store: RunStore) -> None:
    """An own change set holding a mode change or a path twice is refused before any write."""
    await store.create_run(run())
    with pytest.raises(ValueError, match="mode change"):
        PutChanges("r1", "s", [], "", "", [StoredChange("x", "mode", None, 0o100755)])
    with pytest.raises(ValueError, match="twice in the own change set"):
        PutChanges("r1", "s", [], "", "", [StoredChange("x", "delete")] * 2)
    assert sql(store, "SELECT count(*) FROM change_sets") == [(0,)]


async def test_a_blob_an_own_change_holds_is_kept(store: RunStore) -> None:
    """Content only an own change refers to stays until that change set goes too."""
    await store.create_run(run("r1"))
    await store.create_run(run("r2"))
    only_own = [StoredChange("a.txt", "write", b"own only", 0o100644)]
    await store.put_changes("r1", "s", [], diff="", own=only_own)
    await store.put_changes("r2", "s", [StoredChange("b", "write", b"other")], diff="")
    await store.put_changes("r2", "s", [], diff="")  # drops "other", keeps "own only"
    assert sql(store, "SELECT size FROM blobs") == [(len(b"own only"),)]
    assert await store.own_changes("r1", "s") == only_own
    assert await store.delete_runs(["r2"]) >= 0
    assert sql(store, "SELECT count(*) FROM blobs") == [(1,)]
    await store.delete_run("r1")
    assert sql(store, "SELECT count(*) FROM blobs") == [(0,)]
    assert sql(store, "SELECT count(*) FROM own_changes") == [(0,)]


async def test_sessions_of_every_attempt_are_kept(store: RunStore) -> None:
    """Each attempt's session is kept in order (a step record keeps only the last); one
    recorded again for an attempt replaces it and the attempts after it."""
    await store.create_run(run())
    first = SessionRecord("r1", "impl[a]", 1, "claude", "claude", "s-1")
    second = SessionRecord("r1", "impl[a]", 2, "claude", "claude#2", "s-1")
    other = SessionRecord("r1", "docs", 1, "bob", "bob", "s-1")
    await store.write_many([PutSession(first), PutSession(other)])
    await store.put_session(second)
    assert await store.sessions("r1") == [first, other, second]
    assert await store.sessions("r1", "impl[a]") == [first, second]
    assert second.to_json() == {
        "runId": "r1",
        "key": "impl[a]",
        "attempt": 2,
        "agent": "claude",
        "source": "claude#2",
        "sessionId": "s-1",
    }
    # a resume runs impl[a] again from its first attempt: the old second one is not its
    again = SessionRecord("r1", "impl[a]", 1, "claude", "claude", "s-9")
    await store.put_session(again)
    assert await store.sessions("r1") == [other, again]
    with pytest.raises(RunNotFound):
        await store.put_session(attrs.evolve(first, run_id="nope"))
    await store.delete_run("r1")
    assert sql(store, "SELECT count(*) FROM step_sessions") == [(0,)]


async def test_the_pipeline_source_is_kept_with_the_run(store: RunStore) -> None:
    """The pipeline file's text given when the run is created comes back; a run without one
    has None."""
    text = "from orchestrator import step\n\n@step()\ndef one() -> str:\n    return 'é'\n"
    await store.create_run(run("r1", pipeline="/p/pipe.py"), pipeline_source=text)
    await store.create_run(run("r2"))
    assert await store.pipeline_source("r1") == text
    assert await store.pipeline_source("r2") is None
    # an update of the run leaves it alone
    await store.update_run("r1", status="succeeded")
    assert await store.pipeline_source("r1") == text
    with pytest.raises(RunNotFound):
        await store.pipeline_source("nope")


async def test_duplicate_paths_are_refused(store: RunStore) -> None:
    """A change set naming a path twice raises ValueError."""
    await store.create_run(run())
    with pytest.raises(ValueError, match="twice"):
        await store.put_changes(
            "r1", "s", [StoredChange("a", "delete"), StoredChange("a", "delete")], diff=""
        )


async def test_blobs_are_deduplicated(store: RunStore) -> None:
    """The same content written by two steps and two runs is stored once."""
    content = b"same content\n" * 100
    await store.create_run(run("r1"))
    await store.create_run(run("r2"))
    await store.put_changes("r1", "a", [StoredChange("x.txt", "write", content)], diff="")
    await store.put_changes("r1", "b", [StoredChange("y.txt", "write", content)], diff="")
    await store.put_changes("r2", "a", [StoredChange("x.txt", "write", content)], diff="")
    assert sql(store, "SELECT count(*) FROM blobs") == [(1,)]
    assert sql(store, "SELECT count(*) FROM changes") == [(3,)]
    assert sql(store, "SELECT digest, size FROM blobs") == [
        (hashlib.sha256(content).hexdigest(), len(content))
    ]
    assert (await store.changes("r2", "a"))[0].data == content


async def test_unreferenced_blobs_are_dropped(store: RunStore) -> None:
    """Replacing or deleting change sets drops contents nothing refers to, and only those."""
    await store.create_run(run("r1"))
    await store.create_run(run("r2"))
    await store.put_changes("r1", "a", [StoredChange("x", "write", b"shared")], diff="")
    await store.put_changes("r2", "a", [StoredChange("x", "write", b"shared")], diff="")
    await store.put_changes("r1", "b", [StoredChange("y", "write", b"own")], diff="")
    await store.put_changes("r1", "b", [StoredChange("y", "write", b"own v2")], diff="")
    assert sorted(d for (d,) in sql(store, "SELECT data FROM blobs")) == [b"own v2", b"shared"]
    await store.delete_run("r1")
    assert sql(store, "SELECT data FROM blobs") == [(b"shared",)]


# --------------------------------------------------------------------------- transcripts


async def test_transcript_round_trip(store: RunStore) -> None:
    """Bytes lines (several per item allowed, big ones too) and dicts come back in order."""
    await store.create_run(run())
    big = b'{"dir":"recv","msg":"' + b"x" * 600_000 + b'"}'
    await store.add_transcript(
        "r1",
        "claude#1",
        [b'{"dir":"send","t":0.1}\n', b'{"n":1}\n\n{"n":2}\n', {"dir": "recv", "t": 0.2}],
    )
    await store.add_transcript("r1", "codex#1", [big])
    await store.add_transcript("r1", "claude#1", [b'{"n":3}'])
    claude = await store.transcript("r1", "claude#1")
    assert claude == [
        {"dir": "send", "t": 0.1},
        {"n": 1},
        {"n": 2},
        {"dir": "recv", "t": 0.2},
        {"n": 3},
    ]
    codex = await store.transcript("r1", "codex#1")
    assert len(codex) == 1
    assert len(codex[0]["msg"]) == 600_000
    everything = await store.transcript("r1")
    assert [line.get("n") for line in everything] == [None, 1, 2, None, None, 3]
    assert await store.transcript_sources("r1") == ["claude#1", "codex#1"]
    assert await store.transcript("r1", "gemini#1") == []


async def test_a_flood_transcript_is_stored_in_few_rows(store: RunStore) -> None:
    """200,000 lines in one item become a few rows of whole lines; they read back in order."""
    await store.create_run(run())
    data = b"".join(b'{"n":%d}\n' % i for i in range(200_000))
    await store.add_transcript("r1", "flood", [data])
    [(count,)] = sql(store, "SELECT count(*) FROM transcripts")
    assert 1 <= count <= 4
    lines = await store.transcript("r1", "flood")
    assert [line["n"] for line in lines] == list(range(200_000))


async def test_transcript_bad_line_is_kept_raw(store: RunStore) -> None:
    """A stored line that is not a JSON object comes back as {"raw": text}."""
    await store.create_run(run())
    await store.add_transcript("r1", "a", [b"not json", b"[1, 2]"])
    assert await store.transcript("r1") == [{"raw": "not json"}, {"raw": "[1, 2]"}]


# --------------------------------------------------------------------------- audit records


async def test_permissions_round_trip(store: RunStore) -> None:
    """Permission records come back in order with the key they were added under."""
    await store.create_run(run())
    p1 = {"agent": "claude", "verdict": "allow", "step": "implement", "paths": ["a"]}
    p2 = {"agent": "codex", "verdict": "reject", "step": "implement"}
    p3 = {"agent": "claude", "verdict": "cancelled", "step": None}
    await store.add_permissions("r1", "implement[claude]", [p1])
    await store.add_permissions("r1", "implement[codex]", [p2])
    await store.add_permissions("r1", "implement[claude]", [p3])
    assert await store.permissions("r1", "implement[claude]") == [
        {**p1, "stepKey": "implement[claude]"},
        {**p3, "stepKey": "implement[claude]"},
    ]
    assert [p["stepKey"] for p in await store.permissions("r1")] == [
        "implement[claude]",
        "implement[codex]",
        "implement[claude]",
    ]


async def test_conflicts_round_trip(store: RunStore) -> None:
    """Conflicts come back in order, each with the step it was added under."""
    await store.create_run(run())
    await store.add_conflicts("r1", "review", [{"path": "a", "kind": "content"}])
    await store.add_conflicts("r1", "merge", [{"path": "b", "hunks": [[1, 2]]}])
    assert await store.conflicts("r1") == [
        {"path": "a", "kind": "content", "step": "review"},
        {"path": "b", "hunks": [[1, 2]], "step": "merge"},
    ]


async def test_events_round_trip(store: RunStore) -> None:
    """Timeline events come back in the order added; an unknown run is RunNotFound."""
    await store.create_run(run())
    events = [{"type": "step-started", "step": "a", "time": 1.0}, {"type": "done", "time": 2}]
    for event in events:
        await store.add_event("r1", event)
    assert await store.events("r1") == events
    with pytest.raises(RunNotFound):
        await store.add_event("nope", {"type": "x"})


# --------------------------------------------------------------------------- batched writes


def traced(store: RunStore) -> list[str]:
    """The statements the store's connection runs from now on."""
    statements: list[str] = []
    conn = store._conn
    assert conn is not None
    conn.set_trace_callback(statements.append)
    return statements


def every_op(run_id: str = "r1") -> list[StoreOp]:
    """One op of each kind, for run ``run_id``."""
    return [
        PutStep(StepRecord(run_id, "a", "a", agent="claude", status="running")),
        PutChanges(run_id, "a", [StoredChange("f.txt", "write", b"new")], "diff a", "own a"),
        AddPermissions(run_id, "a", [{"verdict": "allow", "step": "a"}]),
        AddConflicts(run_id, "a", [{"path": "f.txt"}]),
        AddEvent(run_id, {"type": "step-started", "step": "a"}),
        UpdateRun(run_id, {"status": "succeeded", "finished": 5.0}),
    ]


async def assert_nothing_written(store: RunStore) -> None:
    """Run r1 is as create_run left it: no step, change, record or event, still running."""
    assert await store.steps("r1") == []
    assert await store.change_keys("r1") == []
    assert await store.permissions("r1") == []
    assert await store.conflicts("r1") == []
    assert await store.events("r1") == []
    assert (await store.get_run("r1")).status == "running"
    assert sql(store, "SELECT count(*) FROM blobs") == [(0,)]


async def test_write_many_lands_every_op(store: RunStore) -> None:
    """Each kind of op writes what its method writes."""
    await store.create_run(run())
    await store.write_many(every_op())
    [step] = await store.steps("r1")
    assert (step.key, step.agent, step.status) == ("a", "claude", "running")
    assert await store.changes("r1", "a") == [StoredChange("f.txt", "write", b"new")]
    assert (await store.diff("r1", "a"), await store.own_diff("r1", "a")) == ("diff a", "own a")
    assert await store.permissions("r1") == [{"verdict": "allow", "step": "a", "stepKey": "a"}]
    assert await store.conflicts("r1") == [{"path": "f.txt", "step": "a"}]
    assert await store.events("r1") == [{"type": "step-started", "step": "a"}]
    record = await store.get_run("r1")
    assert (record.status, record.finished) == ("succeeded", 5.0)


async def test_write_many_is_one_thread_hop_and_one_transaction(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch runs in one worker thread call, inside one BEGIN IMMEDIATE ... COMMIT."""
    await store.create_run(run())
    hops = 0
    real = trio.to_thread.run_sync

    async def counting_run_sync(*args: Any, **kwargs: Any) -> Any:
        nonlocal hops
        hops += 1
        return await real(*args, **kwargs)

    monkeypatch.setattr(trio.to_thread, "run_sync", counting_run_sync)
    statements = traced(store)
    writes = store.statistics()["writes"]
    await store.write_many(every_op())
    assert hops == 1
    assert store.statistics()["writes"] == writes + 1
    assert [s for s in statements if s in ("BEGIN IMMEDIATE", "COMMIT", "ROLLBACK")] == [
        "BEGIN IMMEDIATE",
        "COMMIT",
    ]
    assert statements[0] == "BEGIN IMMEDIATE"
    assert statements[-1] == "COMMIT"


async def test_write_many_failing_op_rolls_back_the_whole_batch(store: RunStore) -> None:
    """When the last op names an unknown run, the ops before it are not written either."""
    await store.create_run(run())
    statements = traced(store)
    with pytest.raises(RunNotFound, match="nope"):
        await store.write_many([*every_op(), AddEvent("nope", {"type": "x"})])
    assert "ROLLBACK" in statements
    await assert_nothing_written(store)
    # the connection is not left inside a transaction
    await store.write_many(every_op())
    assert len(await store.steps("r1")) == 1


async def test_write_many_invalid_value_rolls_back_the_whole_batch(store: RunStore) -> None:
    """A run field refused while the batch is applied undoes the ops that came before it."""
    await store.create_run(run())
    with pytest.raises(ValueError, match="run status"):
        await store.write_many([*every_op()[:-1], UpdateRun("r1", {"status": "bogus"})])
    await assert_nothing_written(store)


async def test_write_many_error_inside_an_op_rolls_back_the_whole_batch(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An error halfway through one op's statements undoes that op and every other one."""
    await store.create_run(run())

    def failing_store_blob(conn: sqlite3.Connection, digest: str, data: bytes) -> None:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(_sql, "store_blob", failing_store_blob)
    ops = every_op()
    with pytest.raises(RuntimeError, match="disk on fire"):
        await store.write_many([ops[0], ops[4], ops[5], ops[1]])
    await assert_nothing_written(store)


async def test_write_many_checks_every_op_before_writing(store: RunStore) -> None:
    """An op that cannot be encoded fails the batch before the database is touched."""
    await store.create_run(run())
    writes = store.statistics()["writes"]
    with pytest.raises(TypeError, match="event is not JSON-serializable"):
        await store.write_many([*every_op(), AddEvent("r1", {"x": object()})])
    with pytest.raises(TypeError, match="not a run store op: str"):
        await store.write_many([*every_op(), "put_step"])  # type: ignore[list-item]
    assert store.statistics()["writes"] == writes
    await assert_nothing_written(store)


async def test_write_many_preserves_order(store: RunStore) -> None:
    """Ops apply in the order given: later writes replace or follow earlier ones."""
    await store.create_run(run())
    await store.write_many(
        [
            PutStep(StepRecord("r1", "b", "b", status="pending")),
            AddEvent("r1", {"n": 1}),
            PutStep(StepRecord("r1", "a", "a", status="running")),
            PutChanges("r1", "a", [StoredChange("f", "write", b"first")], "d1"),
            AddPermissions("r1", "a", [{"n": 1}]),
            AddEvent("r1", {"n": 2}),
            PutStep(StepRecord("r1", "b", "b", status="succeeded")),
            AddPermissions("r1", "b", [{"n": 2}, {"n": 3}]),
            PutChanges("r1", "a", [StoredChange("g", "write", b"second")], "d2"),
            UpdateRun("r1", {"status": "failed"}),
            AddEvent("r1", {"n": 3}),
            UpdateRun("r1", {"status": "succeeded"}),
        ]
    )
    assert [(s.key, s.status) for s in await store.steps("r1")] == [
        ("b", "succeeded"),
        ("a", "running"),
    ]
    assert await store.events("r1") == [{"n": 1}, {"n": 2}, {"n": 3}]
    assert [p["n"] for p in await store.permissions("r1")] == [1, 2, 3]
    assert await store.changes("r1", "a") == [StoredChange("g", "write", b"second")]
    assert await store.diff("r1", "a") == "d2"
    # the first change set's content went with it
    assert sql(store, "SELECT data FROM blobs") == [(b"second",)]
    assert (await store.get_run("r1")).status == "succeeded"


async def test_write_many_empty_batch(tmp_path: Path) -> None:
    """An empty batch writes nothing; on a closed store it is a StoreError like any call."""
    async with open_run_store(tmp_path) as s:
        await s.write_many([])
        assert s.statistics()["writes"] == 0
    with pytest.raises(StoreError, match="closed"):
        await s.write_many([])


def test_ops_check_their_arguments() -> None:
    """Ops refuse what their methods refuse, and keep a copy of the mappings they are given."""
    twice = [StoredChange("f", "delete"), StoredChange("f", "write", b"x")]
    with pytest.raises(ValueError, match="'f' appears twice"):
        PutChanges("r1", "k", twice, "diff")
    with pytest.raises(TypeError, match="colour"):
        UpdateRun("r1", {"colour": "red"})
    fields: dict[str, Any] = {"status": "failed"}
    event: dict[str, Any] = {"type": "a"}
    update, add = UpdateRun("r1", fields), AddEvent("r1", event)
    fields["status"] = "succeeded"
    event["type"] = "b"
    assert (dict(update.fields), dict(add.event)) == ({"status": "failed"}, {"type": "a"})


# --------------------------------------------------------------------------- concurrency


async def test_two_stores_on_one_file_see_each_others_writes(tmp_path: Path) -> None:
    """Two open stores on the same file read what the other wrote."""
    async with open_run_store(tmp_path) as a, open_run_store(tmp_path) as b:
        await a.create_run(run("from-a"))
        await b.create_run(run("from-b", created=200.0))
        await b.put_step(StepRecord("from-a", "s", "s", status="running"))
        assert [r.run_id for r in await a.list_runs()] == ["from-b", "from-a"]
        assert [s.status for s in await a.steps("from-a")] == ["running"]
        await a.update_run("from-b", status="succeeded")
        assert (await b.get_run("from-b")).status == "succeeded"


async def test_two_stores_create_a_new_file_at_once(tmp_path: Path) -> None:
    """Stores opened concurrently on a new file both end up at the latest schema."""
    stores: list[RunStore] = []

    async def opener() -> None:
        stores.append(await RunStore.open(tmp_path))

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            for _ in range(4):
                nursery.start_soon(opener)
    try:
        await stores[0].create_run(run())
        for s in stores:
            assert [r.run_id for r in await s.list_runs()] == ["r1"]
        assert sorted(s.migrated_from for s in stores).count(0) == 1
    finally:
        for s in stores:
            await s.aclose()


def _open_into(path: Path, opened: list[sqlite3.Connection], errors: list[BaseException]) -> None:
    try:
        _schema.connect(path, opened)
    except BaseException as e:
        errors.append(e)


def test_connections_racing_to_create_a_file_all_open_it(tmp_path: Path) -> None:
    """Four threads opening a new file at once all succeed, fifty files over (WAL retried)."""
    for round_ in range(50):
        path = tmp_path / f"r{round_}" / "runs.sqlite3"
        opened: list[sqlite3.Connection] = []
        errors: list[BaseException] = []
        threads = [
            threading.Thread(target=_open_into, args=(path, opened, errors)) for _ in range(4)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        for conn in opened:
            conn.close()
        assert errors == []
        assert len(opened) == 4


async def test_another_process_reads_and_writes_while_open(store: RunStore) -> None:
    """A second process opens the store while this one has it open, and both see all writes."""
    await store.create_run(run("parent"))
    await store.put_step(StepRecord("parent", "s", "s", status="running"))
    script = textwrap.dedent(
        """
        import sys, trio
        from orchestrator.store import RunRecord, open_run_store

        async def main():
            async with open_run_store(sys.argv[1]) as s:
                await s.create_run(RunRecord("child", "prompt", "running", 300.0, "/"))
                steps = await s.steps((await s.get_run("par")).run_id)
                print("steps:", [st.status for st in steps])

        trio.run(main)
        """
    )
    with trio.fail_after(60):
        done = await trio.run_process(
            [sys.executable, "-c", script, str(store.path.parent)],
            capture_stdout=True,
            capture_stderr=True,
            cwd=REPO,
        )
    assert "steps: ['running']" in done.stdout.decode()
    assert [r.run_id for r in await store.list_runs()] == ["child", "parent"]


async def test_many_concurrent_writes_all_land(store: RunStore) -> None:
    """A hundred tasks writing at once all get their runs, steps and events stored."""

    async def writer(i: int) -> None:
        rid = f"run-{i:03d}"
        await store.create_run(run(rid, created=float(i)))
        await store.put_step(StepRecord(rid, "s", "s", status="succeeded"))
        await store.add_event(rid, {"type": "done", "i": i})

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            for i in range(100):
                nursery.start_soon(writer, i)
    runs = await store.list_runs(limit=None)
    assert [r.run_id for r in runs] == [f"run-{i:03d}" for i in reversed(range(100))]
    assert sql(store, "SELECT count(*) FROM steps") == [(100,)]
    assert sql(store, "SELECT count(*) FROM events") == [(100,)]
    assert store.statistics()["writes"] == 300


async def test_writer_waits_for_another_connections_write_lock(store: RunStore) -> None:
    """A write while another process holds the write lock waits for it instead of failing."""
    await store.create_run(run())
    other = sqlite3.connect(store.path, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")
        other.execute("UPDATE runs SET error = 'other' WHERE run_id = 'r1'")
        with trio.fail_after(LIMIT):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(store.add_event, "r1", {"type": "x"})
                await trio.testing.wait_all_tasks_blocked()
                # the store cannot have committed while the lock is held
                assert other.execute("SELECT count(*) FROM events").fetchone() == (0,)
                other.execute("COMMIT")
    finally:
        other.close()
    assert await store.events("r1") == [{"type": "x"}]
    assert (await store.get_run("r1")).error == "other"


async def test_write_lock_held_too_long_is_a_store_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When another process keeps the write lock past the busy timeout, StoreError says busy."""
    monkeypatch.setattr(_schema, "BUSY_TIMEOUT_MS", 50)
    async with open_run_store(tmp_path) as s:
        await s.create_run(run())
        other = sqlite3.connect(s.path, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            with trio.fail_after(LIMIT), pytest.raises(StoreError, match=r"busy.*0\.05 s"):
                await s.add_event("r1", {"type": "x"})
        finally:
            other.close()
        # the store is usable again once the lock is gone
        await s.add_event("r1", {"type": "y"})
        assert await s.events("r1") == [{"type": "y"}]


def block_store_blob(
    monkeypatch: pytest.MonkeyPatch, *, at_call: int
) -> tuple[trio.Event, threading.Event]:
    """Make the ``at_call``-th blob write (on the store's thread) set the returned trio event,
    then wait for the returned threading event before it goes on."""
    entered = trio.Event()
    release = threading.Event()
    real = _sql.store_blob
    calls = 0

    def blocking_store_blob(conn: sqlite3.Connection, digest: str, data: bytes) -> None:
        nonlocal calls
        calls += 1
        if calls == at_call:
            trio.from_thread.run_sync(entered.set)
            assert release.wait(LIMIT)
        real(conn, digest, data)

    monkeypatch.setattr(_sql, "store_blob", blocking_store_blob)
    return entered, release


async def test_cancel_during_a_write_finishes_it(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelling a write whose thread is running lets it finish whole; the store stays usable."""
    await store.create_run(run())
    changes = [StoredChange(f"f{i}", "write", f"content {i}".encode()) for i in range(5)]
    entered, release = block_store_blob(monkeypatch, at_call=2)
    scope = trio.CancelScope()
    ended = False

    async def write() -> None:
        nonlocal ended
        with scope:
            await store.put_changes("r1", "s", changes, diff="diff")
            await trio.lowlevel.checkpoint()
        ended = True

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(write)
            await entered.wait()
            scope.cancel()
            await trio.testing.wait_all_tasks_blocked()
            # the cancelled call still waits for its thread rather than abandoning it
            assert not ended
            release.set()
    assert scope.cancelled_caught
    assert await store.changes("r1", "s") == changes
    assert await store.diff("r1", "s") == "diff"
    assert sql(store, "SELECT count(*) FROM blobs") == [(5,)]


async def test_cancel_while_waiting_for_the_store_writes_nothing(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write cancelled while it waits its turn behind another call never happens."""
    await store.create_run(run())
    entered, release = block_store_blob(monkeypatch, at_call=1)
    scope = trio.CancelScope()

    async def queued() -> None:
        with scope:
            await store.add_event("r1", {"type": "never"})

    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            first = [StoredChange("a", "write", b"x")]
            nursery.start_soon(functools.partial(store.put_changes, "r1", "s", first, diff="d"))
            await entered.wait()
            nursery.start_soon(queued)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
            release.set()
    assert scope.cancelled_caught
    assert await store.events("r1") == []
    assert [c.path for c in await store.changes("r1", "s")] == ["a"]


async def test_error_in_the_middle_of_a_write_rolls_it_back(
    store: RunStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure halfway through replacing a change set leaves the old set and blobs intact."""
    await store.create_run(run())
    old = [StoredChange("keep", "write", b"old content")]
    await store.put_changes("r1", "s", old, diff="old diff")
    real = _sql.store_blob
    calls = 0

    def failing_store_blob(conn: sqlite3.Connection, digest: str, data: bytes) -> None:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("disk on fire")
        real(conn, digest, data)

    monkeypatch.setattr(_sql, "store_blob", failing_store_blob)
    new = [StoredChange(f"n{i}", "write", f"new {i}".encode()) for i in range(3)]
    with pytest.raises(RuntimeError, match="disk on fire"):
        await store.put_changes("r1", "s", new, diff="new diff")
    assert await store.changes("r1", "s") == old
    assert await store.diff("r1", "s") == "old diff"
    assert sql(store, "SELECT data FROM blobs") == [(b"old content",)]
    # the connection is not left inside a transaction
    monkeypatch.setattr(_sql, "store_blob", real)
    await store.put_changes("r1", "s", new, diff="new diff")
    assert await store.changes("r1", "s") == new


# --------------------------------------------------------------------------- migrations

# The schema of version 1 as that release created it, written out by hand (not through the
# migration code) so that a change to migration 1 cannot go unnoticed here.
V1_SCHEMA = """
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY NOT NULL, kind TEXT NOT NULL, status TEXT NOT NULL,
    created REAL NOT NULL, finished REAL, cwd TEXT NOT NULL, pipeline TEXT,
    pipeline_digest TEXT, inputs TEXT NOT NULL, options TEXT NOT NULL, result TEXT,
    error TEXT, applied REAL);
CREATE INDEX runs_created ON runs (created);
CREATE TABLE steps (
    seq INTEGER PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    key TEXT NOT NULL, step TEXT NOT NULL, instance TEXT, agent TEXT, status TEXT NOT NULL,
    attempt INTEGER NOT NULL, started REAL, finished REAL, session_id TEXT, result TEXT,
    value TEXT, value_stored INTEGER NOT NULL, error TEXT, cause TEXT, usage TEXT,
    UNIQUE (run_id, key));
CREATE TABLE blobs (digest TEXT PRIMARY KEY NOT NULL, size INTEGER NOT NULL, data BLOB NOT NULL);
CREATE TABLE change_sets (
    run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE, key TEXT NOT NULL,
    diff TEXT NOT NULL, own_diff TEXT NOT NULL, PRIMARY KEY (run_id, key));
CREATE TABLE changes (
    run_id TEXT NOT NULL, key TEXT NOT NULL, seq INTEGER NOT NULL, path TEXT NOT NULL,
    kind TEXT NOT NULL, blob TEXT REFERENCES blobs (digest), mode INTEGER, base_digest TEXT,
    PRIMARY KEY (run_id, key, path),
    FOREIGN KEY (run_id, key) REFERENCES change_sets (run_id, key) ON DELETE CASCADE);
CREATE INDEX changes_blob ON changes (blob);
CREATE TABLE transcripts (
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    source TEXT NOT NULL, line BLOB NOT NULL);
CREATE INDEX transcripts_run ON transcripts (run_id, source, id);
CREATE TABLE permissions (
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    key TEXT NOT NULL, record TEXT NOT NULL);
CREATE INDEX permissions_run ON permissions (run_id, key, id);
CREATE TABLE conflicts (
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    key TEXT NOT NULL, record TEXT NOT NULL);
CREATE INDEX conflicts_run ON conflicts (run_id, id);
INSERT INTO runs VALUES ('old-run', 'prompt', 'succeeded', 10.0, 11.0, '/ws', NULL, NULL,
    '{"text":"hi"}', '{}', '{"ok":true}', NULL, NULL);
INSERT INTO steps (run_id, key, step, status, attempt, value_stored)
    VALUES ('old-run', 'turn', 'turn', 'succeeded', 1, 0);
PRAGMA user_version = 1;
"""


def make_db(path: Path, script: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path)
    try:
        conn.executescript(script)
    finally:
        conn.close()


async def test_migrates_a_version_1_database(tmp_path: Path) -> None:
    """A version-1 file is migrated on open, keeping its runs and gaining the newer tables."""
    make_db(tmp_path / STORE_FILENAME, V1_SCHEMA)
    async with open_run_store(tmp_path) as s:
        assert s.migrated_from == 1
        assert s.statistics()["migratedFrom"] == 1
        old = await s.get_run("old")
        assert (old.run_id, old.inputs, old.result) == ("old-run", {"text": "hi"}, {"ok": True})
        assert [st.key for st in await s.steps("old-run")] == ["turn"]
        await s.add_event("old-run", {"type": "applied"})
        assert await s.events("old-run") == [{"type": "applied"}]
    assert sql(s, "PRAGMA user_version") == [(SCHEMA_VERSION,)]
    assert sql(s, "PRAGMA journal_mode") == [("wal",)]
    # reopening an up-to-date file migrates nothing
    async with open_run_store(tmp_path) as again:
        assert again.migrated_from == SCHEMA_VERSION


async def test_migration_keeps_earlier_applies_without_their_keys(tmp_path: Path) -> None:
    """A run applied before applies were recorded gets one of that time, its keys unknown."""
    applied = V1_SCHEMA + "UPDATE runs SET applied = 12.5 WHERE run_id = 'old-run';"
    make_db(tmp_path / STORE_FILENAME, applied)
    async with open_run_store(tmp_path) as s:
        assert await s.applies("old-run") == [ApplyRecord("old-run", None, 12.5)]
        await s.add_apply(ApplyRecord("old-run", ("(final)",), 20.0))
        await s.add_apply(ApplyRecord("old-run", ("(final)",), 30.0, "agent/x", "c0ffee"))
        # a git branch leaves the workspace, and so the run's applied time, alone
        assert (await s.get_run("old-run")).applied == 20.0
        assert [a.git_branch for a in await s.applies("old-run")] == [None, None, "agent/x"]
        await s.delete_run("old-run")
    assert sql(s, "SELECT count(*) FROM applies") == [(0,)]


# Version 3 as that release created it: version 1, the run timeline (v2) and applies (v3).
V3_SCHEMA = (
    V1_SCHEMA.replace("PRAGMA user_version = 1;", "")
    + """
CREATE TABLE events (
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    record TEXT NOT NULL);
CREATE INDEX events_run ON events (run_id, id);
CREATE INDEX runs_status_created ON runs (status, created);
CREATE TABLE applies (
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL REFERENCES runs (run_id) ON DELETE CASCADE,
    keys TEXT, at REAL NOT NULL, git_branch TEXT, git_commit TEXT);
CREATE INDEX applies_run ON applies (run_id, id);
INSERT INTO steps (run_id, key, step, status, attempt, value_stored, error, cause)
    VALUES ('old-run', 'boom', 'boom', 'failed', 2, 0, 'ValueError: no', 'raised');
INSERT INTO events (run_id, record) VALUES ('old-run', '{"type":"step_failed"}');
INSERT INTO applies (run_id, keys, at) VALUES ('old-run', '["(final)"]', 12.5);
PRAGMA user_version = 3;
"""
)


async def test_migrates_a_version_3_database(tmp_path: Path) -> None:
    """A version-3 file gains step tracebacks on open; its rows are kept, with none."""
    make_db(tmp_path / STORE_FILENAME, V3_SCHEMA)
    async with open_run_store(tmp_path) as s:
        assert s.migrated_from == 3
        turn, boom = await s.steps("old-run")
        assert (turn.key, turn.status, turn.traceback) == ("turn", "succeeded", None)
        assert (boom.key, boom.status, boom.attempt) == ("boom", "failed", 2)
        assert (boom.error, boom.cause, boom.traceback) == ("ValueError: no", "raised", None)
        assert await s.events("old-run") == [{"type": "step_failed"}]
        assert await s.applies("old-run") == [ApplyRecord("old-run", ("(final)",), 12.5)]
        trace = "Traceback (most recent call last):\nValueError: no\n"
        await s.put_step(attrs.evolve(boom, traceback=trace))
        assert [st.traceback for st in await s.steps("old-run")] == [None, trace]
        # v6: runs gain the batch they belong to, none for the old ones
        assert (await s.get_run("old-run")).parent is None
        child = attrs.evolve(await s.get_run("old-run"), run_id="child-run", parent="old-run")
        await s.create_run(child)
        assert (await s.get_run("child-run")).parent == "old-run"
    assert sql(s, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


# Version 6 as that release created it: version 3, step tracebacks (v4), error kinds (v5) and
# a run's batch (v6).
V6_SCHEMA = (
    V3_SCHEMA.replace("PRAGMA user_version = 3;", "")
    + """
ALTER TABLE steps ADD COLUMN traceback TEXT;
ALTER TABLE steps ADD COLUMN error_kind TEXT;
ALTER TABLE runs ADD COLUMN parent TEXT;
CREATE INDEX runs_parent ON runs (parent) WHERE parent IS NOT NULL;
UPDATE steps SET agent = 'claude', session_id = 'sess-1' WHERE key = 'turn';
INSERT INTO blobs VALUES ('d1', 3, X'6e6577');
INSERT INTO change_sets VALUES ('old-run', 'turn', 'diff', 'own diff');
INSERT INTO changes VALUES ('old-run', 'turn', 0, 'a.txt', 'write', 'd1', NULL, NULL);
PRAGMA user_version = 6;
"""
)


async def test_migrates_a_version_6_database(tmp_path: Path) -> None:
    """A version-6 file gains what a replay needs on open: its runs have no pipeline text, no
    sessions per attempt and no own changes, and take them from then on."""
    make_db(tmp_path / STORE_FILENAME, V6_SCHEMA)
    async with open_run_store(tmp_path) as s:
        assert s.migrated_from == 6
        assert await s.pipeline_source("old-run") is None
        assert await s.sessions("old-run") == []
        assert await s.own_changes("old-run", "turn") == []
        assert [c.data for c in await s.changes("old-run", "turn")] == [b"new"]
        assert await s.own_diff("old-run", "turn") == "own diff"
        turn = (await s.steps("old-run"))[0]
        assert (turn.agent, turn.session_id) == ("claude", "sess-1")
        session = SessionRecord("old-run", "turn", 1, "claude", "claude", "sess-1")
        await s.put_session(session)
        assert await s.sessions("old-run") == [session]
        own = [StoredChange("a.txt", "write", b"new", 0o100644)]
        await s.put_changes("old-run", "turn", [], diff="", own=own)
        assert await s.own_changes("old-run", "turn") == own
        await s.create_run(run("new-run"), pipeline_source="text")
        assert await s.pipeline_source("new-run") == "text"
    assert sql(s, "PRAGMA user_version") == [(SCHEMA_VERSION,)]


async def test_migrates_a_version_0_database(tmp_path: Path) -> None:
    """An existing SQLite file at version 0 (no tables yet) gets the whole schema."""
    make_db(tmp_path / STORE_FILENAME, "PRAGMA user_version = 0;")
    async with open_run_store(tmp_path) as s:
        assert s.migrated_from == 0
        await s.create_run(run())
        assert [r.run_id for r in await s.list_runs()] == ["r1"]


async def test_failed_migration_leaves_the_old_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A migration that fails rolls back every migration of that open; the file keeps v1."""
    make_db(tmp_path / STORE_FILENAME, V1_SCHEMA)

    def broken(conn: sqlite3.Connection) -> None:
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("migration bug")

    monkeypatch.setattr(_schema, "MIGRATIONS", (*_schema.MIGRATIONS, broken))
    monkeypatch.setattr(_schema, "SCHEMA_VERSION", len(_schema.MIGRATIONS) + 1)
    with pytest.raises(RuntimeError, match="migration bug"):
        await RunStore.open(tmp_path)
    conn = sqlite3.connect(tmp_path / STORE_FILENAME)
    try:
        assert conn.execute("PRAGMA user_version").fetchone() == (1,)
        tables = {name for (name,) in conn.execute("SELECT name FROM sqlite_master")}
        assert "events" not in tables
        assert "half_done" not in tables
    finally:
        conn.close()


async def test_newer_database_is_refused_untouched(tmp_path: Path) -> None:
    """A file from a newer release raises StoreVersionError and is not modified."""
    path = tmp_path / STORE_FILENAME
    make_db(path, "CREATE TABLE future (x); PRAGMA user_version = 99;")
    before = path.read_bytes()
    with pytest.raises(StoreVersionError, match=r"schema version 99.*newer release") as info:
        await RunStore.open(tmp_path)
    assert isinstance(info.value, StoreError)
    assert str(path) in str(info.value)
    assert path.read_bytes() == before
    assert not (tmp_path / (STORE_FILENAME + "-wal")).exists()
