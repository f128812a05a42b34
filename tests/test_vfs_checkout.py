"""Tests for orchestrator.vfs.checkout: a branch written into its own working directory."""

from __future__ import annotations

import fcntl
import hashlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import make_chain
from log_capture import capture_logs

from orchestrator.vfs import CopyStats, _fileio, checkout
from orchestrator.vfs.branch import Branch
from orchestrator.vfs.checkout import materialize, materialize_async
from orchestrator.vfs.errors import PathRefused, WorkspaceChanged
from orchestrator.vfs.snapshot import Snapshot, Workspace
from orchestrator.vfs.testing import capture, make_tree
from orchestrator.vfs.tree import MemoryTree


@pytest.fixture
def snap(tmp_path: Path) -> Snapshot:
    root = make_tree(
        tmp_path / "ws",
        {
            "src/main.py": "print('hi')\n",
            "src/util/helpers.py": "x = 1\n",
            "README.md": "# readme\n",
            ".gitignore": "*.log\nnode_modules/\n",
            "app.log": "noise\n",
            "node_modules/pkg/index.js": "module.exports = 1\n",
            ".git/config": "[core]\n",
            ".git/objects/ab/cdef": "blob",
        },
    )
    (root / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (root / "run.sh").chmod(0o755)
    os.symlink("README.md", root / "link.md")
    old = 1_600_000_000
    os.utime(root / "README.md", (old, old))
    return Workspace.open(root).snapshot()


def rel_files(root: Path) -> set[str]:
    return {p for p in capture(root) if not p.endswith("/")}


def test_materialize_copies_tracked_files_only(snap: Snapshot, tmp_path: Path) -> None:
    """The working directory holds the branch's files; .git and ignored files are skipped."""
    wd = materialize(Branch.from_tree(snap, "a"), tmp_path / "state" / "a")
    root = Path(wd.root)
    assert rel_files(root) == {
        ".gitignore",
        "README.md",
        "link.md",
        "run.sh",
        "src/main.py",
        "src/util/helpers.py",
    }
    assert (root / "src/main.py").read_text() == "print('hi')\n"
    assert os.readlink(root / "link.md") == "README.md"
    assert stat.S_IMODE((root / "run.sh").stat().st_mode) == 0o755
    assert (root / "README.md").stat().st_mtime_ns == 1_600_000_000 * 10**9
    wd.close()


def test_no_hard_links_with_the_workspace(snap: Snapshot, tmp_path: Path) -> None:
    """Every file is an independent copy: writing it leaves the workspace unchanged."""
    before = capture(Path(snap.root))
    wd = materialize(Branch.from_tree(snap, "a"), tmp_path / "state" / "a")
    for rel in ("README.md", "src/main.py", "run.sh"):
        copy, orig = Path(wd.root, rel), Path(snap.root, rel)
        assert copy.stat().st_ino != orig.stat().st_ino
        assert orig.stat().st_nlink == 1
        copy.write_text("agent was here\n")
    assert capture(Path(snap.root)) == before
    wd.close()


def test_include_ignored_and_vcs_on_request(snap: Snapshot, tmp_path: Path) -> None:
    """Ignored bulk and .git are copied only when asked, and never harvested."""
    wd = materialize(
        Branch.from_tree(snap, "a"), tmp_path / "a", include_ignored=True, include_vcs=True
    )
    root = Path(wd.root)
    assert (root / "node_modules/pkg/index.js").is_file()
    assert (root / "app.log").is_file()
    assert (root / ".git/objects/ab/cdef").read_text() == "blob"
    (root / "node_modules/pkg/index.js").write_text("changed")
    (root / ".git/config").write_text("changed")
    assert not wd.harvest(full=True).changed
    wd.close()
    only_vcs = materialize(Branch.from_tree(snap, "b"), tmp_path / "b", include_vcs=True)
    assert (Path(only_vcs.root) / ".git/config").is_file()
    assert not (Path(only_vcs.root) / "app.log").exists()
    only_vcs.close()


def test_materialize_branch_changes_and_layers(snap: Snapshot, tmp_path: Path) -> None:
    """A branch's own and inherited changes (writes, deletions, modes) are materialized."""
    parent = Branch.from_tree(snap, "p")
    parent.write("src/main.py", b"print('parent')\n")
    parent.delete("README.md")
    child = parent.fork("c")
    child.write("new/file.txt", b"new\n")
    child.chmod("src/util/helpers.py", 0o700)
    wd = materialize(child, tmp_path / "c", workers=4)
    root = Path(wd.root)
    assert (root / "src/main.py").read_bytes() == b"print('parent')\n"
    assert not (root / "README.md").exists()
    assert (root / "new/file.txt").read_bytes() == b"new\n"
    assert stat.S_IMODE((root / "src/util/helpers.py").stat().st_mode) == 0o700
    assert not wd.harvest(full=True).changed
    wd.close()


def test_memory_tree_branch_materializes(tmp_path: Path) -> None:
    """A branch over an in-memory tree materializes from bytes."""
    br = Branch.from_tree(MemoryTree.from_files({"a/b.txt": b"x"}), "m")
    wd = materialize(br, tmp_path / "m", watch=False)
    assert Path(wd.root, "a/b.txt").read_bytes() == b"x"
    assert not wd.watching


def test_refuses_locations_inside_the_workspace_or_not_empty(
    snap: Snapshot, tmp_path: Path
) -> None:
    """A working directory may not be inside the workspace, contain it, or be non-empty."""
    br = Branch.from_tree(snap, "a")
    with pytest.raises(PathRefused):
        materialize(br, Path(snap.root) / "sub")
    with pytest.raises(PathRefused):
        materialize(br, tmp_path)
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(PathRefused):
        materialize(br, busy)


def test_workspace_changed_since_snapshot_is_detected(snap: Snapshot, tmp_path: Path) -> None:
    """A workspace file that changed after the snapshot aborts materialize, leaving nothing."""
    Path(snap.root, "README.md").write_text("# edited by the user\n")  # copied by the kernel
    with pytest.raises(WorkspaceChanged):
        materialize(Branch.from_tree(snap, "a"), tmp_path / "a")
    assert not (tmp_path / "a").exists()
    Path(snap.root, "README.md").write_text("# readme\n")
    Path(snap.root, "src/main.py").write_text("print('edited by the user')\n")  # racy: by hash
    with pytest.raises(WorkspaceChanged):
        materialize(Branch.from_tree(snap, "b"), tmp_path / "b")


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def aged_snapshot(root: Path, files: dict[str, str]) -> Snapshot:
    """A snapshot of ``files`` (and ``link`` -> notes.txt) last modified an hour ago: nothing is
    racily clean, so nothing is hashed when the snapshot is taken."""
    make_tree(root, files)
    os.symlink("notes.txt", root / "link")
    old = time.time() - 3600
    for path in [*files, "link"]:
        os.utime(root / path, (old, old), follow_symlinks=False)
    return Workspace.open(root).snapshot()


def test_a_copied_file_keeps_its_digest_after_the_workspace_file_changes(tmp_path: Path) -> None:
    """materialize hashes what it copies: the snapshot knows a copied file's digest after the
    workspace file changed (and claims no content it no longer has)."""
    snap = aged_snapshot(tmp_path / "ws", {"notes.txt": "one\ntwo\n", "src/a.py": "x = 1\n"})
    assert snap.known_digest("notes.txt") is None
    materialize(Branch.from_tree(snap, "a"), tmp_path / "a")
    Path(snap.root, "notes.txt").write_text("someone else\n")
    assert snap.digest("notes.txt") == sha256("one\ntwo\n")
    assert snap.known_digest("src/a.py") == sha256("x = 1\n")
    assert snap.known_digest("link") == sha256("notes.txt")  # a symlink's content: its target
    with pytest.raises(WorkspaceChanged):
        snap.read("notes.txt")


def test_only_the_first_checkout_of_a_snapshot_hashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file is hashed once per snapshot: later checkouts copy it without reading it."""
    hashed: list[int] = []
    real = _fileio.copy_fd_digest

    def counting(src: int, dst: int, size: int, devices: tuple[int, int]) -> tuple[str, bool]:
        hashed.append(size)
        return real(src, dst, size, devices)

    monkeypatch.setattr(checkout, "copy_fd_digest", counting)
    snap = aged_snapshot(tmp_path / "ws", {"notes.txt": "one\n", "src/a.py": "x = 1\n"})
    materialize(Branch.from_tree(snap, "a"), tmp_path / "a")
    assert len(hashed) == 2
    wd = materialize(Branch.from_tree(snap, "b"), tmp_path / "b")
    assert len(hashed) == 2
    assert Path(wd.root, "notes.txt").read_text() == "one\n"


def test_kept_content_is_checked_out_after_the_workspace_file_changed(tmp_path: Path) -> None:
    """A file whose content the snapshot keeps is written from it, not copied from the changed
    workspace file: a later branch gets what the run started from."""
    snap = aged_snapshot(tmp_path / "ws", {"notes.txt": "one\n", "src/a.py": "x = 1\n"})
    assert snap.keep("notes.txt")
    Path(snap.root, "notes.txt").write_text("someone else\n")
    wd = materialize(Branch.from_tree(snap, "a"), tmp_path / "a")
    assert Path(wd.root, "notes.txt").read_text() == "one\n"
    assert not wd.harvest(full=True).changed


async def test_materialize_async(snap: Snapshot, tmp_path: Path) -> None:
    """materialize_async runs the copy in a worker thread."""
    wd = await materialize_async(Branch.from_tree(snap, "a"), tmp_path / "a")
    assert Path(wd.root, "src/main.py").is_file()
    wd.remove()
    assert not Path(wd.root).exists()


@pytest.mark.parametrize("workers", [None, 3])
def test_parallel_copy_gives_the_same_tree(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int | None
) -> None:
    """Thread-pool copies (chosen adaptively or explicitly) produce the same files and records."""
    monkeypatch.setattr(checkout, "_SLOW_FILE_S", 0.0)  # every probe looks slow: go parallel
    files = {f"d{i % 7}/f{i}.txt": f"content {i}\n" for i in range(500)}
    root = make_tree(tmp_path / "ws", files)
    old = 1_500_000_000
    for rel in files:
        os.utime(root / rel, (old, old))
    snap = Workspace.open(root).snapshot()
    with capture_logs() as logs:
        wd = materialize(Branch.from_tree(snap, "p"), tmp_path / "p", workers=workers)
    assert next(e["workers"] for e in logs if e["event"] == "branch materialized") > 1
    assert {k: v[0] for k, v in capture(Path(wd.root)).items() if not k.endswith("/")} == {
        k: v.encode() for k, v in files.items()
    }
    report = wd.harvest(full=True)
    assert not report.changed and report.hashed == 0
    assert all(snap.known_digest(rel) == sha256(v) for rel, v in files.items())  # every thread's
    wd.close()


# --------------------------------------------------------------------------- symlinks


@pytest.fixture
def linked(tmp_path: Path) -> Path:
    """A workspace with links leading into it (in several ways), within it and out of it."""
    ws = make_tree(
        tmp_path / "ws",
        {
            "target.txt": "target\n",
            "src/lib.py": "x = 1\n",
            ".gitignore": "build/\n",
            "build/out.txt": "out\n",
        },
    ).resolve()
    outside = make_tree(tmp_path / "outside", {"secret.txt": "secret\n"}).resolve()
    (tmp_path / "alias").symlink_to(ws)
    (ws / "abs.txt").symlink_to(ws / "target.txt")  # absolute, into the workspace
    (ws / "src/up.txt").symlink_to("../../ws/target.txt")  # relative, out and back in
    (ws / "libdir").symlink_to(ws / "src")  # a directory
    (ws / "via-alias.txt").symlink_to(tmp_path / "alias" / "target.txt")  # another way in
    (ws / "within.txt").symlink_to("src/lib.py")  # relative, never leaving
    (ws / "out-abs.txt").symlink_to(outside / "secret.txt")  # absolute, outside
    (ws / "src/out-rel.txt").symlink_to("../../outside/secret.txt")  # relative, outside
    (ws / "build/link").symlink_to(ws / "target.txt")  # ignored: copied only on request
    return ws


def test_links_into_the_workspace_lead_into_the_branch_directory(
    linked: Path, tmp_path: Path
) -> None:
    """A link leading into the workspace leads to the branch's copy; one leading out, to the
    same place as from the workspace; the branch keeps the workspace's targets."""
    wd = materialize(Branch.from_tree(Workspace.open(linked).snapshot(), "a"), tmp_path / "a")
    root = Path(wd.root)
    assert os.readlink(root / "abs.txt") == str(root / "target.txt")
    assert os.readlink(root / "src/up.txt") == "../target.txt"
    assert os.readlink(root / "libdir") == str(root / "src")
    assert os.readlink(root / "via-alias.txt") == str(root / "target.txt")
    assert os.readlink(root / "within.txt") == "src/lib.py"
    assert os.readlink(root / "out-abs.txt") == str(tmp_path / "outside/secret.txt")
    assert os.readlink(root / "src/out-rel.txt") == str(tmp_path / "outside/secret.txt")
    for name in ("abs.txt", "src/up.txt", "libdir", "via-alias.txt", "within.txt"):
        assert os.path.realpath(root / name).startswith(f"{root}/"), name
    assert (root / "src/out-rel.txt").read_text() == "secret\n"
    report = wd.harvest(full=True)
    assert not report.changed and not wd.branch.changes
    assert wd.branch.read("abs.txt") == os.fsencode(linked / "target.txt")
    assert wd.branch.read("src/up.txt") == b"../../ws/target.txt"


def test_writes_through_links_into_the_workspace_stay_in_the_branch(
    linked: Path, tmp_path: Path
) -> None:
    """Writing through such a link changes the branch's copy of its target, never the
    workspace; the harvest records the target's change, not the link's."""
    before = capture(linked)
    wd = materialize(Branch.from_tree(Workspace.open(linked).snapshot(), "a"), tmp_path / "a")
    root = Path(wd.root)
    for link in ("abs.txt", "src/up.txt", "via-alias.txt"):
        with (root / link).open("a") as f:
            f.write(f"via {link}\n")
    (root / "libdir" / "new.py").write_text("new\n")
    assert capture(linked) == before
    report = wd.harvest()
    assert (report.modified, report.added) == (("target.txt",), ("src/new.py",))
    written = b"target\nvia abs.txt\nvia src/up.txt\nvia via-alias.txt\n"
    assert wd.branch.read("target.txt") == written
    assert sorted(wd.branch.changes) == ["src/new.py", "target.txt"]


def test_ignored_links_copied_on_request_lead_into_the_branch_directory(
    linked: Path, tmp_path: Path
) -> None:
    """The ignored entries copied on request have their links mapped the same way."""
    snap = Workspace.open(linked).snapshot()
    wd = materialize(Branch.from_tree(snap, "a"), tmp_path / "a", include_ignored=True)
    root = Path(wd.root)
    assert os.readlink(root / "build/link") == str(root / "target.txt")
    assert (root / "build/out.txt").read_text() == "out\n"


@pytest.fixture
def deep_tmp(tmp_path: Path) -> Iterator[Path]:
    """``tmp_path``, removed after the test: pytest's own clean-up recurses once per level."""
    yield tmp_path
    _fileio.remove_tree(str(tmp_path))


def test_a_chain_of_1100_directories_is_checked_out_harvested_and_removed(
    deep_tmp: Path,
) -> None:
    """A workspace chain 1,100 deep, tracked and ignored: both copied, a change deep in it
    harvested, the directory removed whole."""
    tmp_path = deep_tmp
    ws = make_tree(tmp_path / "ws", {".gitignore": "cache/\n"})
    deep = make_chain(ws, 1100)
    (ws / "cache").mkdir()
    ignored = "cache/" + make_chain(ws / "cache", 1100)
    wd = materialize(
        Branch.from_tree(Workspace.open(ws).snapshot(), "a"), tmp_path / "b", include_ignored=True
    )
    assert Path(wd.root, deep).read_text() == "deep\n"
    assert Path(wd.root, ignored).read_text() == "deep\n"
    Path(wd.root, deep).write_text("changed\n")
    assert wd.harvest(full=True).modified == (deep,)
    wd.remove()
    assert not (tmp_path / "b").exists()


def test_a_workspace_path_too_long_for_the_system_is_refused(deep_tmp: Path) -> None:
    """A directory past PATH_MAX refuses the snapshot; a path that fits in the workspace but
    not under the branch directory refuses the checkout, which leaves nothing behind."""
    tmp_path = deep_tmp
    too_deep = make_tree(tmp_path / "deep", {"a.txt": "a\n"})
    make_chain(too_deep, 21, "p" * 200)
    with pytest.raises(PathRefused, match="too long for the system"):
        Workspace.open(too_deep).snapshot()
    ws = make_tree(tmp_path / "ws", {"a.txt": "a\n"})
    room = _fileio.PATH_MAX - 2 - len(os.fsencode(ws))
    name = "p" * 200
    depth = (room - len("/f.txt")) // (len(name) + 1)
    make_chain(ws, depth, name)  # its path fits under ws, not under the longer directory below
    target = tmp_path / ("t" * 200) / "branch"
    with pytest.raises(PathRefused, match="too long to check out"):
        materialize(Branch.from_tree(Workspace.open(ws).snapshot(), "a"), target)
    assert not target.exists()


def reflinks_in(directory: Path) -> bool:
    """Whether ``FICLONE`` works within ``directory``'s filesystem (btrfs, XFS: not ext4)."""
    src, dst = directory / "probe-src", directory / "probe-dst"
    src.write_bytes(b"x" * 4096)
    try:
        with open(src, "rb") as s, open(dst, "xb") as d:
            fcntl.ioctl(d.fileno(), _fileio._FICLONE, s.fileno())
    except OSError:
        return False
    finally:
        src.unlink()
        dst.unlink(missing_ok=True)
    return True


@pytest.mark.parametrize("workers", [1, 3])
def test_copies_count_every_file_reflinked_or_copied(tmp_path: Path, workers: int) -> None:
    """Workdir.copies counts each file once, from every thread: reflinked where the filesystem
    clones, copied where it cannot (ext4, tmpfs); content the branch holds is written (copied),
    and a symlink is neither."""
    files = {f"d{i % 7}/f{i}.txt": f"content {i}\n" * i for i in range(300)}
    root = make_tree(tmp_path / "ws", files)
    os.symlink("d0/f0.txt", root / "link")
    old = 1_500_000_000
    for rel in [*files, "link"]:
        os.utime(root / rel, (old, old), follow_symlinks=False)
    branch = Branch.from_tree(Workspace.open(root).snapshot(), "c")
    branch.write("new.txt", b"made by the branch\n")
    with capture_logs() as logs:
        wd = materialize(branch, tmp_path / "c", workers=workers)
    size = sum(len(v) for v in files.values())
    new = len(b"made by the branch\n")
    if reflinks_in(tmp_path):
        assert wd.copies == CopyStats(len(files), size, 1, new)
    else:
        assert wd.copies == CopyStats(0, 0, len(files) + 1, size + new)
    event = next(e for e in logs if e["event"] == "branch materialized")
    assert (event["reflinked"], event["copied"], event["copied_bytes"]) == (
        wd.copies.reflinked,
        wd.copies.copied,
        wd.copies.copied_bytes,
    )
    wd.close()
