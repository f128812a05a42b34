"""Tests for orchestrator.vfs._statwalk and _harvestlines: find's lines, foretold and used."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import stat_walk

from orchestrator._names import name_bytes
from orchestrator.vfs import _harvestlines, _poolscan, _statwalk
from orchestrator.vfs.branch import Branch
from orchestrator.vfs.checkout import materialize
from orchestrator.vfs.errors import PathRefused
from orchestrator.vfs.pool import DirPool
from orchestrator.vfs.snapshot import Workspace
from orchestrator.vfs.testing import make_tree
from orchestrator.vfs.workdir import Workdir

ODD_NAMES = ["a b", "-x", "line\nbreak", "tab\there", "back\\slash", "%P", "d\xe9j\xe0"]


@pytest.fixture
def find() -> str:
    """GNU find, or the test is skipped."""
    found = _statwalk.find_command()
    if found is None:
        pytest.skip("no GNU find here: directories are walked by this process only")
    return found


def _key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode, st.st_ctime_ns)


def _expected(top: Path) -> list[bytes]:
    """The lines foretold for every entry below ``top``, from this process's lstat."""
    out: list[bytes] = []
    for path in [top, *sorted(top.rglob("*"))]:
        st = os.lstat(path)
        rel = name_bytes(os.path.relpath(path, top)) if path != top else b""
        if stat.S_ISDIR(st.st_mode):
            owner = (st.st_uid, st.st_gid)
            out.append(_statwalk.dir_line(rel, st.st_dev, stat.S_IMODE(st.st_mode), owner))
        else:
            out.append(_statwalk.file_line(rel, _key(st), st.st_dev))
    return out


def test_every_kind_of_entry_is_foretold(find: str, tmp_path: Path) -> None:
    """Files of odd names and modes, links, a FIFO and directories print the lines foretold."""
    top = tmp_path / "t"
    (top / "sub").mkdir(parents=True)
    for name in ODD_NAMES:
        (top / "sub" / name).write_bytes(name.encode("utf-8", "surrogateescape"))
    os.chmod(top / "sub" / "a b", 0o4755)
    os.chmod(top / "sub", 0o1777)
    (top / "link").symlink_to("sub/a b")
    os.mkfifo(top / "fifo")
    raw = os.fsencode(str(top)) + b"/\xff\xfe"
    with open(raw, "wb") as f:
        f.write(b"not UTF-8")
    assert sorted(_statwalk.walk(find, str(top))) == sorted(_expected(top))


def test_a_second_name_changes_the_line(find: str, tmp_path: Path) -> None:
    """A hard link elsewhere gives a file a line other than the one foretold for it."""
    top = tmp_path / "t"
    top.mkdir()
    (top / "f").write_text("x")
    before = _expected(top)
    os.link(top / "f", tmp_path / "elsewhere")
    assert sorted(_statwalk.walk(find, str(top))) != sorted(before)


def test_each_directory_comes_before_what_it_holds(find: str, tmp_path: Path) -> None:
    """The top first (path empty), and every directory before its entries; pruned names out."""
    make_tree(tmp_path / "t", {"a/b/c.txt": "c", "a/d.txt": "d", ".git/x": "x", "e/.git": "f"})
    lines = _statwalk.walk(find, str(tmp_path / "t"), paths_of_dirs=True, prune=[".git"])
    paths = [
        line.split(b" ", 2)[2] if line[:2] == b"d " else line.split(b" ", 8)[8] for line in lines
    ]
    assert paths[0] == b""
    assert sorted(paths) == [b"", b"a", b"a/b", b"a/b/c.txt", b"a/d.txt", b"e"]
    assert paths.index(b"a/b") < paths.index(b"a/b/c.txt")


def test_a_listing_that_fails_raises(find: str, tmp_path: Path) -> None:
    """A directory find cannot list is an OSError, never a short listing taken for all."""
    with pytest.raises(OSError, match="could not list"):
        _statwalk.walk(find, str(tmp_path / "absent"))


def test_a_find_printing_other_times_is_not_used(find: str, tmp_path: Path) -> None:
    """A find whose lines are not those foretold is refused, as is one that does not run."""
    fake = tmp_path / "find"
    fake.write_text(f'#!/bin/sh\n"{find}" "$@" | tr 0 1\n')
    fake.chmod(0o755)
    assert _statwalk._calibrate(find)
    assert not _statwalk._calibrate(str(fake))
    assert not _statwalk._calibrate(str(tmp_path / "no-such-find"))


def test_times_before_1970_are_never_foretold() -> None:
    """A record with a time before 1970 gets a line that no entry prints."""
    line = _statwalk.file_line(b"f", (1, -5, 7, 0o100644, 10), 1)
    assert line.startswith(b"? ")


@pytest.fixture
def watched(tmp_path: Path) -> Iterator[Workdir]:
    """A materialized branch watched with inotify, harvested through find's lines."""
    root = make_tree(tmp_path / "ws", {"src/app.py": "x = 1\n", ".gitignore": "build/\n"})
    branch = Branch.from_tree(Workspace.open(root).snapshot(), "agent")
    with stat_walk("find"):
        workdir = materialize(branch, tmp_path / "state" / "agent", watch=True)
        yield workdir
        workdir.close()


def test_a_file_made_after_the_listing_in_a_new_directory_is_harvested(
    watched: Workdir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A directory watched only once listed is listed again: what came meanwhile is found (a
    walk watches each directory before it lists it)."""
    if not watched.watching:
        pytest.skip("inotify is not available here")
    Path(watched.root, "new").mkdir()
    real = _statwalk.walk

    def late(*args: object, **kwargs: object) -> list[bytes]:
        lines = real(*args, **kwargs)  # type: ignore[arg-type]
        Path(watched.root, "new", "late.txt").write_text("late\n")
        Path(watched.root, "new", "deeper").mkdir()
        Path(watched.root, "new", "deeper", "later.txt").write_text("later\n")
        return lines

    monkeypatch.setattr(_harvestlines, "walk", late)
    report = watched.harvest(full=True)
    assert report.added == ("new/deeper/later.txt", "new/late.txt")


def _step_one(root: Path) -> None:
    for name in ODD_NAMES:
        (root / "src" / name).write_text("new\n")
    (root / "build").mkdir()
    (root / "build" / "out.o").write_text("ignored\n")
    (root / "src" / "app.py").write_text("x = 2\n")
    (root / ".git").mkdir()
    (root / ".git" / "config").write_text("vcs\n")
    (root / "src" / "link").symlink_to("app.py")


def _step_two(root: Path) -> None:
    (root / ".gitignore").write_text("build/\nsrc/\n")  # now ignores src: its files stay
    os.unlink(root / "src" / "a b")
    (root / "src" / "app.py").write_text("x = 3\n")
    (root / "src" / "new.txt").write_text("ignored now\n")
    os.chmod(root / "src" / "-x", 0o755)


@pytest.mark.parametrize("watch", [True, False])
def test_lines_and_walk_harvest_alike(tmp_path: Path, watch: bool) -> None:
    """Odd names, links, ignored and VCS directories, a pattern that comes to ignore files of
    the branch, rewrites, a deletion and a mode change: find's lines and the walk find the
    same changes, harvest after harvest."""
    root = make_tree(tmp_path / "ws", {"src/app.py": "x = 1\n", ".gitignore": "build/\n"})
    snapshot = Workspace.open(root).snapshot()
    dirs: dict[str, Workdir] = {}
    for kind in ("find", "walk"):
        with stat_walk(kind):
            dirs[kind] = materialize(Branch.from_tree(snapshot, kind), tmp_path / kind, watch=watch)
    try:
        for step in (_step_one, _step_two):
            reports = {}
            for kind, workdir in dirs.items():
                step(Path(workdir.root))
                with stat_walk(kind):
                    reports[kind] = workdir.harvest(full=True)
            found, walked = reports["find"], reports["walk"]
            for field in ("added", "modified", "deleted", "mode_changed", "ignored"):
                assert getattr(found, field) == getattr(walked, field), field
            assert found.changed
        assert dict(dirs["find"].branch.changes) == dict(dirs["walk"].branch.changes)
    finally:
        for workdir in dirs.values():
            workdir.close()


def _refused(*args: object, **kwargs: object) -> list[bytes]:
    raise _statwalk.ListingFailed("find could not list it (test)")


def test_a_harvest_walks_the_directory_when_find_fails(
    watched: Workdir, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing that fails (no room for it, a directory gone meanwhile) leaves the harvest
    to the walk: the change is found all the same."""
    monkeypatch.setattr(_harvestlines, "walk", _refused)
    Path(watched.root, "src", "app.py").write_text("x = 2\n")
    Path(watched.root, "src", "new.py").write_text("new\n")
    report = watched.harvest(full=True)
    assert (report.added, report.modified) == (("src/new.py",), ("src/app.py",))


def test_a_reset_walks_the_directory_when_find_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pooled directory whose listing fails is walked here and reset all the same."""
    root = make_tree(tmp_path / "ws", {f"src/f{i}.txt": f"{i}\n" for i in range(5)})
    snapshot = Workspace.open(root).snapshot()
    pool = DirPool(str(tmp_path / "b" / ".pool"), 2, min_files=0)
    with stat_walk("find"):
        first = materialize(Branch.from_tree(snapshot, "one"), tmp_path / "b" / "one")
        pool.adopt(first)
        Path(first.root, "src", "f1.txt").write_text("changed\n")
        Path(first.root, "junk.txt").write_text("left behind\n")
        first.harvest(full=True)
        assert pool.give(first) == []
        monkeypatch.setattr(_poolscan, "walk", _refused)
        reused = pool.take(Branch.from_tree(snapshot, "two"), tmp_path / "b" / "two", discard=print)
    assert reused is not None and pool.stats.reused == 1
    found = {p.relative_to(reused.root).as_posix() for p in Path(reused.root).rglob("*.txt")}
    assert found == {f"src/f{i}.txt" for i in range(5)}
    assert Path(reused.root, "src", "f1.txt").read_text() == "1\n"
    reused.close()


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[list[bytes]]:
    """Every listing find makes for a harvest, kept."""
    listings: list[list[bytes]] = []
    real = _statwalk.walk

    def kept(*args: Any, **kwargs: Any) -> list[bytes]:
        lines = real(*args, **kwargs)
        listings.append(lines)
        return lines

    monkeypatch.setattr(_harvestlines, "walk", kept)
    return listings


@pytest.mark.parametrize("name", ["build", "b[1]*?", "a b"])
def test_an_ignored_directory_is_not_listed_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """A directory a harvest found ignored is left out of the next listings (as the walk
    never enters it), whatever its name; once a pattern no longer ignores it, its files are
    harvested all the same."""
    rules = "".join(f"\\{c}" if c in "[]*?" else c for c in name)
    root = make_tree(tmp_path / "ws", {"src/app.py": "x = 1\n", ".gitignore": f"{rules}/\n"})
    with stat_walk("find"):
        workdir = materialize(
            Branch.from_tree(Workspace.open(root).snapshot(), "a"), tmp_path / "a"
        )
        listings = _spy(monkeypatch)
        big = Path(workdir.root, name)
        big.mkdir()
        for i in range(50):
            (big / f"f{i}.o").write_text("o\n")
        assert not workdir.harvest(full=True).changed
        assert any(b"f7.o" in line for line in listings[-1])  # new: listed once
        assert not workdir.harvest(full=True).changed
        assert not any(b"f7.o" in line for line in listings[-1])
        Path(workdir.root, ".gitignore").write_text("")
        report = workdir.harvest(full=True)
        workdir.close()
    assert len(report.added) == 50 and report.modified == (".gitignore",)


def test_a_small_tree_is_walked_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Below FIND_MIN_ENTRIES files a harvest walks the tree itself: starting find costs
    more than the walk."""
    root = make_tree(tmp_path / "ws", {"a.txt": "a\n"})
    workdir = materialize(Branch.from_tree(Workspace.open(root).snapshot(), "a"), tmp_path / "a")
    listings = _spy(monkeypatch)
    Path(workdir.root, "b.txt").write_text("b\n")
    assert workdir.harvest(full=True).added == ("b.txt",)
    workdir.close()
    assert listings == []


@pytest.mark.parametrize("walker", ["find", "walk"])
@pytest.mark.parametrize("pattern", ["out/", "*.gen"])
def test_a_deletion_beside_a_file_a_new_pattern_drops_is_harvested(
    tmp_path: Path, walker: str, pattern: str
) -> None:
    """A step that deletes a file and writes a pattern ignoring a file the branch added
    (one of each: their counts match) records the deletion all the same."""
    root = make_tree(tmp_path / "ws", {"src/app.py": "x = 1\n", "other.txt": "o\n"})
    with stat_walk(walker):
        workdir = materialize(
            Branch.from_tree(Workspace.open(root).snapshot(), "a"), tmp_path / "a", watch=False
        )
        top = Path(workdir.root)
        (top / "out").mkdir()
        (top / "out" / "gen.gen").write_text("generated\n")
        assert workdir.harvest(full=True).added == ("out/gen.gen",)
        (top / ".gitignore").write_text(f"{pattern}\n")
        (top / "other.txt").unlink()
        report = workdir.harvest(full=True)
        workdir.close()
    assert report.deleted == ("other.txt",)
    assert report.ignored == ("out/gen.gen",)


@pytest.mark.parametrize("walker", ["find", "walk"])
def test_a_directory_too_deep_to_open_refuses_the_harvest(tmp_path: Path, walker: str) -> None:
    """A new file below a path longer than the system looks up, beside a .gitignore, is
    refused (PathRefused), never left out in silence."""
    root = make_tree(tmp_path / "ws", {"src/app.py": "x\n"})
    with stat_walk(walker):
        workdir = materialize(
            Branch.from_tree(Workspace.open(root).snapshot(), "a"), tmp_path / "a", watch=False
        )
        fd = os.open(workdir.root, os.O_RDONLY)
        for _ in range(25):  # a path of about 5,000 bytes
            os.mkdir("d" * 200, dir_fd=fd)
            below = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = below
        for name, text in (("deep.txt", "made\n"), (".gitignore", "*.tmp\n")):
            out = os.open(name, os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
            os.write(out, text.encode())
            os.close(out)
        os.close(fd)
        with pytest.raises(PathRefused):
            workdir.harvest(full=True)
        workdir.close()


def test_a_mount_below_is_left_to_the_walk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A directory on another filesystem below the branch directory is not entered by find
    (a mount that stalls cannot hold it up): the harvest walks the tree instead."""
    root = make_tree(tmp_path / "ws", {"src/app.py": "x\n"})
    with stat_walk("find"):
        workdir = materialize(
            Branch.from_tree(Workspace.open(root).snapshot(), "a"), tmp_path / "a", watch=False
        )
        other = os.lstat(workdir.root).st_dev + 1
        real = _statwalk.walk

        def mounted(*args: Any, **kwargs: Any) -> list[bytes]:
            lines = real(*args, **kwargs)
            return [*lines, b"d %d mnt" % other]

        monkeypatch.setattr(_harvestlines, "walk", mounted)
        Path(workdir.root, "src", "new.py").write_text("new\n")
        assert workdir.harvest(full=True).added == ("src/new.py",)
        fd = os.open(workdir.root, os.O_RDONLY)
        try:
            assert _harvestlines.scan_by_lines(workdir, "find", fd, None) is None
        finally:
            os.close(fd)
        workdir.close()
