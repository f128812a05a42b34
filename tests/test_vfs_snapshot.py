"""Tests for orchestrator.vfs.snapshot: lazy stat snapshots of a workspace."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

import pytest

from orchestrator.vfs import snapshot as snapshot_module
from orchestrator.vfs.errors import PathNotFound, WorkspaceChanged
from orchestrator.vfs.snapshot import Workspace
from orchestrator.vfs.testing import capture, git, git_repo, make_tree


def age(root: Path, seconds: float = 3600) -> None:
    """Push every mtime into the past so no file counts as racily clean."""
    old = time.time() - seconds
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            os.utime(os.path.join(dirpath, name), (old, old), follow_symlinks=False)


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    root = make_tree(
        tmp_path / "ws",
        {
            "src/a.py": "print('a')\n",
            "README": "hi\n",
            ".gitignore": "*.log\nbuild/\n",
            "debug.log": "noise",
            "build/out.o": "obj",
            ".git/HEAD": "ref: refs/heads/main\n",
        },
    )
    os.symlink("README", root / "link")
    age(root)
    return Workspace.open(root)


def test_snapshot_records_stats_without_reading(
    ws: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A snapshot lists non-ignored files with their stat and reads none of them."""
    reads: list[str] = []
    real, real_hash = snapshot_module._read_disk, snapshot_module._hash_disk

    def counting(full: str, mode: int) -> tuple[bytes, os.stat_result, os.stat_result]:
        reads.append(full)
        return real(full, mode)

    def counting_hash(full: str, mode: int) -> tuple[str, os.stat_result, os.stat_result]:
        reads.append(full)
        return real_hash(full, mode)

    monkeypatch.setattr(snapshot_module, "_read_disk", counting)
    monkeypatch.setattr(snapshot_module, "_hash_disk", counting_hash)
    snap = ws.snapshot()
    assert sorted(snap.paths()) == [".gitignore", "README", "link", "src/a.py"]
    assert reads == []
    assert snap.known_digest("README") is None
    assert snap.stat("README").size == 3
    assert snap.digest("README") is not None and len(reads) == 1
    assert snap.digest("README") == snap.known_digest("README") and len(reads) == 1


def test_snapshot_reads_content_and_symlinks(ws: Workspace) -> None:
    """Reads give the snapshot's content; a symlink's content is its target."""
    snap = ws.snapshot()
    assert snap.read("src/a.py") == b"print('a')\n"
    assert snap.read("link") == b"README"
    assert snap.mode("link") == 0o120777
    assert snap.parent is None and snap.root == ws.root and len(snap) == 4
    with pytest.raises(PathNotFound):
        snap.read("debug.log")


def test_read_after_workspace_change_is_refused(ws: Workspace) -> None:
    """Content changed after the snapshot is never handed out as the snapshot's."""
    snap = ws.snapshot()
    (ws.path / "README").write_text("changed\n")
    with pytest.raises(WorkspaceChanged) as info:
        snap.read("README")
    assert info.value.paths == ("README",)
    (ws.path / "src/a.py").unlink()
    with pytest.raises(WorkspaceChanged):
        snap.digest("src/a.py")


def test_racy_files_are_hashed_at_snapshot_time(tmp_path: Path) -> None:
    """Files modified just before the snapshot are hashed then and compared by content later."""
    root = make_tree(tmp_path / "ws", {"fresh.txt": "v1"})
    snap = Workspace.open(root).snapshot()
    assert snap.is_racy("fresh.txt") and snap.known_digest("fresh.txt") is not None
    st = os.stat(root / "fresh.txt")
    (root / "fresh.txt").write_text("v2")
    os.utime(root / "fresh.txt", ns=(st.st_atime_ns, st.st_mtime_ns))
    assert snap.disk_differs("fresh.txt") is not None
    with pytest.raises(WorkspaceChanged):
        snap.read("fresh.txt")


def test_disk_differs_reasons(ws: Workspace) -> None:
    """disk_differs explains creation, deletion and modification after the snapshot."""
    snap = ws.snapshot()
    snap.digest("src/a.py")
    assert snap.disk_differs("README") is None
    assert snap.disk_differs("src/a.py") is None
    (ws.path / "new.txt").write_text("n")
    (ws.path / "README").unlink()
    (ws.path / "src/a.py").write_text("print('b')\n")
    assert "created" in (snap.disk_differs("new.txt") or "")
    assert "deleted" in (snap.disk_differs("README") or "")
    assert "changed" in (snap.disk_differs("src/a.py") or "")
    assert snap.disk_differs("never-existed") is None


def test_touch_only_change_passes_when_hash_known(ws: Workspace) -> None:
    """A file whose mtime changed but content did not still matches, once its hash is known."""
    snap = ws.snapshot()
    snap.digest("README")
    os.utime(ws.path / "README")
    assert snap.disk_differs("README") is None


def test_kept_content_outlives_the_workspace_file(ws: Workspace) -> None:
    """Kept content is read from memory after the workspace file changed; a copy's content is
    kept only when its hash is the one known for the file."""
    snap = ws.snapshot()
    assert snap.keep("README") and snap.has_content("README")
    (ws.path / "README").write_text("changed\n")
    assert snap.read("README") == b"hi\n"
    assert snap.state("README") is not None
    original = b"print('a')\n"
    assert not snap.keep("src/a.py", original)  # no hash known to check it against
    snap.record_digest("src/a.py", hashlib.sha256(original).hexdigest())
    assert not snap.keep("src/a.py", b"print('edited')\n")
    assert snap.keep("src/a.py", original)
    (ws.path / "src/a.py").unlink()
    assert snap.read("src/a.py") == original


def test_content_gone_before_it_was_kept_is_not(ws: Workspace) -> None:
    """keep() reads the workspace file now: once it changed, nothing is kept or claimed."""
    snap = ws.snapshot()
    (ws.path / "README").write_text("changed\n")
    assert not snap.keep("README") and not snap.has_content("README")
    with pytest.raises(WorkspaceChanged):
        snap.read("README")


def test_a_recorded_digest_is_known_and_checked(ws: Workspace) -> None:
    """A digest recorded from a copy is the file's from then on; another one for the same stat is
    a workspace change."""
    snap = ws.snapshot()
    good = hashlib.sha256(b"hi\n").hexdigest()
    snap.record_digest("README", good)
    (ws.path / "README").write_text("changed\n")
    assert snap.digest("README") == good
    with pytest.raises(WorkspaceChanged):
        snap.record_digest("README", hashlib.sha256(b"other").hexdigest())


def test_snapshot_never_writes(ws: Workspace) -> None:
    """Taking a snapshot and reading it leaves the workspace byte-for-byte unchanged."""
    before = capture(ws.path)
    snap = ws.snapshot()
    for path in snap.paths():
        snap.read(path)
    assert capture(ws.path) == before


def test_workspace_open_and_contains(tmp_path: Path, ws: Workspace) -> None:
    """Workspace.open resolves the root; contains() is by resolved path; git is detected."""
    assert ws.contains(ws.path / "src" / "a.py")
    assert not ws.contains(tmp_path)
    assert ws.git_dir() is not None
    with pytest.raises(NotADirectoryError):
        Workspace.open(tmp_path / "missing")
    extra = Workspace.open(ws.root, extra_ignores=("src/",)).snapshot()
    assert "src/a.py" not in extra.paths()


def test_a_file_git_tracks_is_part_of_the_workspace_though_ignored(tmp_path: Path) -> None:
    """A file added with ``git add -f`` is in the snapshot (git does not ignore tracked
    files); the untracked files beside it in the ignored directory are not."""
    root = git_repo(tmp_path / "ws", {".gitignore": "dist/\n", "a.txt": "a\n"})
    make_tree(root, {"dist/app.js": "old\n"})
    git(root, "add", "-f", "dist/app.js")
    git(root, "commit", "-q", "-m", "forced")
    make_tree(root, {"dist/other.js": "untracked\n", "dist/cache/c.bin": "c"})
    snap = Workspace.open(root).snapshot()
    assert sorted(snap.paths()) == [".gitignore", "a.txt", "dist/app.js"]
    assert snap.read("dist/app.js") == b"old\n"
    off = Workspace.open(root, use_gitignore=False).snapshot()
    assert "dist/other.js" in off.paths()


def test_a_shipped_tree_keeps_every_file_it_is_given(tmp_path: Path) -> None:
    """A tree given with its files (a cluster node's copy) keeps them all, whatever its
    patterns say, and no repository around it has a say."""
    repo = git_repo(tmp_path / "repo", {".gitignore": "cache/\n", "a.txt": "a\n"})
    tree = make_tree(
        repo / "cache" / "tree",
        {".gitignore": "build/\n", "build/keep.txt": "k\n", "src/x.py": "x\n"},
    )
    make_tree(tree, {"build/new.txt": "untracked\n"})
    snap = Workspace.open(tree).snapshot(tracked={".gitignore", "build/keep.txt", "src/x.py"})
    assert sorted(snap.paths()) == [".gitignore", "build/keep.txt", "src/x.py"]


def test_a_fifo_gitignore_neither_hangs_nor_hides_tracked_files(tmp_path: Path) -> None:
    """git is asked for its index alone: a FIFO named .gitignore is never opened, and the
    files it tracks below an ignored directory are kept."""
    root = git_repo(tmp_path / "ws", {".gitignore": "out/\n", "a.txt": "a\n"})
    make_tree(root, {"out/kept.txt": "k\n"})
    git(root, "add", "-f", "out/kept.txt")
    (root / "f").mkdir()
    os.mkfifo(root / "f" / ".gitignore")
    started = time.monotonic()
    snap = Workspace.open(root).snapshot()
    assert "out/kept.txt" in snap.paths()
    assert time.monotonic() - started < 30


def test_a_git_directory_that_is_none_is_not_the_top(tmp_path: Path) -> None:
    """An empty ``.git`` directory between the top and the workspace is no repository: the
    patterns of the real top apply."""
    repo = git_repo(tmp_path / "repo", {".gitignore": "*.junk\n", "a.txt": "a\n"})
    make_tree(repo, {"mid/ws/x.junk": "j\n", "mid/ws/y.txt": "y\n"})
    (repo / "mid" / ".git").mkdir()
    snap = Workspace.open(repo / "mid" / "ws").snapshot()
    assert sorted(snap.paths()) == ["y.txt"]
