"""Tests for orchestrator.vfs.pool: a reused branch directory is exactly its tree, or not reused."""

from __future__ import annotations

import mmap
import os
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import bind_mount, make_chain, stat_walk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from orchestrator._names import name_bytes
from orchestrator.errors import UsageError
from orchestrator.vfs import _inotify
from orchestrator.vfs import pool as vfs_pool
from orchestrator.vfs._fileio import PATH_MAX, remove_tree
from orchestrator.vfs._mounts import mounts_under
from orchestrator.vfs.branch import Branch
from orchestrator.vfs.checkout import materialize
from orchestrator.vfs.errors import PathRefused
from orchestrator.vfs.pool import DirPool, find_holders, reuse_enabled_by_env
from orchestrator.vfs.snapshot import Snapshot, Workspace
from orchestrator.vfs.testing import make_tree
from orchestrator.vfs.workdir import HarvestReport, Workdir

FILES = {
    "README.md": "# readme\n",
    "src/main.py": "print('hi')\n",
    "src/util/helpers.py": "x = 1\n",
    "docs/a/b/deep.txt": "deep\n",
    ".gitignore": "*.log\nbuild/\n",
    "app.log": "ignored, never copied\n",
    "build/out.o": "ignored\n",
    ".git/config": "[core]\n",
}


def make_workspace(top: Path) -> Snapshot:
    """A workspace with an executable, links of every kind, ignored files and ``.git``."""
    ws = make_tree(top / "ws", FILES)
    (ws / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (ws / "run.sh").chmod(0o755)
    (ws / "link.md").symlink_to("README.md")  # relative, inside
    (ws / "abs.md").symlink_to(ws / "README.md")  # absolute, into the workspace: rewritten
    (ws / "src/up.md").symlink_to("../../ws/README.md")  # relative, out and back in
    (ws / "out").symlink_to("/tmp")  # leading outside
    (ws / "srcdir").symlink_to("src")  # a directory
    return Workspace.open(ws).snapshot()


def tree_of(root: str) -> dict[str, tuple[str, int, bytes]]:
    """Everything below ``root``: kind, permission bits and content (a link's target, with
    ``root`` itself named ``ROOT``), directories included."""
    out: dict[str, tuple[str, int, bytes]] = {}
    prefix = name_bytes(root)
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            full = os.path.join(dirpath, name)
            rel = os.path.relpath(full, root)
            st_ = os.lstat(full)
            perm = stat.S_IMODE(st_.st_mode)
            if stat.S_ISLNK(st_.st_mode):
                target = name_bytes(os.readlink(full)).replace(prefix, b"ROOT")
                out[rel] = ("link", 0, target)
            elif stat.S_ISDIR(st_.st_mode):
                out[rel] = ("dir", perm, b"")
            else:
                out[rel] = ("file", perm, Path(full).read_bytes())
                assert st_.st_nlink == 1, rel
    return out


# --------------------------------------------------------------------------- random edits

NAMES = ["README.md", "src", "src/main.py", "src/new.txt", "docs/a", "docs/a/b/deep.txt",
         "x.log", "build/o", "new/dir/f", ".git", "src/.git/HEAD", "link.md", "abs.md", "run.sh",
         "srcdir", "e/m/p/t/y"]  # fmt: skip
paths = st.sampled_from(NAMES)
data = st.binary(max_size=40)

edits = st.one_of(
    st.tuples(st.just("fs_write"), paths, data, st.sampled_from([0o644, 0o755])),
    st.tuples(st.just("fs_delete"), paths),
    st.tuples(st.just("write"), paths, data),
    st.tuples(st.just("remove"), paths),
    st.tuples(st.just("rename"), paths, paths),
    st.tuples(st.just("chmod"), paths, st.sampled_from([0o600, 0o700, 0o755, 0o777, 0o444])),
    st.tuples(st.just("symlink"), paths, st.sampled_from(["README.md", "/tmp", "ABS", "../.."])),
    st.tuples(st.just("mkdir"), paths),
    st.tuples(st.just("hardlink"), paths),
    st.tuples(st.just("sneak"), paths),
    st.tuples(st.just("through_link"), paths),
    st.tuples(st.just("mmap"), paths),
    st.tuples(
        st.just("harvest"),
    ),
)


def apply_edit(wd: Workdir, edit: tuple[object, ...], outside: Path) -> None:
    """One edit of the agent's, through ``fs/*`` or on disk; one that cannot be made is skipped."""
    kind = edit[0]
    root = Path(wd.root)
    path = root / str(edit[1]) if len(edit) > 1 else root
    try:
        if kind == "fs_write":
            wd.write(str(edit[1]), edit[2], edit[3])  # type: ignore[arg-type]
        elif kind == "fs_delete":
            wd.delete(str(edit[1]))
        elif kind == "write":
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(edit[2])  # type: ignore[arg-type]
        elif kind == "remove":
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
        elif kind == "rename":
            other = root / str(edit[2])
            other.parent.mkdir(parents=True, exist_ok=True)
            os.rename(path, other)
        elif kind == "chmod":
            mode = int(edit[2])  # type: ignore[call-overload]
            if not path.is_symlink():  # chmod follows links (one leads outside)
                os.chmod(path, mode | 0o700 if path.is_dir() else mode)
        elif kind == "symlink":
            target = str(edit[2])
            target = str(root / "README.md") if target == "ABS" else target
            path.parent.mkdir(parents=True, exist_ok=True)
            if path.is_symlink() or path.is_file():
                path.unlink()
            path.symlink_to(target)
        elif kind == "mkdir":
            path.mkdir(parents=True, exist_ok=True)
            if path.name == ".git" or "/.git" in str(path):
                (path / "HEAD").write_text("ref: refs/heads/main\n")
        elif kind == "hardlink":
            os.link(path, outside / f"h{len(os.listdir(outside))}")
        elif kind == "sneak":  # other bytes of the same size, the times put back (touch -r)
            before = os.lstat(path)
            if stat.S_ISREG(before.st_mode):
                data = bytes(b ^ 0xFF for b in path.read_bytes())
                path.write_bytes(data)
                os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        elif kind == "through_link":  # the same, by a second name outside the directory
            before = os.lstat(path)
            if stat.S_ISREG(before.st_mode):
                other = outside / f"h{len(os.listdir(outside))}"
                os.link(path, other)
                other.write_bytes(bytes(b ^ 0xFF for b in other.read_bytes()))
                os.utime(other, ns=(before.st_atime_ns, before.st_mtime_ns))
        elif kind == "mmap":  # written through a shared mapping, the times put back
            before = os.lstat(path)
            if stat.S_ISREG(before.st_mode) and before.st_size:
                with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
                    m[0] = m[0] ^ 0xFF
                os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
        elif kind == "harvest":
            wd.harvest()
    except (OSError, ValueError) as e:  # as an agent's failing command: nothing happens
        del e
    except Exception as e:  # the fs service refuses (a .git path, a directory): skipped
        if type(e).__module__.startswith("orchestrator"):
            return
        raise


@pytest.fixture(autouse=True, params=["find", "walk"])
def walker(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every test twice: pooled directories looked through by ``find`` and by this process."""
    with stat_walk(request.param):
        yield


@pytest.fixture
def space() -> Iterator[Path]:
    with tempfile.TemporaryDirectory() as top:
        yield Path(top)


def fresh_snapshot(top: Path) -> tuple[Snapshot, Branch]:
    snap = make_workspace(top)
    parent = Branch.from_tree(snap, "parent")
    # a tree layered on the workspace, as a later step forks from: a file written, one deleted,
    # a mode changed, a link
    parent.write("src/made.txt", b"made by a step\n")
    parent.delete("docs/a/b/deep.txt")
    parent.chmod("README.md", 0o755)
    parent.set_state("src/lnk", None)
    parent.close()
    return snap, parent


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(edits, max_size=12),
    st.booleans(),
    st.booleans(),
    st.lists(edits, max_size=12),
)
def test_a_reset_directory_is_a_fresh_materialization(
    space: Path,
    ops: list[tuple[object, ...]],
    layered: bool,
    watch: bool,
    later: list[tuple[object, ...]],
) -> None:
    """Whatever the agent did to its directory, the reset one equals a fresh checkout (the
    second time, by the paths its watches saw touched, when watched)."""
    top = Path(tempfile.mkdtemp(dir=space))
    snap, parent = fresh_snapshot(top)
    base: Branch | Snapshot = parent if layered else snap

    def fork(name: str) -> Branch:
        return base.fork(name) if isinstance(base, Branch) else Branch.from_tree(base, name)

    outside = top / "outside"
    outside.mkdir()
    pool = DirPool(str(top / "b" / ".pool"), 2, min_files=0)
    first = materialize(fork("one"), top / "b" / "one", watch=watch)
    pool.adopt(first)
    for op in ops:
        apply_edit(first, op, outside)
    first.harvest(full=True)
    assert pool.give(first) == []
    assert not os.path.lexists(top / "b" / "one")  # parked: its old path leads nowhere
    discarded: list[str] = []
    second = fork("two")
    reused = pool.take(second, top / "b" / "two", discard=discarded.append)
    assert reused is not None and discarded == []
    fresh = materialize(fork("three"), top / "b" / "three")
    assert tree_of(reused.root) == tree_of(fresh.root)
    # the workdir is one of its tree: nothing to harvest, and it harvests what changes next
    assert reused.watching is watch
    assert not reused.harvest(full=True).changed
    assert not second.changes
    Path(reused.root, "src/main.py").write_text("changed\n")
    assert reused.harvest().modified == ("src/main.py",)
    for op in later:
        apply_edit(reused, op, outside)
    reused.harvest(full=True)
    # and reset once more, it is the tree again
    assert pool.give(reused) == []
    again = pool.take(fork("four"), top / "b" / "four", discard=discarded.append)
    assert again is not None
    assert tree_of(again.root) == tree_of(fresh.root)
    assert not again.harvest(full=True).changed
    assert pool.stats.reused == 2 and pool.stats.made == 1
    if watch and not any(op[0] in ("rename", "remove", "fs_delete", "mkdir") for op in later):
        assert pool.listed == 1  # the first reset listed it, the second went by its watches
    again.close()
    fresh.close()
    shutil.rmtree(top)


# --------------------------------------------------------------------------- layered changes

LAYER_PATHS = ["README.md", "src/main.py", "src/new.txt", "docs/a/b/deep.txt", "new/dir/f",
               ".gitignore", "src/.gitignore", "link.md", "abs.md", "run.sh", "x.log",
               "e/m/p/t/y"]  # fmt: skip
layer_paths = st.sampled_from(LAYER_PATHS)
contents = st.one_of(data, st.sampled_from([b"*.py\n", b"new/\n", b"# readme\n"]))

layer_changes = st.one_of(
    st.tuples(st.just("write"), layer_paths, contents, st.sampled_from([0o100644, 0o100755])),
    st.tuples(st.just("link"), layer_paths, st.sampled_from(["README.md", "/tmp", "ABS", "src"])),
    st.tuples(st.just("delete"), layer_paths),
    st.tuples(st.just("chmod"), layer_paths, st.sampled_from([0o644, 0o755, 0o600])),
)


def layered(base: Branch | Snapshot, name: str, changes: list[tuple[object, ...]]) -> Branch:
    """A branch of ``base`` holding ``changes`` (one that cannot be made is skipped), closed:
    a tree to fork steps from, as a step's merged result is."""
    branch = base.fork(name) if isinstance(base, Branch) else Branch.from_tree(base, name)
    ws = branch.root.root  # type: ignore[attr-defined]
    for change in changes:
        kind, path = change[0], str(change[1])
        try:
            if kind == "write":
                branch.write(path, change[2], change[3])  # type: ignore[arg-type]
            elif kind == "link":
                target = f"{ws}/README.md" if change[2] == "ABS" else str(change[2])
                branch.write(path, name_bytes(target), stat.S_IFLNK | 0o777)
            elif kind == "delete":
                branch.delete(path)
            else:
                branch.chmod(path, int(change[2]))  # type: ignore[call-overload]
        except Exception as e:  # absent: nothing to delete or chmod
            if not type(e).__module__.startswith("orchestrator"):
                raise
    branch.close()
    return branch


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    st.lists(layer_changes, max_size=6),
    st.lists(layer_changes, max_size=6),
    st.booleans(),
    st.lists(edits, max_size=8),
    st.booleans(),
)
def test_a_directory_of_other_changes_is_reset_to_the_tree(
    space: Path,
    before: list[tuple[object, ...]],
    after: list[tuple[object, ...]],
    stacked: bool,
    ops: list[tuple[object, ...]],
    watch: bool,
) -> None:
    """A directory of the same snapshot with other changes layered on it, whatever the agent
    did to it, is reset to equal a fresh checkout of the tree asked for, and back."""
    top = Path(tempfile.mkdtemp(dir=space))
    snap = make_workspace(top)
    origin = layered(snap, "origin", before)
    # the next tree: of the snapshot, or layered on the first (a step after a step)
    wanted = layered(origin if stacked else snap, "wanted", after)
    outside = top / "outside"
    outside.mkdir()
    pool = DirPool(str(top / "b" / ".pool"), 2, min_files=0)
    first = materialize(origin.fork("one"), top / "b" / "one", watch=watch)
    pool.adopt(first)
    for op in ops:
        apply_edit(first, op, outside)
    first.harvest(full=True)
    assert pool.give(first) == []
    discarded: list[str] = []
    second = wanted.fork("two")
    reused = pool.take(second, top / "b" / "two", discard=discarded.append)
    assert reused is not None and discarded == []
    fresh = materialize(wanted.fork("three"), top / "b" / "three")
    assert tree_of(reused.root) == tree_of(fresh.root)
    assert reused.watching is watch
    assert not reused.harvest(full=True).changed
    assert not second.changes
    Path(reused.root, "src/util/helpers.py").write_text("changed\n")  # no layer's path
    assert reused.harvest().modified == ("src/util/helpers.py",)
    # and reset to the first tree again
    assert pool.give(reused) == []
    again = pool.take(origin.fork("four"), top / "b" / "four", discard=discarded.append)
    assert again is not None and discarded == []
    first_fresh = materialize(origin.fork("five"), top / "b" / "five")
    assert tree_of(again.root) == tree_of(first_fresh.root)
    assert not again.harvest(full=True).changed
    assert pool.stats.reused == 2 and pool.stats.made == 1
    for wd in (again, fresh, first_fresh):
        wd.close()
    shutil.rmtree(top)


def watched_reuse(top: Path, snap: Snapshot) -> tuple[DirPool, Workdir]:
    """A pool and a directory it reset: every directory and file of it watched since."""
    pool = DirPool(str(top / "b" / ".pool"), 2, min_files=0)
    first = materialize(Branch.from_tree(snap, "one"), top / "b" / "one", watch=True)
    pool.adopt(first)
    first.harvest(full=True)
    assert pool.give(first) == []
    reused = pool.take(Branch.from_tree(snap, "two"), top / "b" / "two", discard=print)
    assert reused is not None and reused._watcher is not None and reused._watcher.complete
    return pool, reused


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(st.lists(edits, max_size=16))
def test_a_harvest_by_the_watches_misses_nothing_a_listing_finds(
    space: Path, ops: list[tuple[object, ...]]
) -> None:
    """In a directory every file and directory of which is watched, a full harvest goes by
    the events, and a listing right after it finds nothing more."""
    top = Path(tempfile.mkdtemp(dir=space))
    snap = make_workspace(top)
    outside = top / "outside"
    outside.mkdir()
    _, wd = watched_reuse(top, snap)
    for op in ops:
        apply_edit(wd, op, outside)
    told = wd.harvest(full=True)
    watcher = wd.detach_watcher()
    assert watcher is not None
    by_events = watcher.complete
    watcher.close()
    listed = wd.harvest(full=True)
    assert listed.full_scan and not listed.changed, listed
    if by_events:
        assert not told.full_scan
    wd.close()
    shutil.rmtree(top)


def test_a_write_through_a_live_mapping_is_harvested(space: Path) -> None:
    """A file mapped and written by a process still holding the mapping (no write event
    yet) is harvested when the directory goes by its watches."""
    snap = make_workspace(space)
    _, wd = watched_reuse(space, snap)
    path = Path(wd.root, "src/main.py")
    f = open(path, "r+b")  # noqa: SIM115 (held across the harvest)
    m = mmap.mmap(f.fileno(), 0)
    try:
        time.sleep(0.02)  # the write's mtime is not the one recorded
        m[0:5] = b"PRINT"
        report = wd.harvest(full=True)
        assert not report.full_scan
        assert report.modified == ("src/main.py",)
    finally:
        m.close()
        f.close()
    wd.close()


def test_an_outside_name_written_later_is_harvested(space: Path) -> None:
    """A file the agent made, given a second name outside the directory and written through
    it after a harvest, is harvested with what was written last."""
    snap = make_workspace(space)
    _, wd = watched_reuse(space, snap)
    Path(wd.root, "new.txt").write_text("one\n")
    os.utime(Path(wd.root, "new.txt"), ns=(10**18, 10**18))  # settled: never read again
    assert wd.harvest().added == ("new.txt",)
    assert not wd.harvest().changed  # the harvest's own read of it told
    os.link(Path(wd.root, "new.txt"), space / "other-name")
    before = os.lstat(space / "other-name")
    (space / "other-name").write_text("two\n")
    os.utime(space / "other-name", ns=(before.st_atime_ns, before.st_mtime_ns))
    report = wd.harvest(full=True)
    assert not report.full_scan and report.modified == ("new.txt",)
    assert wd.branch.read("new.txt") == b"two\n"
    wd.close()


def test_a_write_through_one_name_of_two_is_harvested_for_both(space: Path) -> None:
    """A file of the tree the agent gave a second name in the directory, written through that
    one: both paths are harvested with what was written."""
    snap = make_workspace(space)
    _, wd = watched_reuse(space, snap)
    os.link(Path(wd.root, "README.md"), Path(wd.root, "second.md"))
    assert wd.harvest().added == ("second.md",)
    with open(Path(wd.root, "second.md"), "ab") as f:
        f.write(b"more\n")
    report = wd.harvest(full=True)
    assert not report.full_scan
    assert set(report.modified) == {"README.md", "second.md"}
    assert wd.branch.read("README.md") == b"# readme\nmore\n"
    wd.close()


def listing_after(wd: Workdir) -> HarvestReport:
    """What a full listing finds after the harvests so far (the watches let go first)."""
    watcher = wd.detach_watcher()
    if watcher is not None:
        watcher.close()
    return wd.harvest(full=True)


def test_a_file_made_a_directory_keeps_its_watch_on_what_is_made_in_it(space: Path) -> None:
    """A file of the tree made a directory: what is made in that directory later is
    harvested (watching the path as a file does not take the directory's watch away)."""
    snap = make_workspace(space)
    _, wd = watched_reuse(space, snap)
    root = Path(wd.root)
    (root / "README.md").unlink()
    (root / "README.md").mkdir()
    wd.harvest()
    (root / "README.md/sub").mkdir()
    (root / "README.md/sub/f").write_text("new\n")
    (root / "README.md/g").symlink_to("x")
    told = wd.harvest(full=True)
    assert not told.full_scan and set(told.added) == {"README.md/sub/f", "README.md/g"}
    assert not listing_after(wd).changed


def test_a_directory_swapped_in_after_the_last_harvest_is_listed(space: Path) -> None:
    """The directory moved away after its last harvest and a copy with more in it put in
    its place: the reset lists it, as it is not the directory the watches are on."""
    snap = make_workspace(space)
    pool, wd = watched_reuse(space, snap)
    wd.harvest(full=True)
    os.rename(wd.root, space / "away")
    shutil.copytree(space / "away", wd.root, symlinks=True)
    Path(wd.root, "planted.txt").write_text("not of the tree\n")
    Path(wd.root, "README.md").write_text("changed\n")
    assert pool.give(wd) == []
    reused = pool.take(Branch.from_tree(snap, "three"), space / "b" / "three", discard=print)
    assert reused is not None and pool.listed == 2
    fresh = materialize(Branch.from_tree(snap, "four"), space / "b" / "four")
    assert tree_of(reused.root) == tree_of(fresh.root)


def test_a_directory_watched_by_a_symlinked_path_is_not_taken_for_watched(space: Path) -> None:
    """A directory of the tree made a symlink to another: watching through it reaches the
    other directory, whose events would then name the wrong path; the watches do not count
    as complete, and the next reset lists."""
    ws = make_tree(space / "ws", {"d/x": "file\n", "e/x/y": "y\n", "a": "a\n", "b": "b\n"})
    snap = Workspace.open(ws).snapshot()
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    first = materialize(Branch.from_tree(snap, "one"), space / "b" / "one", watch=True)
    pool.adopt(first)
    root = Path(first.root)
    shutil.rmtree(root / "d")
    (root / "d").symlink_to("e")
    first.harvest(full=True)
    assert pool.give(first) == []
    wd = pool.take(Branch.from_tree(snap, "two"), space / "b" / "two", discard=print)
    assert wd is not None
    fresh = materialize(Branch.from_tree(snap, "f"), space / "b" / "f")
    assert tree_of(wd.root) == tree_of(fresh.root)
    r = Path(wd.root)
    (r / "e/x/l").symlink_to("nowhere")
    (r / "e/x/sub").mkdir()
    (r / "e/x/sub/f").write_text("x\n")
    told = wd.harvest(full=True)
    assert set(told.added) == {"e/x/l", "e/x/sub/f"}
    assert pool.give(wd) == []
    again = pool.take(Branch.from_tree(snap, "three"), space / "b" / "three", discard=print)
    assert again is not None
    assert tree_of(again.root) == tree_of(fresh.root)


def test_a_file_brought_back_in_an_ignored_directory_is_watched(space: Path) -> None:
    """A file of the base deleted, then made again in a directory a new pattern ignores, and
    written in place later: the full harvest finds the last write."""
    snap = make_workspace(space)
    _, wd = watched_reuse(space, snap)
    r = Path(wd.root)
    shutil.rmtree(r / "src")
    (r / ".gitignore").write_text("*.log\nbuild/\nsrc/\n")
    os.utime(r / ".gitignore", ns=(10**18, 10**18))
    wd.harvest()
    wd.harvest()
    (r / "src").mkdir()
    (r / "src/main.py").write_text("v2\n")
    wd.harvest()
    time.sleep(0.05)
    with open(r / "src/main.py", "r+") as f:  # in place: the same inode
        f.write("v3")
    told = wd.harvest(full=True)
    assert "src/main.py" in told.modified and wd.branch.read("src/main.py") == b"v3\n"
    assert not listing_after(wd).changed


def test_reading_files_does_not_send_harvests_to_listings(space: Path) -> None:
    """Reading ``.gitignore`` is no change of the rules, and reading more files than the
    kernel queues events for (a ``grep -r``) does not overflow the queue: the harvests and
    the next reset go by the events."""
    ws = make_tree(space / "ws", {f"d{n % 20}/f{n}.txt": "x\n" for n in range(12000)})
    (ws / ".gitignore").write_text("*.log\n")
    snap = Workspace.open(ws).snapshot()
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    first = materialize(Branch.from_tree(snap, "one"), space / "b" / "one", watch=True)
    pool.adopt(first)
    first.harvest(full=True)
    assert pool.give(first) == []
    wd = pool.take(Branch.from_tree(snap, "two"), space / "b" / "two", discard=print)
    assert wd is not None
    wd.harvest()
    Path(wd.root, ".gitignore").read_text()
    assert not wd.harvest().full_scan
    for n in range(12000):  # as grep -r does: every file opened and read
        Path(wd.root, f"d{n % 20}/f{n}.txt").read_bytes()
    assert not wd.harvest(full=True).full_scan
    assert pool.give(wd) == []
    again = pool.take(Branch.from_tree(snap, "three"), space / "b" / "three", discard=print)
    assert again is not None and pool.listed == 1
    again.close()


def test_watches_are_given_back(space: Path) -> None:
    """Files the agent made and deleted here, kept alive by another name, lose their
    watches at the reset; every watch is given back when the pool is cleared."""
    held = _inotify._files_held
    snap = make_workspace(space)
    outside = space / "outside"
    outside.mkdir()
    pool, wd = watched_reuse(space, snap)
    r = Path(wd.root)
    for i in range(5):
        (r / f"n{i}.txt").write_text("x")
    wd.harvest()
    for i in range(5):
        os.link(r / f"n{i}.txt", outside / f"h{i}")
        (r / f"n{i}.txt").unlink()
    wd.harvest(full=True)
    assert pool.give(wd) == []
    again = pool.take(Branch.from_tree(snap, "x"), space / "b" / "x", discard=print)
    assert again is not None and again._watcher is not None
    watcher = again._watcher
    watcher.read()
    with open(f"/proc/self/fdinfo/{watcher.fd}") as f:
        in_kernel = sum(1 for line in f if line.startswith("inotify wd:"))
    assert in_kernel == len(watcher._by_wd) + len(watcher._files)
    assert set(watcher._file_wd) == set(again._records)
    again.close()
    for path in pool.clear():
        shutil.rmtree(path)
    assert _inotify._files_held == held


def test_another_directory_in_the_pooled_ones_place_is_listed(space: Path) -> None:
    """A directory put where the pooled one was (not the one its watches are on) is listed,
    and reset to its tree like any."""
    snap = make_workspace(space)
    pool, wd = watched_reuse(space, snap)
    assert pool.listed == 1
    assert pool.give(wd) == []
    (parked,) = pool._parked
    os.rename(parked.path, space / "moved-away")
    shutil.copytree(space / "moved-away", parked.path, symlinks=True)
    Path(parked.path, "planted.txt").write_text("not of the tree\n")
    reused = pool.take(Branch.from_tree(snap, "three"), space / "b" / "three", discard=print)
    assert reused is not None and pool.listed == 2
    fresh = materialize(Branch.from_tree(snap, "four"), space / "b" / "four")
    assert tree_of(reused.root) == tree_of(fresh.root)


def test_an_overflowed_event_queue_means_a_listing(space: Path) -> None:
    """More events than the kernel queues: the final harvest and the reset list the
    directory, and it is its tree again."""
    snap = make_workspace(space)
    pool, wd = watched_reuse(space, snap)
    with open("/proc/sys/fs/inotify/max_queued_events") as f:
        queued = int(f.read())
    a, b = Path(wd.root, "README.md"), Path(wd.root, "src/main.py")
    for i in range(queued // 2 + 10):  # two paths in turn: never merged into one event
        os.utime(a, ns=(i, i))
        os.utime(b, ns=(i, i))
    Path(wd.root, "src/util/helpers.py").write_text("changed\n")
    report = wd.harvest(full=True)
    assert report.full_scan and "src/util/helpers.py" in report.modified
    assert pool.give(wd) == []
    reused = pool.take(Branch.from_tree(snap, "three"), space / "b" / "three", discard=print)
    assert reused is not None and pool.listed == 2
    fresh = materialize(Branch.from_tree(snap, "four"), space / "b" / "four")
    assert tree_of(reused.root) == tree_of(fresh.root)


def test_a_reset_to_other_changes_costs_what_differs(space: Path) -> None:
    """Between two trees of one snapshot, a reset writes the paths they differ in, no more."""
    ws = make_tree(space / "ws", {f"d{n % 10}/f{n}.txt": f"{n}\n" for n in range(300)})
    snap = Workspace.open(ws).snapshot()
    pool = DirPool(str(space / "b" / ".pool"), 2)
    origin = layered(snap, "origin", [("write", "d1/f1.txt", b"one\n", 0o100644)])
    wanted = layered(
        snap,
        "wanted",
        [("write", "d2/f2.txt", b"two\n", 0o100755), ("delete", "d3/f3.txt")],
    )
    wd = materialize(origin.fork("one"), space / "b" / "one")
    pool.adopt(wd)
    pool.give(wd)
    reused = pool.take(wanted.fork("two"), space / "b" / "two", discard=print)
    assert reused is not None
    # d1/f1.txt written back as the workspace's, d2/f2.txt as the change's, d3/f3.txt removed
    removed, written = len("one\n2\n3\n"), len("1\ntwo\n")
    assert (pool.stats.reset_paths, pool.stats.reset_bytes) == (3, removed + written)
    assert (reused.copies.copied + reused.copies.reflinked) == 2
    assert Path(reused.root, "d1/f1.txt").read_text() == "1\n"
    assert Path(reused.root, "d2/f2.txt").read_text() == "two\n"
    assert stat.S_IMODE(os.lstat(Path(reused.root, "d2/f2.txt")).st_mode) == 0o755
    assert not Path(reused.root, "d3/f3.txt").exists()


def test_a_directory_of_the_very_tree_is_preferred(space: Path) -> None:
    """Of two pooled directories of one snapshot, the one of the tree asked for is reset."""
    snap, parent = fresh_snapshot(space)
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    for name, base in (("one", parent), ("two", None)):
        wd = materialize(
            base.fork(name) if base is not None else Branch.from_tree(snap, name),
            space / "b" / name,
        )
        pool.adopt(wd)
        pool.give(wd)
    # the directory of the snapshot alone, parked last, would need the parent's changes
    reused = pool.take(parent.fork("three"), space / "b" / "three", discard=print)
    assert reused is not None
    assert reused.copies.copied + reused.copies.reflinked == 0  # no file written again
    assert Path(reused.root, "src/made.txt").exists()
    reused = pool.take(Branch.from_tree(snap, "four"), space / "b" / "four", discard=print)
    assert reused is not None
    assert reused.copies.copied + reused.copies.reflinked == 0
    assert not Path(reused.root, "src/made.txt").exists()


def test_a_snapshot_never_serves_another(space: Path) -> None:
    """A pooled directory serves only branches of the snapshot it was made from."""
    snap, parent = fresh_snapshot(space)
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    wd = materialize(parent.fork("one"), space / "b" / "one")
    pool.adopt(wd)
    pool.give(wd)
    again = Workspace.open(snap.root).snapshot()  # the same files, another snapshot
    assert pool.take(Branch.from_tree(again, "two"), space / "b" / "two", discard=print) is None
    assert pool.take(parent.fork("x"), space / "b" / "x", discard=print) is not None


def test_a_reset_costs_what_changed(space: Path) -> None:
    """Of a 300-file tree, a reset writes again the file changed and removes the one added."""
    ws = make_tree(space / "ws", {f"d{n % 10}/f{n}.txt": f"{n}\n" for n in range(300)})
    snap = Workspace.open(ws).snapshot()
    pool = DirPool(str(space / "b" / ".pool"), 2)
    wd = materialize(Branch.from_tree(snap, "one"), space / "b" / "one")
    pool.adopt(wd)
    Path(wd.root, "d3/f3.txt").write_text("changed\n")
    Path(wd.root, "new.log").write_text("new\n")
    pool.give(wd)
    reused = pool.take(Branch.from_tree(snap, "two"), space / "b" / "two", discard=print)
    assert reused is not None
    assert (pool.stats.reset_paths, pool.stats.reset_bytes) == (2, len("changed\n3\nnew\n"))
    assert (reused.copies.copied + reused.copies.reflinked) == 1
    assert Path(reused.root, "d3/f3.txt").read_text() == "3\n"
    assert not Path(reused.root, "new.log").exists()


def test_an_empty_tree_is_pooled_and_reset(space: Path) -> None:
    """A tree of no file at all (a pool told to keep any) is pooled, and reset to nothing."""
    (space / "ws").mkdir()
    snap = Workspace.open(space / "ws").snapshot()
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    wd = materialize(Branch.from_tree(snap, "one"), space / "b" / "one")
    pool.adopt(wd)
    Path(wd.root, "left.txt").write_text("left behind\n")
    assert pool.give(wd) == []
    reused = pool.take(Branch.from_tree(snap, "two"), space / "b" / "two", discard=print)
    assert reused is not None
    assert os.listdir(reused.root) == []


def test_a_path_too_long_for_the_new_directory_discards_the_pooled_one(space: Path) -> None:
    """A tree whose longest path fits under the pooled directory's path but not under the one
    asked for is not reset there: the directory is discarded (a checkout refuses it too)."""
    ws = make_tree(space / "ws", {"a.txt": "a\n"})
    room = PATH_MAX - 2 - len(os.fsencode(space / "b" / "one"))
    name = "p" * 200
    deep = make_chain(ws, (room - len("/f.txt")) // (len(name) + 1), name)
    snap = Workspace.open(ws).snapshot()
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    wd = materialize(Branch.from_tree(snap, "one"), space / "b" / "one")
    pool.adopt(wd)
    pool.give(wd)
    (space / ("t" * 200)).mkdir()
    discarded: list[str] = []
    longer = space / ("t" * 200) / "two"
    assert pool.take(Branch.from_tree(snap, "two"), longer, discard=discarded.append) is None
    assert len(discarded) == 1 and not longer.exists()
    with pytest.raises(PathRefused, match="too long to check out"):
        materialize(Branch.from_tree(snap, "three"), longer)
    # one that fits is reset
    wd = materialize(Branch.from_tree(snap, "four"), space / "b" / "four")
    pool.adopt(wd)
    pool.give(wd)
    reused = pool.take(Branch.from_tree(snap, "five"), space / "b" / "five", discard=print)
    assert reused is not None
    assert reused.read(deep) == b"deep\n"


def test_a_small_tree_is_not_pooled(space: Path) -> None:
    """A tree of fewer files than the pool's minimum is written afresh: never pooled."""
    snap = make_workspace(space)
    pool = DirPool(str(space / "b" / ".pool"), 2)  # REUSE_MIN_FILES: more than this tree
    wd = materialize(Branch.from_tree(snap, "one"), space / "b" / "one")
    pool.adopt(wd)
    assert not pool.holds(wd)
    assert pool.give(wd) == [wd.root]
    assert pool.take(Branch.from_tree(snap, "two"), space / "b" / "two", discard=print) is None


def test_the_pool_is_bounded(space: Path) -> None:
    """One directory more than the limit evicts the oldest, to be deleted."""
    snap = make_workspace(space)
    pool = DirPool(str(space / "b" / ".pool"), 1, min_files=0)
    made = []
    for name in ("one", "two"):
        wd = materialize(Branch.from_tree(snap, name), space / "b" / name)
        pool.adopt(wd)
        made.append(wd)
    assert pool.give(made[0]) == []
    evicted = pool.give(made[1])
    assert len(evicted) == 1 and pool.stats.evicted == 1
    assert pool.clear() != []


def _daemon(code: str, cwd: Path) -> subprocess.Popen[bytes]:
    """A process left running by the agent; it says ``ready`` once started."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], cwd=cwd, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ready\n"
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Kill a process of :func:`_daemon` and reap it."""
    proc.kill()
    proc.wait()
    assert proc.stdout is not None
    proc.stdout.close()


@pytest.mark.parametrize(
    "code",
    [
        # a background job working in the directory
        "import time; print('ready', flush=True); time.sleep(3600)",
        # one holding a file of it open, its working directory elsewhere
        "import os, time; f = open('README.md', 'a'); os.chdir('/'); print('ready', flush=True);"
        " time.sleep(3600)",
        # one with a file of it mapped and closed (mmap(2): Python's mmap keeps a descriptor),
        # its working directory elsewhere
        "import ctypes, os, time; libc = ctypes.CDLL(None); libc.mmap.restype = ctypes.c_void_p;"
        " libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3"
        " + [ctypes.c_long]; fd = os.open('README.md', os.O_RDONLY);"
        " assert libc.mmap(None, 4096, 1, 1, fd, 0) != ctypes.c_void_p(-1).value;"
        " os.close(fd); os.chdir('/'); print('ready', flush=True); time.sleep(3600)",
    ],
    ids=["cwd", "open-file", "mapped-file"],
)
def test_a_directory_a_process_holds_is_never_reset(space: Path, code: str) -> None:
    """A process left holding the directory keeps it out of reuse until it is gone."""
    snap = make_workspace(space)
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    wd = materialize(Branch.from_tree(snap, "one"), space / "b" / "one")
    pool.adopt(wd)
    proc = _daemon(code, Path(wd.root))
    try:
        Path(wd.root, "README.md").write_text("written by the job\n")
        pool.give(wd)
        held = pool.stats
        assert pool.take(Branch.from_tree(snap, "two"), space / "b" / "two", discard=print) is None
        assert pool.stats == held  # not reset, not discarded: parked again
        assert not os.path.lexists(space / "b" / "two")
    finally:
        stop(proc)
    reused = pool.take(Branch.from_tree(snap, "three"), space / "b" / "three", discard=print)
    assert reused is not None
    assert Path(reused.root, "README.md").read_text() == "# readme\n"


@pytest.mark.parametrize(
    "code",
    [
        "import time; print('ready', flush=True); time.sleep(3600)",
        "import os, time; f = open('main.py', 'a'); os.chdir('/'); print('ready', flush=True);"
        " time.sleep(3600)",
        "import ctypes, os, time; libc = ctypes.CDLL(None); libc.mmap.restype = ctypes.c_void_p;"
        " libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t] + [ctypes.c_int] * 3"
        " + [ctypes.c_long]; fd = os.open('main.py', os.O_RDWR);"
        " assert libc.mmap(None, 4096, 3, 1, fd, 0) != ctypes.c_void_p(-1).value;"
        " os.close(fd); os.chdir('/'); print('ready', flush=True); time.sleep(3600)",
    ],
    ids=["cwd", "open-file", "mapped-file"],
)
def test_a_process_holding_it_through_an_unmounted_bind_is_found(space: Path, code: str) -> None:
    """A process that reached the directory through a bind mount, lazily unmounted since (the
    paths ``/proc`` shows for what it holds lead elsewhere), keeps it out of reuse: what it
    holds is told by device and inode."""
    snap = make_workspace(space)
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    wd = materialize(Branch.from_tree(snap, "one"), space / "b" / "one")
    pool.adopt(wd)
    mnt = space / "mnt"
    mnt.mkdir()
    with bind_mount(Path(wd.root, "src"), mnt):
        proc = _daemon(code, mnt)
    try:
        assert proc.pid not in find_holders(wd.root)  # by path: not seen
        pool.give(wd)
        held = pool.stats
        assert pool.take(Branch.from_tree(snap, "two"), space / "b" / "two", discard=print) is None
        assert pool.stats == held
    finally:
        stop(proc)
    reused = pool.take(Branch.from_tree(snap, "three"), space / "b" / "three", discard=print)
    assert reused is not None


def test_a_writer_by_absolute_path_misses_the_pooled_directory(space: Path) -> None:
    """A job writing by the old absolute path finds it gone once the directory is pooled."""
    snap = make_workspace(space)
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    wd = materialize(Branch.from_tree(snap, "one"), space / "b" / "one")
    pool.adopt(wd)
    old = Path(wd.root, "src/main.py")
    pool.give(wd)
    with pytest.raises(FileNotFoundError):
        old.write_text("too late\n")
    reused = pool.take(Branch.from_tree(snap, "two"), space / "b" / "two", discard=print)
    assert reused is not None
    assert Path(reused.root, "src/main.py").read_text() == "print('hi')\n"


def test_a_hard_link_made_after_the_last_harvest_is_not_kept(space: Path) -> None:
    """A second name given to a file after the directory's last harvest (no change event
    says so) is not left on the reset directory's file."""
    snap = make_workspace(space)
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    wd = materialize(Branch.from_tree(snap, "one"), space / "b" / "one", watch=True)
    pool.adopt(wd)
    wd.harvest(full=True)
    os.link(Path(wd.root, "README.md"), space / "second-name")
    pool.give(wd)
    reused = pool.take(Branch.from_tree(snap, "two"), space / "b" / "two", discard=print)
    assert reused is not None
    fresh = materialize(Branch.from_tree(snap, "three"), space / "b" / "three")
    assert tree_of(reused.root) == tree_of(fresh.root)  # every file there has one name
    (space / "second-name").write_text("later\n")
    assert Path(reused.root, "README.md").read_text() == "# readme\n"


def test_a_directory_that_cannot_be_proven_is_discarded(space: Path) -> None:
    """An error while resetting discards the directory (handed back to delete) and says None."""
    snap = make_workspace(space)
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    wd = materialize(Branch.from_tree(snap, "one"), space / "b" / "one")
    pool.adopt(wd)
    # a workspace file changed since the snapshot: the agent's edit of its copy cannot be undone
    Path(wd.root, "src/main.py").write_text("edited\n")
    Path(snap.root, "src/main.py").write_text("changed in the workspace\n")
    pool.give(wd)
    discarded: list[str] = []
    assert (
        pool.take(Branch.from_tree(snap, "two"), space / "b" / "two", discard=discarded.append)
        is None
    )
    assert len(discarded) == 1 and pool.stats.discarded == 1
    assert not os.path.lexists(space / "b" / "two")


def _outside(space: Path) -> tuple[Path, dict[str, bytes]]:
    """A directory outside every branch, with files, and what it holds."""
    outside = space / "precious"
    (outside / "sub").mkdir(parents=True)
    (outside / "keep.txt").write_text("keep\n")
    (outside / "sub" / "helpers.py").write_text("not the tree's\n")
    return outside, _files(outside)


def _files(top: Path) -> dict[str, bytes]:
    """The files below ``top`` and their content."""
    return {str(p.relative_to(top)): p.read_bytes() for p in sorted(top.rglob("*")) if p.is_file()}


def test_a_directory_given_back_with_a_mount_in_it_is_not_pooled(space: Path) -> None:
    """A directory the agent bind-mounted a directory elsewhere into is handed back for
    deletion, which leaves the mounted directory's files alone."""
    snap = make_workspace(space)
    outside, before = _outside(space)
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    wd = materialize(Branch.from_tree(snap, "one"), space / "b" / "one")
    pool.adopt(wd)
    with bind_mount(outside, Path(wd.root, "src/util")):
        assert pool.give(wd) == [wd.root]
        left = remove_tree(wd.root)
        assert _files(outside) == before
        assert left == [os.path.join(wd.root, "src/util")]
    assert pool.take(Branch.from_tree(snap, "two"), space / "b" / "two", discard=print) is None


@pytest.mark.parametrize("table", ["listing it", "read before it"])
def test_a_pooled_directory_with_a_mount_in_it_is_discarded(
    space: Path, monkeypatch: pytest.MonkeyPatch, table: str
) -> None:
    """A bind mount made in a pooled directory (same device: no stat tells it) discards it
    before anything is removed or written, whether the mount table lists it or was read
    before it was made (the reset's walk tells each directory's mount once it is open): the
    mounted directory keeps its files, none of the tree's is written there, and the branch
    gets another directory reset to its exact tree."""
    snap = make_workspace(space)
    outside, before = _outside(space)
    pool = DirPool(str(space / "b" / ".pool"), 2, min_files=0)
    for name in ("one", "two"):
        wd = materialize(Branch.from_tree(snap, name), space / "b" / name)
        pool.adopt(wd)
        assert pool.give(wd) == []
    first = space / "b" / ".pool" / "pool-0"  # taken first: given back first
    assert (first / "src" / "util" / "helpers.py").is_file()
    if table == "read before it":
        monkeypatch.setattr(vfs_pool, "mounts_under", lambda directory: [])
    discarded: list[str] = []
    with bind_mount(outside, first / "src" / "util"):
        reused = pool.take(
            Branch.from_tree(snap, "three"), space / "b" / "three", discard=discarded.append
        )
        assert _files(outside) == before
        assert reused is not None
        assert pool.stats.discarded == 1 and len(discarded) == 1
        (aside,) = discarded
        left = remove_tree(aside)
        assert _files(outside) == before
        assert left == [os.path.join(aside, "src/util")]
    fresh = materialize(Branch.from_tree(snap, "four"), space / "b" / "four")
    assert tree_of(reused.root) == tree_of(fresh.root)
    assert mounts_under(reused.root) == []


def test_holders_are_found(space: Path) -> None:
    """find_holders names a process whose working directory is inside the directory."""
    (space / "d").mkdir()
    proc = _daemon("import time; print('ready', flush=True); time.sleep(3600)", space / "d")
    try:
        assert proc.pid in find_holders(str(space / "d"))
        assert proc.pid not in find_holders(str(space / "elsewhere"))
    finally:
        stop(proc)


@pytest.mark.parametrize(
    ("value", "on"),
    [("", True), ("1", True), (" Yes ", True), ("on", True), ("TRUE", True),
     ("0", False), ("no", False), ("Off", False), ("false", False)],
)  # fmt: skip
def test_the_reuse_setting_reads_yes_and_no(
    monkeypatch: pytest.MonkeyPatch, value: str, on: bool
) -> None:
    """ORCHESTRATOR_REUSE_DIRS: the usual words for yes and no, in any case and spacing."""
    monkeypatch.setenv("ORCHESTRATOR_REUSE_DIRS", value)
    assert reuse_enabled_by_env() is on


@pytest.mark.parametrize("value", ["banana", "2", "00", "nope"])
def test_a_reuse_setting_neither_yes_nor_no_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    """A value that says neither is a usage error naming it, never taken for either."""
    monkeypatch.setenv("ORCHESTRATOR_REUSE_DIRS", value)
    with pytest.raises(UsageError, match=f"ORCHESTRATOR_REUSE_DIRS={value!r}"):
        reuse_enabled_by_env()
