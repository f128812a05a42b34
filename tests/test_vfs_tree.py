"""Tests for orchestrator.vfs.tree: memory trees, layers, composition."""

from __future__ import annotations

import pytest

from orchestrator.vfs.changes import ChangeSet, Delete, FileState, ModeChange, Write
from orchestrator.vfs.errors import PathNotFound
from orchestrator.vfs.tree import (
    Layer,
    MemoryTree,
    Tree,
    ancestors,
    change_between,
    compose,
    net_changes,
    root_of,
)


def test_memory_tree_reads() -> None:
    """A memory tree answers content, digest, mode and existence."""
    tree = MemoryTree.from_files({"a.txt": b"A", "./d/b": FileState(b"B", 0o755)})
    assert isinstance(tree, Tree)
    assert set(tree.paths()) == {"a.txt", "d/b"}
    assert tree.read("a.txt") == b"A"
    assert tree.mode("d/b") == 0o100755
    assert tree.digest("nope") is None and tree.state("nope") is None
    with pytest.raises(PathNotFound):
        tree.read("nope")


def test_layer_overlays_parent() -> None:
    """A layer's writes, deletions and mode changes hide the parent's versions."""
    root = MemoryTree.from_files({"a": b"1", "b": b"2", "c": b"3"})
    layer = Layer(
        root,
        ChangeSet.of({"a": Write(b"x"), "b": Delete(), "c": ModeChange(0o700), "n": Write(b"new")}),
    )
    assert set(layer.paths()) == {"a", "c", "n"}
    assert layer.read("a") == b"x" and layer.read("c") == b"3"
    assert layer.mode("c") == 0o100700
    assert not layer.exists("b") and layer.digest("b") is None and layer.mode("b") is None
    state = layer.state("c")
    assert state is not None and state.data == b"3" and state.mode == 0o100700
    with pytest.raises(PathNotFound):
        layer.read("b")
    assert ancestors(layer) == [layer, root] and root_of(layer) is root


def test_compose_folds_layers_in_order() -> None:
    """compose gives the changes from an ancestor, later layers winning, mode over write merged."""
    root = MemoryTree.from_files({"a": b"1"})
    one = Layer(root, ChangeSet.of({"a": Write(b"x"), "gone": Write(b"g")}))
    two = Layer(one, ChangeSet.of({"a": ModeChange(0o755), "gone": Delete()}))
    raw = compose(two, root)
    assert raw["a"] == Write(b"x", 0o755)
    assert isinstance(raw["gone"], Delete)
    with pytest.raises(TypeError):
        compose(root, two)


def test_change_between_and_net_changes_drop_noops() -> None:
    """A state equal to the base is no change; net_changes keeps only real ones."""
    root = MemoryTree.from_files({"a": b"1", "b": b"2"})
    assert change_between(root, "a", FileState(b"1")) is None
    assert change_between(root, "a", FileState(b"1", 0o755)) == ModeChange(0o755)
    assert change_between(root, "a", None) == Delete()
    assert change_between(root, "zz", None) is None
    assert change_between(root, "zz", FileState(b"n")) == Write(b"n")
    layer = Layer(root, ChangeSet.of({"a": Write(b"1"), "b": Write(b"3")}))
    assert dict(net_changes(layer.state, ["a", "b"], root)) == {"b": Write(b"3")}


def test_a_file_become_a_link_to_its_own_text_is_a_write() -> None:
    """A file replaced by a symlink whose target is the file's text is new content, not a mode
    change (which only sets permission bits)."""
    root = MemoryTree.from_files({"a": b"/etc/passwd"})
    link = FileState(b"/etc/passwd", 0o120777)
    assert change_between(root, "a", link) == Write(b"/etc/passwd", 0o120777)
