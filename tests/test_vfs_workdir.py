"""Tests for orchestrator.vfs.workdir: harvesting changes made on disk into the branch."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import stat_walk
from fakes import lock_held_by_another_thread

from orchestrator.vfs.branch import Branch
from orchestrator.vfs.changes import Delete, ModeChange, Write
from orchestrator.vfs.checkout import materialize
from orchestrator.vfs.errors import PathNotFound, PathRefused, VfsError
from orchestrator.vfs.export import BASE_GONE, git_patch, unified_diff
from orchestrator.vfs.snapshot import Snapshot, Workspace
from orchestrator.vfs.testing import make_tree
from orchestrator.vfs.workdir import Workdir, harvest


@pytest.fixture(params=["inotify", "scan", "inotify-walk", "scan-walk"])
def wd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Workdir]:
    """A materialized branch, harvested with the inotify accelerator or by full scans, each
    listing the directory with ``find`` or walking it here (``-walk``)."""
    kind, _, walker = request.param.partition("-")
    with stat_walk(walker or "find"):
        yield from _workdir(tmp_path, kind)


def _workdir(tmp_path: Path, kind: str) -> Iterator[Workdir]:
    root = make_tree(
        tmp_path / "ws",
        {
            "src/app.py": "def f():\n    return 1\n",
            "docs/guide.md": "# Guide\n",
            "script.sh": "#!/bin/sh\n",
            ".gitignore": "*.pyc\nbuild/\n",
        },
    )
    old = time.time() - 3600
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (old, old))
    branch = Branch.from_tree(Workspace.open(root).snapshot(), "agent")
    workdir = materialize(branch, tmp_path / "state" / "agent", watch=kind == "inotify")
    yield workdir
    workdir.close()


def test_unchanged_tree_harvests_nothing(wd: Workdir) -> None:
    """Harvesting an untouched directory records nothing and hashes nothing."""
    report = wd.harvest()
    assert not report.changed and report.hashed == 0
    assert not wd.branch.changes


def test_file_written_directly_on_disk(wd: Workdir) -> None:
    """A file the agent rewrote itself is recorded as modified."""
    Path(wd.root, "src/app.py").write_text("def f():\n    return 2\n")
    report = wd.harvest()
    assert report.modified == ("src/app.py",)
    assert wd.branch.read("src/app.py") == b"def f():\n    return 2\n"


def test_sed_in_place_via_subprocess(wd: Workdir) -> None:
    """`sed -i` (a new file renamed over the old) in the branch directory is harvested."""
    subprocess.run(["sed", "-i", "s/return 1/return 42/", "src/app.py"], cwd=wd.root, check=True)
    assert wd.harvest().modified == ("src/app.py",)
    assert b"return 42" in wd.branch.read("src/app.py")


def test_deletion_new_file_and_mode_change(wd: Workdir) -> None:
    """Deleted files, new files (in new directories) and mode changes are all recorded."""
    Path(wd.root, "docs/guide.md").unlink()
    Path(wd.root, "pkg/sub").mkdir(parents=True)
    Path(wd.root, "pkg/sub/new.py").write_text("NEW = 1\n")
    Path(wd.root, "top.txt").write_text("top\n")
    os.chmod(Path(wd.root, "script.sh"), 0o755)
    report = wd.harvest()
    assert report.deleted == ("docs/guide.md",)
    assert report.added == ("pkg/sub/new.py", "top.txt")
    assert report.mode_changed == ("script.sh",)
    changes = wd.branch.changes
    assert changes["docs/guide.md"] == Delete()
    assert changes["pkg/sub/new.py"] == Write(b"NEW = 1\n")
    assert changes["script.sh"] == ModeChange(0o755)
    assert not wd.harvest().changed


def test_ignored_files_are_not_harvested(wd: Workdir) -> None:
    """Build output and .gitignore'd files created by the agent stay out of the branch."""
    Path(wd.root, "src/app.pyc").write_bytes(b"\0\1")
    Path(wd.root, "build/lib").mkdir(parents=True)
    Path(wd.root, "build/lib/out.o").write_bytes(b"obj")
    Path(wd.root, ".git").mkdir()
    Path(wd.root, ".git/HEAD").write_text("ref")
    assert not wd.harvest().changed
    assert not wd.harvest(full=True).changed


def write_pytest_cache(root: str) -> None:
    """What ``pytest`` leaves in its directory: a cache that ignores itself with ``*``."""
    cache = Path(root, ".pytest_cache")
    (cache / "v/cache").mkdir(parents=True)
    (cache / ".gitignore").write_text("# Created by pytest automatically.\n*\n")
    (cache / "README.md").write_text("# pytest cache directory #\n")
    (cache / "CACHEDIR.TAG").write_text("Signature: 8a477f597d28d172789f06886806bc55\n")
    (cache / "v/cache/nodeids").write_text("[]\n")


def test_directory_ignoring_itself_with_a_gitignore_written_during_the_step(wd: Workdir) -> None:
    """A tool's own nested .gitignore (``*``, as pytest writes) keeps its directory out."""
    write_pytest_cache(wd.root)
    Path(wd.root, "src/result.txt").write_text("ok\n")
    assert wd.harvest().added == ("src/result.txt",)
    assert not wd.harvest(full=True).changed
    assert set(wd.branch.changes) == {"src/result.txt"}


def test_nested_gitignore_written_during_the_step(wd: Workdir) -> None:
    """A .gitignore the step writes in a directory applies below it, from the same harvest."""
    Path(wd.root, "src/.gitignore").write_text("*.tmp\n/gen/\n")
    Path(wd.root, "src/x.tmp").write_text("scratch\n")
    Path(wd.root, "src/gen/deep").mkdir(parents=True)
    Path(wd.root, "src/gen/deep/out.py").write_text("generated\n")
    Path(wd.root, "src/keep.py").write_text("kept\n")
    Path(wd.root, "docs/y.tmp").write_text("not under src\n")
    report = wd.harvest()
    assert report.added == ("docs/y.tmp", "src/.gitignore", "src/keep.py")
    assert not wd.harvest(full=True).changed


def test_negation_and_directory_patterns_added_to_the_root_gitignore(wd: Workdir) -> None:
    """``!keep.log`` re-includes one file; ``out/`` ignores a directory but not a file so named."""
    Path(wd.root, ".gitignore").write_text("*.pyc\nbuild/\n*.log\n!keep.log\nout/\n")
    for rel in ("a.log", "keep.log", "out/x.txt", "docs/out"):
        Path(wd.root, rel).parent.mkdir(parents=True, exist_ok=True)
        Path(wd.root, rel).write_text(f"{rel}\n")
    report = wd.harvest()
    assert report.modified == (".gitignore",)
    assert report.added == ("docs/out", "keep.log")
    assert not wd.harvest(full=True).changed


def test_file_harvested_before_its_pattern_was_written_leaves_the_branch(wd: Workdir) -> None:
    """A new file recorded by an earlier harvest is dropped once a .gitignore ignores it."""
    Path(wd.root, "notes.log").write_text("turn 1\n")
    assert wd.harvest().added == ("notes.log",)
    Path(wd.root, ".gitignore").write_text("*.pyc\nbuild/\n*.log\n")
    Path(wd.root, "notes.log").write_text("turn 2\n")
    report = wd.harvest()
    assert report.ignored == ("notes.log",) and report.modified == (".gitignore",)
    assert set(wd.branch.changes) == {".gitignore"}
    assert not wd.harvest(full=True).changed
    Path(wd.root, ".gitignore").write_text("*.pyc\nbuild/\n")
    report = wd.harvest()
    assert report.added == ("notes.log",)
    assert wd.branch.read("notes.log") == b"turn 2\n"
    assert set(wd.branch.changes) == {"notes.log"}


def test_deleting_a_gitignore_during_the_step_reincludes_its_files(wd: Workdir) -> None:
    """Files the removed .gitignore ignored are changes again."""
    Path(wd.root, "src/app.pyc").write_bytes(b"\0\1")
    assert not wd.harvest().changed
    Path(wd.root, ".gitignore").unlink()
    report = wd.harvest()
    assert report.deleted == (".gitignore",) and report.added == ("src/app.pyc",)


def test_directory_made_again_without_its_gitignore(wd: Workdir) -> None:
    """The patterns of a removed directory's .gitignore do not outlive it."""
    Path(wd.root, "sub").mkdir()
    Path(wd.root, "sub/.gitignore").write_text("*.tmp\n")
    assert wd.harvest().added == ("sub/.gitignore",)
    shutil.rmtree(Path(wd.root, "sub"))
    assert wd.harvest().deleted == ("sub/.gitignore",)
    Path(wd.root, "sub").mkdir()
    Path(wd.root, "sub/x.tmp").write_text("kept now\n")
    assert wd.harvest().added == ("sub/x.tmp",)


def test_tracked_files_matching_a_new_pattern_still_change(wd: Workdir) -> None:
    """As in git, ignore rules apply to new files: edits to files of the base still count."""
    Path(wd.root, ".gitignore").write_text("*.pyc\nbuild/\ndocs/\n*.sh\n")
    Path(wd.root, "docs/guide.md").write_text("# Edited\n")
    os.chmod(Path(wd.root, "script.sh"), 0o755)
    Path(wd.root, "docs/new.md").write_text("new, ignored\n")
    report = wd.harvest()
    assert report.modified == (".gitignore", "docs/guide.md")
    assert report.mode_changed == ("script.sh",)
    assert not report.added
    wd.write("docs/guide.md", b"# Through the fs\n")
    assert wd.branch.read("docs/guide.md") == b"# Through the fs\n"
    Path(wd.root, "docs/guide.md").unlink()
    assert wd.harvest().deleted == ("docs/guide.md",)
    Path(wd.root, "docs/guide.md").write_text("# Guide\n")  # back, inside an ignored directory
    assert wd.harvest().added == ("docs/guide.md",)
    assert "docs/guide.md" not in wd.branch.changes


def test_writes_through_the_workdir_follow_a_gitignore_written_through_it(wd: Workdir) -> None:
    """A .gitignore written through the fs service governs the writes and harvests after it."""
    wd.write("tmp/.gitignore", b"*\n!.gitignore\n")
    wd.write("tmp/scratch.txt", b"scratch\n")
    wd.harvest()
    assert set(wd.branch.changes) == {"tmp/.gitignore"}


def test_git_info_exclude_of_the_workspace_applies(tmp_path: Path) -> None:
    """``.git/info/exclude`` of the workspace ignores; a .gitignore written by the step wins."""
    root = make_tree(
        tmp_path / "ws",
        {"app.py": "x = 1\n", ".git/info/exclude": "*.local\n", ".git/HEAD": "ref\n"},
    )
    branch = Branch.from_tree(Workspace.open(root).snapshot(), "agent")
    with materialize(branch, tmp_path / "state" / "agent") as workdir:
        Path(workdir.root, "dev.local").write_text("mine\n")
        assert not workdir.harvest().changed
        Path(workdir.root, "sub").mkdir()
        Path(workdir.root, "sub/.gitignore").write_text("!shared.local\n")
        Path(workdir.root, "sub/shared.local").write_text("shared\n")
        Path(workdir.root, "sub/other.local").write_text("other\n")
        assert workdir.harvest().added == ("sub/.gitignore", "sub/shared.local")


def test_gitignore_written_by_a_parent_branch_applies_to_its_fork(tmp_path: Path) -> None:
    """A fork's harvest follows the .gitignore files of the tree it forked from."""
    root = make_tree(tmp_path / "ws", {"app.py": "x = 1\n", ".gitignore": "*.pyc\n"})
    parent = Branch.from_tree(Workspace.open(root).snapshot(), "parent")
    parent.write(".gitignore", b"gen/\n")
    with materialize(parent.fork("child"), tmp_path / "state" / "child") as workdir:
        Path(workdir.root, "gen").mkdir()
        Path(workdir.root, "gen/out.py").write_text("generated\n")
        Path(workdir.root, "x.pyc").write_bytes(b"\0")
        assert workdir.harvest().added == ("x.pyc",)
    parent.delete(".gitignore")
    with materialize(parent.fork("again"), tmp_path / "state" / "again") as workdir:
        Path(workdir.root, "y.pyc").write_bytes(b"\0")
        assert workdir.harvest().added == ("y.pyc",)


def test_same_size_rewrite_with_restored_mtime(wd: Workdir) -> None:
    """A rewrite that keeps size and mtime (like `cp -p`) is still caught (ctime, inode)."""
    path = Path(wd.root, "src/app.py")
    st = path.stat()
    path.write_text("def f():\n    return 9\n")
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert wd.harvest().modified == ("src/app.py",)


def test_revert_on_disk_drops_the_change(wd: Workdir) -> None:
    """Restoring the original content removes the change from the branch."""
    path = Path(wd.root, "docs/guide.md")
    path.write_text("# Changed\n")
    wd.harvest()
    path.write_text("# Guide\n")
    report = wd.harvest()
    assert report.modified == ("docs/guide.md",)
    assert not wd.branch.changes


def test_directory_rename_and_removal(wd: Workdir) -> None:
    """Renaming or removing a directory shows up as deletions and additions."""
    os.rename(Path(wd.root, "src"), Path(wd.root, "lib"))
    report = wd.harvest()
    assert report.deleted == ("src/app.py",)
    assert report.added == ("lib/app.py",)
    shutil.rmtree(Path(wd.root, "lib"))
    Path(wd.root, "lib2").mkdir()
    Path(wd.root, "lib2/x.py").write_text("x\n")
    report = wd.harvest()
    assert report.deleted == ("lib/app.py",) and report.added == ("lib2/x.py",)
    Path(wd.root, "lib2/x.py").write_text("y\n")
    assert wd.harvest().modified == ("lib2/x.py",)


def test_file_replaced_by_directory(wd: Workdir) -> None:
    """A file turned into a directory is a deletion plus the new files."""
    Path(wd.root, "top").write_text("file\n")
    wd.harvest()
    Path(wd.root, "top").unlink()
    Path(wd.root, "top").mkdir()
    Path(wd.root, "top/inner.txt").write_text("inner\n")
    report = wd.harvest()
    assert report.added == ("top/inner.txt",)
    assert "top" not in wd.branch.changes


def test_directory_replaced_by_a_symlink_to_its_moved_copy(wd: Workdir) -> None:
    """A directory moved aside and a symlink left in its place: its files are deleted (not
    found again through the link), the link and the moved files added."""
    os.rename(Path(wd.root, "src"), Path(wd.root, "src2"))
    os.symlink("src2", Path(wd.root, "src"))
    report = wd.harvest(full=True)
    assert report.deleted == ("src/app.py",)
    assert report.added == ("src", "src2/app.py")
    assert wd.branch.read("src") == b"src2" and wd.branch.mode("src/app.py") is None


def test_directory_replaced_by_a_symlink_leading_outside(wd: Workdir, tmp_path: Path) -> None:
    """Through a directory made a symlink to an outside one holding the same names, nothing
    outside is read: the directory's files are deleted."""
    outside = make_tree(tmp_path / "outside", {"app.py": "secret\n"})
    shutil.rmtree(Path(wd.root, "src"))
    os.symlink(outside, Path(wd.root, "src"))
    report = wd.harvest()
    assert report.deleted == ("src/app.py",) and report.added == ("src",)
    assert b"secret" not in b"".join(wd.branch.read(p) for p in wd.branch.paths())


def test_directory_replaced_by_a_file_of_its_name(wd: Workdir) -> None:
    """A directory removed and a file written at its name: the directory's files are deleted,
    the file added (none looked up below it again)."""
    Path(wd.root, "src/deep/er").mkdir(parents=True)
    Path(wd.root, "src/deep/er/x.py").write_text("x\n")
    wd.harvest(full=True)
    shutil.rmtree(Path(wd.root, "src"))
    Path(wd.root, "src").write_text("now a file\n")
    report = wd.harvest(full=True)
    assert report.deleted == ("src/app.py", "src/deep/er/x.py")
    assert report.added == ("src",)


def test_a_removed_branch_directory_is_one_clear_error(wd: Workdir) -> None:
    """A branch directory removed during the step fails the harvest with one sentence."""
    shutil.rmtree(wd.root)
    with pytest.raises(VfsError, match="was removed or replaced during the step"):
        wd.harvest(full=True)
    os.symlink("/tmp", wd.root)  # replaced by a symlink: the same
    with pytest.raises(VfsError, match="was removed or replaced during the step"):
        wd.harvest(full=True)


def test_symlinks_are_harvested_as_links(wd: Workdir) -> None:
    """A symlink the agent creates is recorded with its target, not followed."""
    os.symlink("src/app.py", Path(wd.root, "alias.py"))
    assert wd.harvest().added == ("alias.py",)
    assert wd.branch.read("alias.py") == b"src/app.py"
    assert wd.branch.mode("alias.py") == 0o120777


def test_workdir_write_read_delete_keep_disk_and_branch_in_step(wd: Workdir) -> None:
    """Writes through the workdir land on disk and in the branch; reads harvest first."""
    wd.write("new/deep/file.txt", b"hello\n")
    assert Path(wd.root, "new/deep/file.txt").read_bytes() == b"hello\n"
    assert wd.branch.read("new/deep/file.txt") == b"hello\n"
    assert not wd.harvest().changed
    Path(wd.root, "src/app.py").write_text("disk\n")
    assert wd.read("src/app.py") == b"disk\n"
    assert wd.branch.read("src/app.py") == b"disk\n"
    wd.delete("docs/guide.md")
    assert not Path(wd.root, "docs/guide.md").exists()
    assert wd.branch.changes["docs/guide.md"] == Delete()
    with pytest.raises(PathNotFound):
        wd.delete("docs/guide.md")
    with pytest.raises(PathNotFound):
        wd.read("docs/guide.md")
    assert wd.path_of("src/app.py") == os.path.join(wd.root, "src/app.py")


def test_workdir_write_keeps_mode_and_refuses_symlinked_dirs(wd: Workdir, tmp_path: Path) -> None:
    """Rewriting keeps the file's mode; a directory symlink in the way is refused."""
    os.chmod(Path(wd.root, "script.sh"), 0o755)
    wd.write("script.sh", b"#!/bin/sh\necho\n")
    assert os.stat(Path(wd.root, "script.sh")).st_mode & 0o777 == 0o755
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, Path(wd.root, "escape"))
    with pytest.raises(PathRefused):
        wd.write("escape/pwned.txt", b"x")
    assert list(outside.iterdir()) == []


def test_ignored_path_read_from_disk(wd: Workdir) -> None:
    """An ignored file is served as it is on disk and never enters the branch."""
    Path(wd.root, "cache.pyc").write_bytes(b"bytes")
    assert wd.read("cache.pyc") == b"bytes"
    wd.write("other.pyc", b"x")
    assert "other.pyc" not in wd.branch.changes


async def test_harvest_async(wd: Workdir) -> None:
    """harvest_async runs in a worker thread with the same result."""
    Path(wd.root, "src/app.py").write_text("async\n")
    report = await wd.harvest_async()
    assert report.modified == ("src/app.py",)
    Path(wd.root, "src/app.py").write_text("function\n")
    assert harvest(wd, full=True).modified == ("src/app.py",)


def test_closing_falls_back_to_full_scans(wd: Workdir) -> None:
    """After close(), harvests still find changes, by scanning."""
    wd.close()
    assert not wd.watching
    Path(wd.root, "docs/guide.md").write_text("after close\n")
    report = wd.harvest()
    assert report.full_scan and report.modified == ("docs/guide.md",)


# ---------------------------------------------------------------- at once, or not at all


def test_nowait_methods_give_up_while_another_thread_holds_the_directory(wd: Workdir) -> None:
    """read_nowait is None and write_nowait False (nothing written) while the lock is taken."""
    with lock_held_by_another_thread(wd):
        assert wd.read_nowait("src/app.py", 1 << 20) is None
        assert wd.write_nowait("new.txt", b"new\n") is False
        assert not Path(wd.root, "new.txt").exists()
        assert "new.txt" not in wd.branch.changes
    assert wd.read_nowait("src/app.py", 1 << 20) == b"def f():\n    return 1\n"
    assert wd.write_nowait("new.txt", b"new\n") is True
    assert wd.branch.read("new.txt") == b"new\n"


def test_read_nowait_leaves_files_over_max_bytes_unread(wd: Workdir) -> None:
    """A file larger than max_bytes gives None without being read (nor harvested)."""
    data = b"def f():\n    return 2\n"
    Path(wd.root, "src/app.py").write_bytes(data)
    assert wd.read_nowait("src/app.py", len(data) - 1) is None
    assert "src/app.py" not in wd.branch.changes
    assert wd.read_nowait("src/app.py", len(data)) == data
    assert wd.branch.changes["src/app.py"] == Write(data)


def test_nowait_methods_match_read_and_write(wd: Workdir) -> None:
    """Otherwise read_nowait reads as read does and write_nowait writes as write does."""
    big = 1 << 20
    Path(wd.root, "docs/guide.md").write_text("# Changed\n")
    assert wd.read_nowait("docs/guide.md", big) == b"# Changed\n"
    assert wd.branch.changes["docs/guide.md"] == Write(b"# Changed\n")  # harvested, as by read
    assert wd.read("docs/guide.md") == b"# Changed\n"
    os.symlink("src/app.py", Path(wd.root, "alias.py"))
    assert wd.read_nowait("alias.py", big) == wd.read("alias.py") == b"src/app.py"
    Path(wd.root, "cache.pyc").write_bytes(b"bytes")
    assert wd.read_nowait("cache.pyc", big) == b"bytes"
    assert "cache.pyc" not in wd.branch.changes
    with pytest.raises(PathNotFound):
        wd.read_nowait("nope.txt", big)
    with pytest.raises(IsADirectoryError):
        wd.read_nowait("src", big)
    os.chmod(Path(wd.root, "script.sh"), 0o755)
    assert wd.write_nowait("script.sh", b"#!/bin/sh\necho\n") is True
    assert os.stat(Path(wd.root, "script.sh")).st_mode & 0o777 == 0o755
    assert wd.write_nowait("new/deep/file.txt", b"hello\n") is True
    assert Path(wd.root, "new/deep/file.txt").read_bytes() == b"hello\n"
    assert wd.branch.read("new/deep/file.txt") == b"hello\n"
    assert not wd.harvest().changed
    assert wd.write_nowait("other.pyc", b"x") is True
    assert "other.pyc" not in wd.branch.changes


@pytest.mark.parametrize(
    "path",
    [
        "../ws/src/app.py",
        "/etc/passwd",
        "escape/secret.txt",
        "escape/missing.txt",
        "src/app.py/inside-a-file",
    ],
    ids=["dotdot", "absolute", "dir-symlink-out", "dir-symlink-out-missing", "through-a-file"],
)
def test_nowait_methods_refuse_what_read_and_write_refuse(
    wd: Workdir, tmp_path: Path, path: str
) -> None:
    """A path read or write refuses is refused (or missed) the same way by the nowait methods."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("top secret\n")
    os.symlink(outside, Path(wd.root, "escape"))

    def failure(call: Callable[[], object]) -> type[BaseException] | None:
        try:
            call()
        except (PathRefused, PathNotFound, OSError) as e:
            return type(e)
        return None

    read_failure = failure(lambda: wd.read(path))
    assert read_failure is not None
    assert failure(lambda: wd.read_nowait(path, 1 << 20)) is read_failure
    write_failure = failure(lambda: wd.write(path, b"pwned\n"))
    assert write_failure is not None
    assert failure(lambda: wd.write_nowait(path, b"pwned\n")) is write_failure
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "top secret\n"


# --------------------------------------------------------------------------- workspace links


@pytest.fixture(params=["inotify", "scan"])
def linked_wd(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Workdir]:
    """A materialized branch of a workspace whose ``abs.txt`` links to its ``target.txt`` by
    absolute path (so the branch directory holds it leading to its own copy)."""
    root = make_tree(tmp_path / "ws", {"target.txt": "target\n", "src/app.py": "x = 1\n"})
    root = root.resolve()
    (root / "abs.txt").symlink_to(root / "target.txt")
    branch = Branch.from_tree(Workspace.open(root).snapshot(), "agent")
    workdir = materialize(branch, tmp_path / "state" / "agent", watch=request.param == "inotify")
    yield workdir
    workdir.close()


def ws_of(wd: Workdir) -> Path:
    """The workspace the branch of ``wd`` was taken from."""
    snapshot = wd.branch.root
    assert isinstance(snapshot, Snapshot)
    return Path(snapshot.root)


def test_a_mapped_link_read_again_is_no_change(linked_wd: Workdir) -> None:
    """A link written leading into the branch directory reads back as the workspace's target,
    even when the harvest must read it (its stat changed) and through Workdir.read."""
    wd = linked_wd
    os.utime(Path(wd.root, "abs.txt"), ns=(1, 1), follow_symlinks=False)
    report = wd.harvest(full=True)
    assert not report.changed and report.hashed == 1
    assert wd.read("abs.txt") == os.fsencode(ws_of(wd) / "target.txt")
    assert not wd.branch.changes


def test_a_mapped_link_retargeted_is_a_change(linked_wd: Workdir) -> None:
    """A link the agent points elsewhere is recorded with the target it gave."""
    wd = linked_wd
    link = Path(wd.root, "abs.txt")
    link.unlink()
    link.symlink_to("src/app.py")
    assert wd.harvest().modified == ("abs.txt",)
    assert wd.branch.read("abs.txt") == b"src/app.py"


def test_a_new_link_by_absolute_path_into_the_branch_names_the_workspace(
    linked_wd: Workdir,
) -> None:
    """A link the agent makes by absolute path into its directory is recorded with the
    workspace's same path, which is what it means once applied."""
    wd = linked_wd
    Path(wd.root, "new.txt").symlink_to(Path(wd.root, "src/app.py"))
    assert wd.harvest().added == ("new.txt",)
    assert wd.branch.read("new.txt") == os.fsencode(ws_of(wd) / "src/app.py")


def test_workdir_write_of_a_link_into_the_workspace_leads_into_the_branch(
    linked_wd: Workdir,
) -> None:
    """Workdir.write of such a link writes it leading here and records the given target."""
    wd = linked_wd
    target = os.fsencode(ws_of(wd) / "src/app.py")
    wd.write("alias.py", target, 0o120777)
    assert os.readlink(Path(wd.root, "alias.py")) == str(Path(wd.root, "src/app.py"))
    assert wd.branch.read("alias.py") == target
    assert not wd.harvest(full=True).changed


NOTES = b"one\ntwo\nthree\n"


def notes_workdir(tmp_path: Path) -> tuple[Path, Workdir]:
    """A workspace holding notes.txt (an hour old: not hashed by the snapshot), and a branch of
    it materialized."""
    root = make_tree(tmp_path / "ws", {"notes.txt": NOTES})
    old = time.time() - 3600
    os.utime(root / "notes.txt", (old, old))
    branch = Branch.from_tree(Workspace.open(root).snapshot(), "agent")
    return root, materialize(branch, tmp_path / "state" / "agent")


def test_write_after_the_workspace_file_changed_diffs_against_the_copy(tmp_path: Path) -> None:
    """The workspace file changes, then the branch's untouched copy is written over: that copy
    held the base, so the diff and the patch show the change against it."""
    root, wd = notes_workdir(tmp_path)
    (root / "notes.txt").write_text("someone else\n")
    wd.write("notes.txt", b"one\nTWO\nthree\n")
    assert "-two\n+TWO\n" in unified_diff(wd.branch)
    assert b"-two\n+TWO\n" in git_patch(wd.branch)


def test_change_harvested_before_the_workspace_file_changed_keeps_its_base(tmp_path: Path) -> None:
    """An edit on disk harvested while the workspace still holds the file: once the workspace
    file changed, the diff still shows the edit against the base."""
    root, wd = notes_workdir(tmp_path)
    Path(wd.root, "notes.txt").write_bytes(b"one\nTWO\nthree\n")
    assert wd.harvest().modified == ("notes.txt",)
    (root / "notes.txt").write_text("someone else\n")
    assert "-two\n+TWO\n" in unified_diff(wd.branch)


def test_edit_on_disk_after_the_workspace_file_changed_keeps_the_base_digest(
    tmp_path: Path,
) -> None:
    """The workspace file changes, then the agent edits its copy itself: the base's digest is
    known (the change applies once the file is back), its lines are not (shown whole)."""
    root, wd = notes_workdir(tmp_path)
    (root / "notes.txt").write_text("someone else\n")
    Path(wd.root, "notes.txt").write_bytes(b"one\nTWO\nthree\n")
    assert wd.harvest().modified == ("notes.txt",)
    assert isinstance(wd.branch.changes["notes.txt"], Write)
    assert wd.branch.root.digest("notes.txt") == hashlib.sha256(NOTES).hexdigest()
    assert BASE_GONE.decode() in unified_diff(wd.branch, base_gone="whole")


@pytest.mark.parametrize("kind", ["inotify", "scan"])
@pytest.mark.parametrize("walker", ["find", "walk"])
def test_version_control_names_in_any_case_are_never_harvested(
    tmp_path: Path, kind: str, walker: str
) -> None:
    """``.GIT/hooks/pre-commit`` is ``.git/hooks/pre-commit`` on a case-insensitive file
    system: no case of a version-control name is harvested, with or without patterns."""
    root = make_tree(tmp_path / "ws", {"a.txt": "a\n"})
    branch = Branch.from_tree(Workspace.open(root).snapshot(), "agent")
    with stat_walk(walker):
        workdir = materialize(branch, tmp_path / "state" / "agent", watch=kind == "inotify")
        try:
            for rel in (".GIT/hooks/pre-commit", "sub/.Git/config", "_DARCS/x", "d/.\u017fvn/y"):
                Path(workdir.root, rel).parent.mkdir(parents=True, exist_ok=True)
                Path(workdir.root, rel).write_text("evil\n")
            Path(workdir.root, "sub/.HG").write_text("a file of that name\n")
            Path(workdir.root, "kept.txt").write_text("kept\n")
            assert workdir.harvest().added == ("kept.txt",)
            assert workdir.harvest(full=True).added == ()
            assert sorted(workdir.branch.changes) == ["kept.txt"]
        finally:
            workdir.close()
