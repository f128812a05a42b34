"""Branch directories of a run: small trees on the event loop, large ones in threads."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from conftest import bind_mount
from log_capture import capture_logs

from orchestrator.pipeline import _branchio
from orchestrator.pipeline._branchio import (
    INLINE_MAX_BYTES,
    INLINE_MAX_FILES,
    BranchDirs,
    BranchIO,
    is_small,
)
from orchestrator.pipeline._branchstate import state_of, undo_writes
from orchestrator.pipeline._supply import Decision, TreeUse
from orchestrator.vfs import Branch, Workdir, Workspace, materialize
from orchestrator.vfs._fileio import remove_tree
from orchestrator.vfs.pool import DirPool

LIMIT = 30.0


def _branch(root: Path, files: dict[str, bytes]) -> Branch:
    """A branch over a fresh workspace holding ``files``."""
    workspace = root / "workspace"
    for rel, data in files.items():
        path = workspace / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    workspace.mkdir(exist_ok=True)
    return Branch.from_tree(Workspace(str(workspace)).snapshot(), "b")


def test_small_means_few_files_and_few_bytes(tmp_path: Path) -> None:
    """A tree is small up to INLINE_MAX_FILES files and INLINE_MAX_BYTES bytes, counting writes."""
    few = _branch(tmp_path / "few", {f"f{i}.txt": b"x" for i in range(INLINE_MAX_FILES)})
    assert is_small(few)
    few.write("one-more.txt", b"y")
    assert not is_small(few)
    big = _branch(tmp_path / "big", {"big.bin": b"z" * (INLINE_MAX_BYTES + 1)})
    assert not is_small(big)
    written = _branch(tmp_path / "written", {"a.txt": b"a"})
    written.write("b.bin", b"w" * INLINE_MAX_BYTES)
    assert not is_small(written)


def test_files_written_by_the_steps_a_branch_forked_from_count(tmp_path: Path) -> None:
    """A large file written by a parent step makes its children's trees large too."""
    parent = _branch(tmp_path / "parent", {"a.txt": b"a"})
    assert is_small(parent.fork("unchanged-child"))
    parent.write("big.bin", b"x" * (INLINE_MAX_BYTES + 1))
    assert not is_small(parent.fork("child"))
    many = _branch(tmp_path / "many", {"a.txt": b"a"})
    for i in range(INLINE_MAX_FILES):
        many.write(f"gen/{i}.txt", b"g")
    assert not is_small(many.fork("child"))


@pytest.mark.parametrize("count", [2, INLINE_MAX_FILES * 3])
async def test_materialize_and_harvest_small_on_the_loop_large_in_a_thread(
    tmp_path: Path, count: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small trees are made and harvested in the loop's thread, large ones in a worker thread."""
    branch = _branch(tmp_path, {f"src/f{i}.py": b"print(%d)\n" % i for i in range(count)})
    seen: list[bool] = []
    original = materialize

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(threading.current_thread() is threading.main_thread())
        return original(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_branchio, "materialize", spy)
    io = BranchIO()
    dirs = BranchDirs(tmp_path / "run", io)
    with trio.fail_after(LIMIT):
        workdir = await dirs.materialize(branch, "step", 1)
        (Path(workdir.root) / "src" / "f0.py").write_text("print('changed')\n")
        await dirs.harvest(workdir)
        dirs.remove(workdir)
        await dirs.drain()
    assert seen == [count <= INLINE_MAX_FILES]
    assert branch.read("src/f0.py") == b"print('changed')\n"
    net, run_diff, _ = dirs.diffs(branch)
    assert list(net) == ["src/f0.py"] and "+print('changed')" in run_diff
    assert not Path(workdir.root).exists()
    assert io.counts["materialize"] == 1 and io.counts["harvest"] == 1
    assert io.critical_seconds > 0


async def test_small_directory_goes_at_once_without_the_trash(
    tmp_path: Path,
) -> None:
    """Removing a small directory deletes it at once, files and folders: no trash, no thread."""
    branch = _branch(tmp_path, {"a/b/c.txt": b"c", "d.txt": b"d"})
    io = BranchIO()
    dirs = BranchDirs(tmp_path / "run", io)
    with trio.fail_after(LIMIT):
        workdir = await dirs.materialize(branch, "step", 1)
        root = Path(workdir.root)
        dirs.remove(workdir)
        # files and folders are gone at once, and nothing went through the trash
        assert not root.exists() and not (tmp_path / "run" / "trash").exists()
        assert io.counts["remove"] == 1
        await dirs.drain()
    assert not root.exists()
    assert list((tmp_path / "run" / "branches").iterdir()) == []


async def test_a_directory_replaced_by_a_symlink_is_removed_not_followed(
    tmp_path: Path,
) -> None:
    """A small branch directory the agent replaced by a symlink to a directory elsewhere: the
    link goes, the directory it leads to keeps its files (nested ones and .git included)."""
    victim = tmp_path / "victim"
    (victim / "sub" / ".git").mkdir(parents=True)
    (victim / "a").write_text("keep\n")
    (victim / "sub" / "b").write_text("keep\n")
    (victim / "sub" / ".git" / "HEAD").write_text("ref\n")
    before = sorted(p.relative_to(victim) for p in victim.rglob("*"))
    branch = _branch(tmp_path, {"x.txt": b"x"})
    io = BranchIO()
    dirs = BranchDirs(tmp_path / "run", io)
    with trio.fail_after(LIMIT):
        workdir = await dirs.materialize(branch, "step", 1)
        shutil.rmtree(workdir.root)
        os.symlink(victim, workdir.root)
        dirs.remove(workdir)
        await dirs.drain()
    assert not os.path.lexists(workdir.root)
    assert sorted(p.relative_to(victim) for p in victim.rglob("*")) == before


async def test_directory_grown_large_is_left_whole_to_the_trash(tmp_path: Path) -> None:
    """A small branch whose directory filled up (dependencies) is removed in the background."""
    branch = _branch(tmp_path, {"package.json": b"{}"})
    io = BranchIO()
    dirs = BranchDirs(tmp_path / "run", io)
    with trio.fail_after(LIMIT):
        workdir = await dirs.materialize(branch, "step", 1)
        modules = Path(workdir.root) / "node_modules" / "dep"
        modules.mkdir(parents=True)
        for i in range(INLINE_MAX_FILES * 4):
            (modules / f"m{i}.js").write_text("x")
        assert _branchio._empty_small(workdir, 2 * INLINE_MAX_FILES) is False
        assert len(list(modules.iterdir())) == INLINE_MAX_FILES * 4  # nothing deleted
        dirs.remove(workdir)
        await dirs.drain()
    assert not Path(workdir.root).exists()
    assert io.counts["remove"] == 1


@pytest.mark.usefixtures("mounts_allowed")
async def test_a_mount_in_a_directory_is_left_alone_by_its_deletion(tmp_path: Path) -> None:
    """A directory elsewhere bind-mounted into a small branch directory (same device) is not
    emptied with it: the trash deletes the rest, leaves the mount and says so."""
    branch = _branch(tmp_path, {"a/b/c.txt": b"c", "d.txt": b"d"})
    outside = tmp_path / "precious"
    outside.mkdir()
    (outside / "keep.txt").write_text("keep\n")
    dirs = BranchDirs(tmp_path / "run", BranchIO())
    with trio.fail_after(LIMIT):
        workdir = await dirs.materialize(branch, "step", 1)
        with bind_mount(outside, Path(workdir.root) / "a"), capture_logs() as logs:
            dirs.remove(workdir)
            await dirs.drain()
            assert [p.name for p in outside.iterdir()] == ["keep.txt"]
            (trashed,) = (tmp_path / "run" / "trash").iterdir()
            assert [p.name for p in trashed.iterdir()] == ["a"]  # d.txt deleted
    warned = [entry for entry in logs if entry["log_level"] == "warning"]
    assert [(entry["directory"], entry["mounts"]) for entry in warned] == [
        (str(trashed), [str(trashed / "a")])
    ]


async def test_cancelled_step_makes_no_directory(tmp_path: Path) -> None:
    """A step cancelled before its small directory is made leaves nothing on disk."""
    branch = _branch(tmp_path, {"a.txt": b"a"})
    dirs = BranchDirs(tmp_path / "run", BranchIO())
    with trio.CancelScope() as scope:
        scope.cancel()
        await dirs.materialize(branch, "step", 1)
    assert scope.cancelled_caught
    assert not (tmp_path / "run" / "branches").exists()


def _large(root: Path, name: str = "w", files: int = INLINE_MAX_FILES + 4) -> Branch:
    """A branch whose tree is not small: its directory is made in a worker thread."""
    return _branch(root / name, {f"src/f{i}.txt": b"%04d\n" % i for i in range(files)})


class _Jobs:
    """Counts copy and delete jobs running at once (in worker threads)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.active = 0
        self.peak = 0
        self.gate = threading.Event()
        self.entered = 0
        self.k_inside = trio.Event()

    def run(self, k: int, work: Any) -> Any:
        with self.lock:
            self.active += 1
            self.peak = max(self.peak, self.active)
        try:
            trio.from_thread.run_sync(self._entered, k)
            self.gate.wait(LIMIT)
            return work()
        finally:
            with self.lock:
                self.active -= 1

    def _entered(self, k: int) -> None:
        self.entered += 1
        if self.entered == k:
            self.k_inside.set()


async def test_copies_and_deletions_share_one_budget_of_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never more than the budget's K copy or delete jobs run at once; the others queue."""
    k, count = 2, 6
    jobs = _Jobs()
    original_materialize, original_remove = materialize, remove_tree

    def fake_materialize(*args: Any, **kwargs: Any) -> Any:
        return jobs.run(k, lambda: original_materialize(*args, **kwargs))

    monkeypatch.setattr(_branchio, "materialize", fake_materialize)
    monkeypatch.setattr(
        _branchio, "remove_tree", lambda path: jobs.run(k, lambda: original_remove(path))
    )
    branches = [_large(tmp_path, f"w{i}") for i in range(count)]
    dirs = BranchDirs(
        tmp_path / "run",
        BranchIO(),
        limit=count,
        budget=trio.CapacityLimiter(k),
        copies=trio.CapacityLimiter(count),
    )

    async def one(branch: Branch) -> None:
        dirs.remove(await dirs.materialize(branch, branch.name, 1))

    with trio.fail_after(LIMIT):
        async with dirs.serving(), trio.open_nursery() as nursery:
            for branch in branches:
                nursery.start_soon(one, branch)
            await jobs.k_inside.wait()
            await trio.testing.wait_all_tasks_blocked()
            # K jobs run, the other materializations wait for the budget
            assert jobs.active == k
            assert dirs.budget.statistics().tasks_waiting == count - k
            jobs.gate.set()
    assert jobs.peak == k
    assert dirs.costs.made == count
    assert not any((tmp_path / "run").iterdir())  # every directory deleted


async def test_removed_directory_is_renamed_into_the_trash_and_deleted_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """remove() renames the directory into the trash at once; the deletion comes after."""
    gate = threading.Event()
    original = remove_tree

    def held(path: str) -> list[str]:
        gate.wait(LIMIT)
        return original(path)

    monkeypatch.setattr(_branchio, "remove_tree", held)
    dirs = BranchDirs(tmp_path / "run", BranchIO())
    trash = tmp_path / "run" / "trash"
    with trio.fail_after(LIMIT):
        async with dirs.serving():
            workdir = await dirs.materialize(_large(tmp_path), "step", 1)
            dirs.remove(workdir)
            assert not Path(workdir.root).exists()
            (entry,) = trash.iterdir()
            assert entry.name.startswith("step-1.") and (entry / "src" / "f0.txt").exists()
            gate.set()
    assert not trash.exists() and not (tmp_path / "run" / "branches").exists()


async def test_a_new_directory_waits_until_an_old_one_is_deleted(tmp_path: Path) -> None:
    """With ``limit`` directories on disk, the next materialization waits for a deletion."""
    files = INLINE_MAX_FILES + 4
    size = sum(len(b"%04d\n" % i) for i in range(files))
    dirs = BranchDirs(tmp_path / "run", BranchIO(), limit=2)
    made: list[Workdir] = []

    async def make(name: str) -> None:
        made.append(await dirs.materialize(_large(tmp_path, name), name, 1))

    with trio.fail_after(LIMIT):
        async with dirs.serving(), trio.open_nursery() as nursery:
            await make("a")
            await make("b")
            nursery.start_soon(make, "c")
            await trio.testing.wait_all_tasks_blocked()
            assert [Path(w.root).name for w in made] == ["a-1", "b-1"]  # c waits
            assert dirs.costs.live_bytes == dirs.costs.peak_bytes == 2 * size
            dirs.remove(made[0])
        assert [Path(w.root).name for w in made] == ["a-1", "b-1", "c-1"]
        for workdir in made[1:]:
            dirs.remove(workdir)
        await dirs.drain()
    costs = dirs.costs
    assert (costs.made, costs.reused, costs.bytes_copied) == (3, 0, 3 * size)
    assert costs.peak_bytes == 2 * size and costs.live_bytes == 0
    assert costs.to_json() == {
        "made": 3,
        "reused": 0,
        "bytesCopied": 3 * size,
        "bytesReflinked": 0,
        "peakBytes": 2 * size,
    }


async def test_peak_counts_what_the_last_harvest_found(tmp_path: Path) -> None:
    """A file an agent wrote counts in the peak from the harvest that found it on."""
    dirs = BranchDirs(tmp_path / "run", BranchIO())
    with trio.fail_after(LIMIT):
        async with dirs.serving():
            workdir = await dirs.materialize(_large(tmp_path), "step", 1)
            made = dirs.costs.peak_bytes
            (Path(workdir.root) / "new.bin").write_bytes(b"n" * 1000)
            await dirs.harvest(workdir)
            dirs.remove(workdir)
    assert dirs.costs.peak_bytes == made + 1000
    assert dirs.costs.live_bytes == 0 and dirs.costs.bytes_copied == made


async def test_leftovers_in_the_trash_are_deleted_by_the_next_attempt(tmp_path: Path) -> None:
    """What a killed process left in the run's trash is deleted when the runner serves again."""
    left = tmp_path / "run" / "trash" / "step-1.0badc0de"
    (left / "deep" / "er").mkdir(parents=True)
    (left / "deep" / "er" / "f.txt").write_text("x")
    dirs = BranchDirs(tmp_path / "run", BranchIO())
    with trio.fail_after(LIMIT):
        async with dirs.serving():
            pass
    assert not (tmp_path / "run" / "trash").exists()


def _waits_while_one_is_in_use(
    use: TreeUse, now: float, pending: int, busy: float | None = None
) -> Decision:
    """A decision that copies only when nothing of the tree is in use or being made."""
    return Decision(not use.held and not use.copying)


def _pooled_dirs(root: Path, **kwargs: Any) -> BranchDirs:
    pool = DirPool(str(root / "run" / "branches" / ".pool"), 4, min_files=0)
    return BranchDirs(root / "run", BranchIO(), pool=pool, limit=4, **kwargs)


async def test_a_waiting_branch_takes_the_directory_given_back_instead_of_copying(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A branch that waits gets the first branch's directory, reset, when it comes back."""
    monkeypatch.setattr(TreeUse, "decide", _waits_while_one_is_in_use)
    root = Branch.from_tree(_large(tmp_path).base, "root")
    dirs = _pooled_dirs(tmp_path)
    got: list[Workdir] = []
    done = trio.Event()

    async def second() -> None:
        got.append(await dirs.materialize(root.fork("b"), "b", 1))
        done.set()

    with trio.fail_after(LIMIT):
        async with dirs.serving(), trio.open_nursery() as nursery:
            first = await dirs.materialize(root.fork("a"), "a", 1)
            Path(first.root, "src", "f0.txt").write_bytes(b"changed by a\n")
            await dirs.harvest(first)
            nursery.start_soon(second)
            await trio.testing.wait_all_tasks_blocked()
            assert not got  # waiting: a directory of its tree is in use
            dirs.remove(first)
            await done.wait()
            (workdir,) = got
            assert Path(workdir.root, "src", "f0.txt").read_bytes() == b"0000\n"
            dirs.remove(workdir)
    assert (dirs.costs.made, dirs.costs.reused) == (1, 1)


async def test_fresh_copies_are_made_one_after_another(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With one fresh copy at a time, a second tree's copy waits while the budget has room."""
    jobs = _Jobs()
    original = materialize
    monkeypatch.setattr(
        _branchio, "materialize", lambda *a, **k: jobs.run(1, lambda: original(*a, **k))
    )
    branches = [_large(tmp_path, f"w{i}") for i in range(3)]
    dirs = _pooled_dirs(tmp_path, budget=trio.CapacityLimiter(3), copies=trio.CapacityLimiter(1))

    async def one(branch: Branch) -> None:
        dirs.remove(await dirs.materialize(branch, branch.name, 1))

    with trio.fail_after(LIMIT):
        async with dirs.serving(), trio.open_nursery() as nursery:
            for branch in branches:
                nursery.start_soon(one, branch)
            await jobs.k_inside.wait()
            await trio.testing.wait_all_tasks_blocked()
            assert jobs.active == 1  # the other two wait, though the budget has room
            jobs.gate.set()
    assert jobs.peak == 1 and dirs.costs.made == 3


async def test_a_branch_cancelled_while_waiting_gives_its_place_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Cancelled while waiting for a directory: its place among the directories is free again."""
    monkeypatch.setattr(TreeUse, "decide", _waits_while_one_is_in_use)
    root = Branch.from_tree(_large(tmp_path).base, "root")
    dirs = _pooled_dirs(tmp_path)
    with trio.fail_after(LIMIT):
        async with dirs.serving():
            first = await dirs.materialize(root.fork("a"), "a", 1)
            with trio.move_on_after(0.05) as scope:
                await dirs.materialize(root.fork("b"), "b", 1)
            assert scope.cancelled_caught
            assert dirs._disk.value == 3  # the first directory's place only
            assert all(use.waiting == 0 for use in dirs._uses.values())
            dirs.remove(first)
    assert (dirs.costs.made, dirs.costs.reused) == (1, 0)


async def test_a_deleter_finding_the_trash_emptied_while_it_waited_stops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deleters queued for the budget, one entry left: the later one finds none and ends."""
    budget = trio.CapacityLimiter(2)
    dirs = BranchDirs(tmp_path / "run", BranchIO(), budget=budget)
    holders = [object(), object()]
    deleted: list[str] = []
    second_deletion = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def counted(path: str) -> None:
        remove_tree(path)
        deleted.append(path)
        if len(deleted) == 2:
            trio.from_thread.run_sync(second_deletion.set, trio_token=token)

    monkeypatch.setattr(_branchio, "remove_tree", counted)
    with trio.fail_after(LIMIT):
        async with dirs.serving():
            first = await dirs.materialize(_large(tmp_path, "a"), "a", 1)
            second = await dirs.materialize(_large(tmp_path, "b"), "b", 1)
            for holder in holders:
                await budget.acquire_on_behalf_of(holder)
            dirs.remove(first)
            dirs.remove(second)  # two deleters, both waiting for the budget
            budget.release_on_behalf_of(holders[0])
            # one deletes an entry and hands its job to the other, which deletes the last
            # entry; the first queued again meanwhile, the trash still holding that entry
            await second_deletion.wait()
            budget.release_on_behalf_of(holders[1])
    assert len(deleted) == 2


def test_undo_writes_puts_back_what_was_written_after_a_harvest(tmp_path: Path) -> None:
    """What a check writes after the harvest (new files, edits, a deletion, a chmod, a
    .gitignore hiding the agent's new file) is undone on disk and in the branch."""
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "base.txt").write_text("base\n")
    (ws / "run.sh").write_text("echo\n")
    branch = Branch.from_tree(Workspace(str(ws)).snapshot(), "b")
    with materialize(branch, tmp_path / "dir") as workdir:
        root = Path(workdir.root)
        (root / "new.txt").write_text("agent's\n")  # the agent's work
        (root / "base.txt").write_text("agent edit\n")
        workdir.harvest(full=True)
        before = dict(branch.changes)
        kept = state_of(branch)
        # the check's writes
        (root / "junk.log").write_text("scratch\n")
        (root / "base.txt").write_text("check edit\n")
        (root / "new.txt").unlink()
        (root / "run.sh").chmod(0o755)
        (root / ".gitignore").write_text("new.txt\n")
        (root / "sub").mkdir()
        (root / "sub" / "out.txt").write_text("built\n")
        assert undo_writes(workdir, kept) >= 5
        assert dict(branch.changes) == before
        on_disk = sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())
        assert on_disk == ["base.txt", "new.txt", "run.sh"]
        assert (root / "base.txt").read_text() == "agent edit\n"
        assert (root / "new.txt").read_text() == "agent's\n"
        assert (root / "run.sh").stat().st_mode & 0o777 == 0o644
        # and the next harvest finds nothing more: the agent's work alone
        assert not workdir.harvest(full=True).changed


async def test_a_tree_too_small_to_pool_never_waits_for_a_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A tree the pool would not keep is copied at once: no directory of it comes back."""
    monkeypatch.setattr(TreeUse, "decide", _waits_while_one_is_in_use)
    root = Branch.from_tree(_large(tmp_path).base, "root")
    pool = DirPool(str(tmp_path / "run" / "branches" / ".pool"), 4, min_files=1000)
    dirs = BranchDirs(tmp_path / "run", BranchIO(), pool=pool, limit=4)
    with trio.fail_after(LIMIT):
        async with dirs.serving():
            first = await dirs.materialize(root.fork("a"), "a", 1)
            second = await dirs.materialize(root.fork("b"), "b", 1)  # while the first is in use
            dirs.remove(first)
            dirs.remove(second)
    assert (dirs.costs.made, dirs.costs.reused) == (2, 0)
