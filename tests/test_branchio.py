"""Branch directories of a run: small trees on the event loop, large ones in threads."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import trio

from orchestrator.pipeline import _branchio
from orchestrator.pipeline._branchio import (
    INLINE_MAX_BYTES,
    INLINE_MAX_FILES,
    BranchDirs,
    BranchIO,
    is_small,
)
from orchestrator.vfs import Branch, Workspace, materialize

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


async def test_small_directory_files_go_at_once_directories_with_the_reaper(
    tmp_path: Path,
) -> None:
    """Removing a small directory deletes its files at once; the reaper removes the folders."""
    branch = _branch(tmp_path, {"a/b/c.txt": b"c", "d.txt": b"d"})
    io = BranchIO()
    dirs = BranchDirs(tmp_path / "run", io)
    with trio.fail_after(LIMIT):
        workdir = await dirs.materialize(branch, "step", 1)
        root = Path(workdir.root)
        dirs.remove(workdir)
        # the files are gone at once (the reaper may be removing the folders meanwhile)
        assert not (root / "a" / "b" / "c.txt").exists() and not (root / "d.txt").exists()
        await dirs.drain()
    assert not root.exists()
    assert list((tmp_path / "run" / "branches").iterdir()) == []


async def test_directory_grown_large_is_left_whole_to_the_reaper(tmp_path: Path) -> None:
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
        assert _branchio._empty_small(workdir, 2 * INLINE_MAX_FILES) is None
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
