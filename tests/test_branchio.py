"""Branch directories of a run: small trees on the event loop, large ones in threads."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing

from orchestrator.pipeline import _branchio
from orchestrator.pipeline._branchio import (
    INLINE_MAX_BYTES,
    INLINE_MAX_FILES,
    BranchDirs,
    BranchIO,
    is_small,
)
from orchestrator.vfs import Branch, Workdir, Workspace, materialize
from orchestrator.vfs._fileio import remove_tree

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
    dirs = BranchDirs(tmp_path / "run", BranchIO(), limit=count, budget=trio.CapacityLimiter(k))

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

    def held(path: str) -> None:
        gate.wait(LIMIT)
        original(path)

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
