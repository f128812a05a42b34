"""Tests for orchestrator.vfs.watch: early warning of overlapping live branches."""

from __future__ import annotations

import threading

import pytest
import trio
from log_capture import capture_logs

from orchestrator.vfs.branch import Branch
from orchestrator.vfs.tree import MemoryTree
from orchestrator.vfs.watch import ConflictWatch, EarlyWarning


def pair(watch: ConflictWatch) -> tuple[Branch, Branch]:
    tree = MemoryTree.from_files({"shared.txt": b"s\n", "a.txt": b"a\n"})
    return Branch.from_tree(tree, "a", watch=watch), Branch.from_tree(tree, "b", watch=watch)


def test_overlap_fires_callback_and_log_once() -> None:
    """Two live branches changing one path trigger one warning (callback + log line)."""
    watch = ConflictWatch()
    seen: list[EarlyWarning] = []
    watch.add_callback(seen.append)
    a, b = pair(watch)
    with capture_logs() as logs:
        a.write("shared.txt", b"A")
        b.write("a.txt", b"B")
        assert seen == []
        b.write("shared.txt", b"B")
        b.write("shared.txt", b"B2")
        a.write("shared.txt", b"A2")
    assert [(w.path, w.branches) for w in seen] == [("shared.txt", ("a", "b"))]
    assert watch.history == seen
    assert watch.overlaps() == {"shared.txt": ("a", "b")}
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert warnings and warnings[0]["path"] == "shared.txt"
    watch.remove_callback(seen.append)


def test_closed_branches_do_not_count() -> None:
    """After close(), a branch's paths no longer produce warnings."""
    watch = ConflictWatch()
    a, b = pair(watch)
    a.write("shared.txt", b"A")
    a.close()
    b.write("shared.txt", b"B")
    assert watch.history == [] and watch.overlaps() == {}


def test_names_of_live_branches_are_unique() -> None:
    """Registering a second live branch under a used name is an error."""
    watch = ConflictWatch()
    pair(watch)
    with pytest.raises(ValueError, match="already registered"):
        Branch.from_tree(MemoryTree.from_files({}), "a", watch=watch)


def test_failing_callback_does_not_break_the_write() -> None:
    """A callback that raises is logged; the change is still recorded."""
    watch = ConflictWatch()

    def boom(_: EarlyWarning) -> None:
        raise RuntimeError("observer bug")

    watch.add_callback(boom)
    a, b = pair(watch)
    a.write("shared.txt", b"A")
    with capture_logs() as logs:
        b.write("shared.txt", b"B")
    assert b.read("shared.txt") == b"B"
    assert any(e["event"] == "early-warning callback failed" for e in logs)


async def test_warnings_arrive_on_a_trio_channel() -> None:
    """A subscribed memory channel receives warnings, also from worker threads."""
    watch = ConflictWatch()
    receive = watch.subscribe()
    a, b = pair(watch)
    a.write("shared.txt", b"A")
    b.write("shared.txt", b"B")
    with trio.fail_after(5):
        first = await receive.receive()
    assert first.branches == ("a", "b")

    def in_thread() -> None:
        a.write("a.txt", b"A")
        b.write("a.txt", b"B")

    with trio.fail_after(5):
        await trio.to_thread.run_sync(in_thread)
        second = await receive.receive()
    assert second.path == "a.txt"
    await receive.aclose()
    b.write("a.txt", b"B2")  # closed channel: silently unsubscribed
    assert threading.active_count() >= 1


async def test_full_bounded_channel_drops_with_log() -> None:
    """A full bounded channel drops the warning instead of blocking the branch."""
    watch = ConflictWatch()
    receive = watch.subscribe(max_buffer_size=0)
    a, b = pair(watch)
    a.write("shared.txt", b"A")
    with capture_logs() as logs:
        b.write("shared.txt", b"B")
    assert any("dropped" in e["event"] for e in logs)
    await receive.aclose()
