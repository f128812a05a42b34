"""Tests for orchestrator.vfs._inotify: the change-notification accelerator for harvests."""

from __future__ import annotations

import gc
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


def test_a_file_watch_tells_what_is_done_through_another_name(tmp_path: Path) -> None:
    """A file's watch names it for a write, a chmod and a new name made elsewhere, by the path
    it was watched at, and keeps those paths in ``touched``."""
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "f").write_text("x")
    watcher = _inotify.Inotify.open(str(tmp_path / "w"))
    assert watcher is not None
    watcher.touched = {}
    assert watcher.add_files(["f"])
    os.link(tmp_path / "w" / "f", tmp_path / "elsewhere")  # a directory's watch sees nothing
    (tmp_path / "elsewhere").write_text("y")
    os.chmod(tmp_path / "elsewhere", 0o600)
    events = watcher.read()
    assert events and all((rel_dir, name) == ("", "f") for rel_dir, _mask, name in events)
    touched = watcher.take_touched()
    assert set(touched) == {"f"}
    assert touched["f"] & _inotify.IN_MODIFY and touched["f"] & _inotify.IN_ATTRIB
    assert watcher.take_touched() == {}
    watcher.close()


def test_file_watches_take_a_quarter_of_the_limit_at_most(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """File watches beyond a quarter of the user's limit are not added: the watcher is no
    longer complete; the room comes back when it is closed or dropped unclosed."""
    for i in range(6):
        (tmp_path / f"f{i}").write_text("x")
    limit = 4 * (_inotify._files_held + 4)
    monkeypatch.setattr(_inotify, "_limit", limit)
    watcher = _inotify.Inotify.open(str(tmp_path))
    assert watcher is not None
    watcher.complete = True
    assert _inotify.file_watch_room() == 4
    assert watcher.add_files(["f0", "f1", "f2"])
    assert _inotify.file_watch_room() == 1
    assert not watcher.add_files(["f3", "f4"]) and not watcher.complete
    watcher.close()
    assert _inotify.file_watch_room() == 4
    dropped = _inotify.Inotify.open(str(tmp_path))
    assert dropped is not None and dropped.add_files(["f0", "f1"])
    assert _inotify.file_watch_room() == 2
    del dropped
    gc.collect()
    assert _inotify.file_watch_room() == 4


def test_a_deleted_file_gives_its_watch_back(tmp_path: Path) -> None:
    """A watched file deleted for good gives its watch's room back once its events are read."""
    (tmp_path / "f").write_text("x")
    watcher = _inotify.Inotify.open(str(tmp_path))
    assert watcher is not None
    before = _inotify.file_watch_room()
    assert watcher.add_files(["f"])
    assert _inotify.file_watch_room() == before - 1
    os.unlink(tmp_path / "f")
    watcher.read()
    assert _inotify.file_watch_room() == before
    watcher.close()
