"""Huge files: a limit on a changed file, content streamed, nothing applied that is not recorded.

Hostile agents are scripted subprocesses: one sends ``fs/write_text_file`` with more than the
limit, one grows a file on disk itself. The run store is made to refuse what a run records
(SQLite's own limit on a value, or a write that fails). Memory is measured in a subprocess of
its own, with ``ru_maxrss``.
"""

from __future__ import annotations

import os
import shlex
import sqlite3
import stat
import subprocess
import sys
import textwrap
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import orjson
import pytest
import trio
from run_helpers import as_json, config, run_cli, snapshot, spec_for, workspace

from orchestrator._sizes import MAX_FILE_SIZE_CEILING, format_size, parse_size
from orchestrator.config import Config
from orchestrator.errors import StoreError, UsageError
from orchestrator.pipeline import Pipeline, step
from orchestrator.pipeline.branches import FINAL
from orchestrator.runs import prompt, run_pipeline
from orchestrator.store import ChangeEntry, RunRecord, RunStore, StoredChange, open_run_store
from orchestrator.store import runstore as runstore_module
from orchestrator.store._schema import connect
from orchestrator.testing import (
    AgentScript,
    Say,
    Turn,
    WriteDisk,
    WriteFile,
    scripted_agent_command,
)
from orchestrator.vfs import Branch, FileTooLarge, ModeChange, Workspace, materialize
from orchestrator.vfs import workdir as workdir_module
from orchestrator.vfs._fileio import LARGE_FILE_SIZE
from orchestrator.vfs.export import git_patch, large_paths, unified_diff
from orchestrator.vfs.testing import make_tree
from orchestrator.vfs.tree import MemoryTree

LIMIT = 60.0  # seconds a run here may take (its agents are Python subprocesses)
MiB = 2**20


def events(record: Path) -> list[dict[str, Any]]:
    """What a scripted agent recorded."""
    return [orjson.loads(line) for line in record.read_bytes().splitlines() if line.strip()]


async def stored_run(state: Path) -> RunRecord:
    """The one run recorded in ``state``."""
    async with open_run_store(state) as store:
        [run] = await store.list_runs()
    return run


# --------------------------------------------------------------------------- sizes


def test_sizes_are_read_as_people_write_them() -> None:
    """A size is bytes or a number with K, M or G (powers of 1024); nonsense is refused."""
    assert parse_size(2048) == 2048
    assert parse_size("2048") == 2048
    assert parse_size("1M") == MiB
    assert parse_size("1.5k") == 1536
    assert parse_size("100MiB") == 100 * MiB
    assert format_size(512) == "512 bytes" and format_size(2 * MiB) == "2.0 MiB"
    for bad in ("", "12Q", "-1", "0", "1e3", "nan"):
        with pytest.raises(ValueError, match="size"):
            parse_size(bad)
    with pytest.raises(ValueError, match="the largest file the run store keeps"):
        parse_size("1G")  # over what one SQLite value holds
    assert parse_size(MAX_FILE_SIZE_CEILING) == MAX_FILE_SIZE_CEILING
    with pytest.raises(TypeError):
        parse_size(True)


def test_config_limits_take_a_file_size() -> None:
    """``[limits] max_file_size`` takes bytes or "2M"; a bad value names the file and key."""
    cfg = Config.from_toml('[limits]\nmax_file_size = "2M"\n', source="p.toml")
    assert cfg.max_file_size == 2 * MiB
    assert Config.from_toml("[limits]\nmax_file_size = 4096\n").max_file_size == 4096
    with pytest.raises(UsageError, match=r"p\.toml: limits\.max_file_size: .*not a size"):
        Config.from_toml('[limits]\nmax_file_size = "lots"\n', source="p.toml")


def test_an_untrusted_project_file_may_lower_the_file_size_limit_but_not_raise_it() -> None:
    """The limit bounds what a hostile agent can make: a file not trusted only lowers it."""
    lower = Config.from_toml('[limits]\nmax_file_size = "1M"\n', source="p.toml", trusted=False)
    assert lower.max_file_size == MiB and lower.ignored == ()
    higher = Config.from_toml('[limits]\nmax_file_size = "900M"\n', source="p.toml", trusted=False)
    assert higher.max_file_size is None
    assert higher.ignored == ("p.toml: limits.max_file_size",)


def test_a_step_takes_its_own_file_size_limit() -> None:
    """``@step(max_file_size=...)`` is checked when declared and shown in the graph."""

    @step(agent="demo", max_file_size="3M")
    def big(text: str) -> str:
        return text

    assert big.max_file_size == 3 * MiB
    node = Pipeline.from_steps([big]).to_json()["nodes"][0]
    assert node["maxFileSize"] == 3 * MiB
    with pytest.raises(UsageError, match="step 'bad': max_file_size"):

        @step(agent="demo", max_file_size="huge")
        def bad(text: str) -> str:
            return text


# --------------------------------------------------------------------------- the working directory


def test_a_write_over_the_limit_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    """Workdir.write refuses content over the limit: no file, no temporary file, no change."""
    root = make_tree(tmp_path / "ws", {"a.txt": "a\n"})
    branch = Branch.from_tree(Workspace.open(root).snapshot(), "b")
    wd = materialize(branch, tmp_path / "b", max_file_size=10)
    with pytest.raises(FileTooLarge) as caught:
        wd.write("big.txt", b"x" * 11)
    assert caught.value.files == (("big.txt", 11),) and caught.value.limit == 10
    assert str(caught.value) == (
        "big.txt is 11 bytes (11 bytes), over the limit of 10 bytes (10 bytes) on a changed "
        "file; not recorded"
    )
    assert sorted(os.listdir(wd.root)) == ["a.txt"]
    assert not branch.changes
    wd.write("ok.txt", b"x" * 10)
    assert branch.read("ok.txt") == b"x" * 10


def test_a_harvest_leaves_out_a_file_over_the_limit_without_reading_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file on disk over the limit is listed, never read, and not recorded until it shrinks."""
    root = make_tree(tmp_path / "ws", {"a.txt": "a\n"})
    branch = Branch.from_tree(Workspace.open(root).snapshot(), "b")
    wd = materialize(branch, tmp_path / "b", max_file_size=1024)
    big = Path(wd.root, "out", "big.bin")
    big.parent.mkdir()
    big.write_bytes(b"\0" * 4096)
    read = workdir_module._read_state

    def refuse_big(full: str, limit: int | None = None) -> Any:
        assert not full.endswith("big.bin") or os.path.getsize(full) <= 1024, "read whole"
        return read(full, limit)

    monkeypatch.setattr(workdir_module, "_read_state", refuse_big)
    Path(wd.root, "a.txt").write_text("b\n")
    report = wd.harvest(full=True)
    assert report.too_large == ("out/big.bin",) and report.modified == ("a.txt",)
    assert wd.too_large == {"out/big.bin": 4096}
    assert not branch.exists("out/big.bin")
    error = wd.too_large_error()
    assert isinstance(error, FileTooLarge) and error.paths == ("out/big.bin",)
    assert wd.harvest().too_large == ("out/big.bin",)  # still there, judged once
    big.write_bytes(b"\0" * 100)
    report = wd.harvest()
    assert report.added == ("out/big.bin",) and report.too_large == ()
    assert wd.too_large_error() is None
    big.write_bytes(b"\0" * 2048)
    assert wd.harvest().too_large == ("out/big.bin",)
    assert branch.read("out/big.bin") == b"\0" * 100  # the branch keeps what fitted
    big.unlink()
    report = wd.harvest()
    assert report.too_large == () and wd.too_large == {}


def test_a_large_file_of_the_branch_touched_or_chmodded_is_no_change_of_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A workspace file over the limit whose stat changes is hashed as it streams, never held:
    same content is no change, a new mode is a mode change."""
    root = make_tree(tmp_path / "ws", {"data.bin": "d" * 4096})
    old = time.time() - 3600
    os.utime(root / "data.bin", (old, old))
    branch = Branch.from_tree(Workspace.open(root).snapshot(), "b")
    wd = materialize(branch, tmp_path / "b", max_file_size=1024)

    def never(full: str, limit: int | None = None) -> Any:
        raise AssertionError(f"{full} read whole")

    monkeypatch.setattr(workdir_module, "_read_state", never)
    copy = Path(wd.root, "data.bin")
    os.utime(copy, None)
    report = wd.harvest(full=True)
    assert not report.changed and report.too_large == ()
    copy.chmod(0o755)
    report = wd.harvest(full=True)
    assert report.mode_changed == ("data.bin",) and report.too_large == ()
    assert branch.changes["data.bin"] == ModeChange(0o100755)
    with copy.open("r+b") as f:
        f.write(b"e")
    assert wd.harvest(full=True).too_large == ("data.bin",)
    assert branch.changes["data.bin"] == ModeChange(0o100755)


# --------------------------------------------------------------------------- diffs and patches


def test_the_diff_of_a_large_file_gives_its_sizes_and_the_patch_leaves_it_out() -> None:
    """A file over LARGE_FILE_SIZE is not diffed line by line: the diff says so with its sizes;
    a binary one says "Binary files differ"; the patch leaves the large one out."""
    base = MemoryTree.from_files({"old.txt": b"a\n"})
    big = b"line\n" * (LARGE_FILE_SIZE // 5 + 1)
    changes = {
        "big.txt": Branch.from_tree(base, "x").write("big.txt", big),
        "pic.png": Branch.from_tree(base, "y").write("pic.png", b"\x89PNG\0\0"),
    }
    assert all(c is not None for c in changes.values())
    diff = unified_diff(base, changes)  # type: ignore[arg-type]
    size = format_size(len(big))
    assert f"Large files /dev/null and b/big.txt differ (none -> {size}; files over 8.0 MiB" in diff
    assert "Binary files /dev/null and b/pic.png differ" in diff
    assert "+line" not in diff
    assert large_paths(base, changes) == ("big.txt",)  # type: ignore[arg-type]
    patch = git_patch(base, changes)  # type: ignore[arg-type]
    assert b"big.txt" not in patch and b"pic.png" in patch


# --------------------------------------------------------------------------- the run store


async def test_large_content_goes_to_the_store_in_pieces_and_back_whole(tmp_path: Path) -> None:
    """A content larger than one piece is stored once and read back exactly; a listing of the
    change set gives sizes and link targets without the contents."""
    data = os.urandom(3 * MiB + 17)
    async with open_run_store(tmp_path) as store:
        await store.create_run(RunRecord("r", "prompt", "running", time.time(), "/"))
        changes = [
            StoredChange("big.bin", "write", data),
            StoredChange("link", "write", b"big.bin", stat.S_IFLNK | 0o777),
        ]
        await store.put_changes("r", "s", changes, diff="")
        await store.put_changes("r", FINAL, changes[:1], diff="")
        back = await store.changes("r", "s")
        assert [c.data for c in back] == [data, b"big.bin"]
        assert await store.change_entries("r", "s") == [
            ChangeEntry("big.bin", "write", None, None, len(data), None),
            ChangeEntry("link", "write", stat.S_IFLNK | 0o777, None, 7, b"big.bin"),
        ]
        await store.delete_run("r")


# --------------------------------------------------------------------------- hostile agents


async def test_an_fs_write_over_the_limit_is_refused_and_the_turn_goes_on(tmp_path: Path) -> None:
    """fs/write_text_file over the limit gets -32602 naming the file, its size and the limit;
    nothing is written and the agent's turn goes on (the run succeeds with what fitted)."""
    ws = workspace(tmp_path, {"a.txt": "hello\n"})
    record = tmp_path / "writer.jsonl"
    script = AgentScript(
        record_path=str(record),
        turns=(
            Turn(
                steps=(
                    WriteFile("big.txt", "x" * 4096),
                    WriteFile("small.txt", "ok\n"),
                    Say("done"),
                )
            ),
        ),
    )
    spec = spec_for(script, tmp_path, "writer")
    with trio.fail_after(LIMIT):
        run = await prompt(
            spec, "write", cwd=ws, config=config(spec), max_file_size="1K", apply=True
        )
    big, small = [e for e in events(record) if e["event"] == "fs_write"]
    error = big["error"]
    assert error["code"] == -32602
    assert error["message"].endswith(
        "big.txt: 4.0 KiB (4096 bytes) is over the limit of 1.0 KiB (1024 bytes) on a changed "
        "file; nothing was written"
    )
    assert error["data"]["size"] == 4096 and error["data"]["limit"] == 1024
    assert "result" in small
    assert run.status == "succeeded" and run.turn.stop_reason == "end_turn"
    assert [(c.path, c.change) for c in run.changes] == [("small.txt", "added")]
    assert snapshot(ws) == {"a.txt": b"hello\n", "small.txt": b"ok\n"}


async def test_a_file_grown_on_disk_over_the_limit_fails_the_run_and_applies_nothing(
    tmp_path: Path, state_dir: Path
) -> None:
    """An agent that writes a 2 MiB file into its cwd under a 1 MiB limit: exit 1 naming the
    file, its size and the limit; --apply writes nothing; the run is recorded failed."""
    ws = workspace(tmp_path, {"a.txt": "hello\n"})
    before = snapshot(ws)
    script = AgentScript(
        turns=(
            Turn(
                steps=(
                    WriteDisk("a.txt", "changed\n"),
                    WriteDisk("data/big.bin", "x" * (2 * MiB)),
                    Say("done"),
                )
            ),
        )
    )
    agent = "grower=" + shlex.join(scripted_agent_command(script, tmp_path))
    args = ("--agent", agent, "--cwd", str(ws), "--apply", "--max-file-size", "1M")
    done = await run_cli("prompt", *args, "--json", "grow", cwd=tmp_path, state=state_dir)
    assert done.returncode == 1, done.stderr.decode()
    message = as_json(done)["error"]["message"]
    assert message == (
        "data/big.bin is 2.0 MiB (2097152 bytes), over the limit of 1.0 MiB (1048576 bytes) "
        "on a changed file; not recorded"
    )
    assert done.stderr.decode().count("orchestrator: error:") == 1
    assert snapshot(ws) == before
    run = await stored_run(state_dir)
    assert run.status == "failed" and run.applied is None
    shown = as_json(await run_cli("show", run.run_id, "--json", cwd=tmp_path, state=state_dir))
    [instance] = shown["steps"]["prompt"]["instances"].values()
    assert instance["status"] == "failed" and "data/big.bin" in instance["error"]
    assert shown["changes"] == []


async def test_a_step_limit_replaces_the_run_limit(tmp_path: Path) -> None:
    """``@step(max_file_size=...)`` lets one step keep a file the run's limit would refuse."""
    ws = workspace(tmp_path, {"a.txt": "hello\n"})
    script = AgentScript(turns=(Turn(steps=(WriteDisk("big.bin", "x" * 4096), Say("done"))),))
    spec = spec_for(script, tmp_path, "grower")

    @step(agent="grower", max_file_size="8K")
    def grow(task: str) -> str:
        return task

    with trio.fail_after(LIMIT):
        outcome = await run_pipeline(
            Pipeline.from_steps([grow]),
            {"task": "grow"},
            cwd=ws,
            config=config(spec),
            max_file_size=1024,
            apply=True,
        )
    assert outcome.status == "succeeded"
    assert (ws / "big.bin").stat().st_size == 4096


# --------------------------------------------------------------------------- recorded, then applied


def limited_store(monkeypatch: pytest.MonkeyPatch, max_value: int) -> None:
    """Have every run store refuse a value (a blob, a text) larger than ``max_value`` bytes, as
    SQLite refuses one over its limit (1 GB by default)."""

    def limited(path: Path, opened: list[sqlite3.Connection]) -> int:
        version = connect(path, opened)
        opened[0].setlimit(sqlite3.SQLITE_LIMIT_LENGTH, max_value)
        return version

    monkeypatch.setattr(runstore_module, "connect", limited)


def writer_of(tmp_path: Path, files: Mapping[str, str]) -> Any:
    """An agent that writes ``files`` into its cwd itself."""
    steps = tuple(WriteDisk(path, text) for path, text in files.items())
    return spec_for(AgentScript(turns=(Turn(steps=(*steps, Say("done"))),)), tmp_path, "writer")


async def test_changes_the_store_refuses_fail_the_run_and_nothing_is_applied(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses the content of a change (SQLite's limit on a value): the run fails with
    that reason, recorded, and --apply writes nothing."""
    ws = workspace(tmp_path, {"a.txt": "hello\n"})
    before = snapshot(ws)
    spec = writer_of(tmp_path, {"a.txt": "changed\n", "big.txt": "x" * (512 * 1024)})
    limited_store(monkeypatch, 256 * 1024)
    with trio.fail_after(LIMIT), pytest.raises(StoreError) as caught:
        await prompt(spec, "write", cwd=ws, config=config(spec), apply=True)
    assert "recording the changes of prompt failed" in str(caught.value)
    assert "string or blob too big" in str(caught.value)
    assert snapshot(ws) == before
    run = await stored_run(state_dir)
    assert run.status == "failed" and run.applied is None
    assert run.error is not None and "string or blob too big" in run.error


async def test_a_transcript_the_store_refuses_fails_the_run_before_anything_is_applied(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run's record is whole before the apply: a transcript the store refuses fails the run
    and nothing is written."""
    ws = workspace(tmp_path, {"a.txt": "hello\n"})
    before = snapshot(ws)
    spec = writer_of(tmp_path, {"a.txt": "changed\n"})

    async def refuse(self: RunStore, run_id: str, source: str, lines: Sequence[Any]) -> None:
        raise StoreError("the disk is full")

    monkeypatch.setattr(RunStore, "add_transcript", refuse)
    with trio.fail_after(LIMIT), pytest.raises(StoreError, match="the disk is full"):
        await prompt(
            spec, "write", cwd=ws, config=config(spec), apply=True, transcript=tmp_path / "t.jsonl"
        )
    assert snapshot(ws) == before
    run = await stored_run(state_dir)
    assert run.status == "failed" and run.applied is None
    assert run.error is not None and "the disk is full" in run.error


async def test_final_changes_the_store_refuses_fail_the_run_and_nothing_is_applied(
    tmp_path: Path, state_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recording the run's final change set fails: the run fails with the reason, unapplied."""
    ws = workspace(tmp_path, {"a.txt": "hello\n"})
    before = snapshot(ws)
    spec = writer_of(tmp_path, {"a.txt": "changed\n"})
    put_changes = RunStore.put_changes

    async def refuse_final(self: RunStore, run_id: str, key: str, *a: Any, **kw: Any) -> None:
        if key == FINAL:
            raise StoreError("the disk is full")
        await put_changes(self, run_id, key, *a, **kw)

    monkeypatch.setattr(RunStore, "put_changes", refuse_final)
    with trio.fail_after(LIMIT), pytest.raises(StoreError, match="recording the run's changes"):
        await prompt(spec, "write", cwd=ws, config=config(spec), apply=True)
    assert snapshot(ws) == before
    run = await stored_run(state_dir)
    assert run.status == "failed" and run.applied is None
    assert run.error is not None and "the disk is full" in run.error


# --------------------------------------------------------------------------- memory

#: harvest a large file written into a branch directory, diff it, record it (a step's change
#: set and the run's final one), then apply it from the store in a fresh process; print the
#: growth of the peak resident size over each phase, in bytes
_MEASURE = textwrap.dedent(
    """
    import os, resource, sys, time
    from pathlib import Path
    import trio
    from orchestrator.pipeline._branchstate import branch_diffs
    from orchestrator.pipeline.branches import FINAL, stored_changes
    from orchestrator.runs import apply_run
    from orchestrator.store import RunRecord, open_run_store
    from orchestrator.vfs import Branch, Workspace, materialize

    phase, root, size = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    ws, state = root / "ws", root / "state"

    def peak():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    async def record(snap, net, run_diff, own_diff):
        async with open_run_store(state) as store:
            run = RunRecord("r", "prompt", "running", time.time(), str(ws))
            await store.create_run(run)
            changes = stored_changes(snap, net)
            await store.put_changes("r", "prompt", changes, diff=run_diff, own_diff=own_diff)
            await store.put_changes("r", FINAL, changes, diff=run_diff)
            await store.update_run("r", status="succeeded", finished=time.time())

    if phase == "record":
        ws.mkdir()
        (ws / "README").write_text("hi\\n")
        snap = Workspace.open(ws).snapshot()
        branch = Branch.from_tree(snap, "prompt")
        workdir = materialize(branch, root / "branch", max_file_size=2 * size)
        block = (b"y" * 63 + b"\\n") * (1 << 14)
        with open(os.path.join(workdir.root, "big.txt"), "wb") as f:
            for _ in range(size // len(block)):
                f.write(block)
        before = peak()
        workdir.harvest(full=True)
        net, run_diff, own_diff = branch_diffs(branch)
        trio.run(record, snap, net, run_diff, own_diff)
        print("grown", peak() - before)
    else:
        async def main():
            before = peak()
            outcome = await apply_run("r", state_dir=state)
            assert outcome.written == ("big.txt",)
            print("grown", peak() - before)

        trio.run(main)
    """
)


def test_a_large_file_is_harvested_recorded_and_applied_without_copies(tmp_path: Path) -> None:
    """Harvesting, diffing and recording a 200 MiB file, then applying it from the store, each
    grow the peak memory by less than 1.5 times the file's size (it is held once, not copied)."""
    size = 200 * MiB
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    grown = {}
    for phase in ("record", "apply"):
        done = subprocess.run(
            [sys.executable, "-c", _MEASURE, phase, str(tmp_path), str(size)],
            capture_output=True,
            env=env,
            check=False,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        [line] = [line for line in done.stdout.decode().splitlines() if line.startswith("grown ")]
        grown[phase] = int(line.split()[1])
    assert grown["record"] < 1.5 * size, grown
    assert grown["apply"] < 1.5 * size, grown
    assert (tmp_path / "ws" / "big.txt").stat().st_size == size
