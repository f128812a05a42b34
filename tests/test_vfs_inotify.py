"""Tests for orchestrator.vfs._inotify: the change-notification accelerator for harvests."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from orchestrator.vfs import _inotify
from orchestrator.vfs.branch import Branch
from orchestrator.vfs.checkout import materialize
from orchestrator.vfs.tree import MemoryTree

pytestmark = pytest.mark.skipif(_inotify._LIBC is None, reason="inotify is Linux-only")


def test_events_name_changed_entries(tmp_path: Path) -> None:
    """Creating, writing and deleting in a watched directory queue events naming the entries."""
    (tmp_path / "sub").mkdir()
    watcher = _inotify.Inotify.open(str(tmp_path))
    assert watcher is not None
    assert watcher.add("") and watcher.add("sub") and watcher.add("sub")
    assert watcher.read() == []
    (tmp_path / "sub" / "f.txt").write_text("x")
    (tmp_path / "d").mkdir()
    os.unlink(tmp_path / "sub" / "f.txt")
    events = watcher.read()
    names = {(rel_dir, name) for rel_dir, _mask, name in events}
    assert ("sub", "f.txt") in names and ("", "d") in names
    assert any(mask & _inotify.IN_ISDIR for _d, mask, name in events if name == "d")
    assert watcher.add("gone-already")  # a vanished directory needs no watch
    watcher.close()


def test_unavailable_inotify_means_full_scans(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without inotify a workdir still harvests, by scanning."""
    monkeypatch.setattr(_inotify, "_LIBC", None)
    assert _inotify.Inotify.open(str(tmp_path)) is None
    wd = materialize(
        Branch.from_tree(MemoryTree.from_files({"a": b"1"}), "x"), tmp_path / "wd", watch=True
    )
    assert not wd.watching
    Path(wd.root, "a").write_text("2")
    report = wd.harvest()
    assert report.full_scan and report.modified == ("a",)


def test_overflow_forces_a_full_scan(tmp_path: Path) -> None:
    """A queue overflow is answered with a full scan and a fresh set of watches."""
    wd = materialize(
        Branch.from_tree(MemoryTree.from_files({"d/a": b"1"}), "x"), tmp_path / "wd", watch=True
    )
    assert wd.watching
    assert wd._watcher is not None
    wd._watcher.overflowed = True
    Path(wd.root, "d/a").write_text("2")
    report = wd.harvest()
    assert report.full_scan and report.modified == ("d/a",)
    assert wd.watching
    Path(wd.root, "d/a").write_text("3")
    report = wd.harvest()
    assert not report.full_scan and report.modified == ("d/a",)
    wd.close()
