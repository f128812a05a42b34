"""Tests for orchestrator.vfs.changes: change values and change sets."""

from __future__ import annotations

import stat

from orchestrator.vfs.changes import ChangeSet, Delete, FileState, ModeChange, Write


def test_write_digest_and_mode_normalization() -> None:
    """A write hashes its content and stores a full mode."""
    w = Write(b"hello", 0o755)
    assert w.mode == stat.S_IFREG | 0o755
    assert w.digest == FileState(b"hello").digest
    assert w.state().same_as(FileState(b"hello", 0o755))
    assert Write.from_state(w.state()) == w


def test_change_set_is_sorted_and_classified() -> None:
    """A change set iterates in path order and groups its changes by kind."""
    cs = ChangeSet.of({"z": Delete(), "a": Write(b"x"), "m": ModeChange(0o755)})
    assert list(cs) == ["a", "m", "z"]
    assert cs.written == ("a",)
    assert cs.deleted == ("z",)
    assert cs.mode_changed == ("m",)
    assert len(cs) == 3 and "a" in cs and "q" not in cs
    assert cs.summary() == "1 written, 1 deleted, 1 mode changes"
    assert ChangeSet.of(cs) is cs


def test_file_state_equality_is_by_content_and_mode() -> None:
    """same_as compares digest and mode, not identity."""
    assert FileState(b"a").same_as(FileState(b"a"))
    assert not FileState(b"a").same_as(FileState(b"a", 0o755))
    assert not FileState(b"a").same_as(None)
