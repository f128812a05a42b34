"""Tests for orchestrator.vfs.branch: fork, read, write, delete, mode, net changes."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.vfs.branch import Branch
from orchestrator.vfs.changes import Delete, ModeChange, Write
from orchestrator.vfs.errors import PathNotFound, PathRefused
from orchestrator.vfs.snapshot import Workspace
from orchestrator.vfs.testing import capture, make_tree
from orchestrator.vfs.tree import Layer, MemoryTree


def base() -> MemoryTree:
    return MemoryTree.from_files({"a.txt": b"A\n", "dir/b.txt": b"B\n"})


def test_reads_see_own_changes_over_base() -> None:
    """A branch reads its own writes and deletions first, the base otherwise."""
    br = Branch.from_tree(base(), "x")
    br.write("a.txt", b"changed\n")
    br.delete("dir/b.txt")
    br.write("new/c.txt", b"C")
    assert br.read("a.txt") == b"changed\n"
    assert not br.exists("dir/b.txt")
    assert br.read("new/c.txt") == b"C"
    assert set(br.paths()) == {"a.txt", "new/c.txt"}
    with pytest.raises(PathNotFound):
        br.read("dir/b.txt")
    with pytest.raises(PathNotFound):
        br.delete("nope")


def test_change_set_has_no_noops() -> None:
    """Writing back the base content (or mode) removes the change."""
    br = Branch.from_tree(base(), "x")
    br.write("a.txt", b"tmp")
    assert isinstance(br.changes["a.txt"], Write)
    br.write("a.txt", b"A\n")
    assert "a.txt" not in br.changes
    br.chmod("a.txt", 0o755)
    assert dict(br.changes) == {"a.txt": ModeChange(0o755)}
    assert br.mode("a.txt") == 0o100755 and br.read("a.txt") == b"A\n"
    br.chmod("a.txt", 0o644)
    assert not br.changes
    br.write("a.txt", b"x")
    br.revert("a.txt")
    assert not br.changes


def test_write_keeps_mode_and_new_files_default() -> None:
    """An existing file keeps its mode when rewritten; new files are 0o100644."""
    br = Branch.from_tree(MemoryTree.from_files({}), "x")
    br.write("run.sh", b"#!/bin/sh\n", 0o755)
    br.write("run.sh", b"#!/bin/sh\necho\n")
    assert br.mode("run.sh") == 0o100755
    br.write("plain", b"p")
    assert br.mode("plain") == 0o100644


def test_fork_freezes_parent_state() -> None:
    """A fork starts from the parent's current state and the two then diverge."""
    parent = Branch.from_tree(base(), "p")
    parent.write("a.txt", b"P1")
    child = parent.fork("c")
    assert isinstance(child.base, Layer)
    parent.write("a.txt", b"P2")
    child.write("dir/b.txt", b"C")
    assert child.read("a.txt") == b"P1"
    assert parent.read("dir/b.txt") == b"B\n"
    assert dict(child.changes) == {"dir/b.txt": Write(b"C")}
    assert dict(child.net_changes()) == {"a.txt": Write(b"P1"), "dir/b.txt": Write(b"C")}
    assert child.root is parent.root
    assert Branch.from_tree(base(), "empty").fork("e").base is not None


def test_net_changes_through_layers_drop_reverts() -> None:
    """A change undone in a later branch is not part of the net changes."""
    parent = Branch.from_tree(base(), "p")
    parent.write("a.txt", b"P1")
    parent.chmod("dir/b.txt", 0o700)
    child = parent.fork("c")
    child.write("a.txt", b"A\n")
    child.delete("dir/b.txt")
    assert dict(child.net_changes()) == {"dir/b.txt": Delete()}


def test_paths_are_validated() -> None:
    """Absolute and '..' paths are refused by every branch operation."""
    br = Branch.from_tree(base(), "x")
    for bad in ("/etc/passwd", "../up", "a/../../b"):
        with pytest.raises(PathRefused):
            br.write(bad, b"x")
        with pytest.raises(PathRefused):
            br.read(bad)


def test_branch_over_workspace_never_writes_it(tmp_path: Path) -> None:
    """Changing a branch over a workspace snapshot leaves the workspace untouched."""
    root = make_tree(tmp_path / "ws", {"f.txt": "1\n", "g.txt": "2\n"})
    before = capture(root)
    br = Branch.from_tree(Workspace.open(root).snapshot(), "x")
    br.write("f.txt", b"9\n")
    br.delete("g.txt")
    br.write("h.txt", b"3\n")
    assert br.read("f.txt") == b"9\n"
    assert capture(root) == before


def test_close_marks_branch_finished() -> None:
    """close() marks the branch; later changes are still recorded (and logged)."""
    br = Branch.from_tree(base(), "x")
    br.close()
    assert br.closed
    br.write("a.txt", b"late")
    assert br.read("a.txt") == b"late"
