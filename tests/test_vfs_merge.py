"""Tests for orchestrator.vfs.merge: three-way merges, conflicts and strategies."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import pytest
import trio
import trio.lowlevel
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.vfs.apply import apply_changes
from orchestrator.vfs.branch import Branch
from orchestrator.vfs.changes import Delete, FileState, Write
from orchestrator.vfs.errors import MergeConflictError
from orchestrator.vfs.merge import (
    DELETE,
    Conflict,
    ConflictStrategy,
    MergeResult,
    common_base,
    merge_branches,
    merge_branches_async,
    merge_file,
)
from orchestrator.vfs.snapshot import Workspace
from orchestrator.vfs.testing import capture, make_tree
from orchestrator.vfs.tree import MemoryTree

BASE = b"".join(b"line %d\n" % i for i in range(10))


def lines_with(replacements: dict[int, bytes]) -> bytes:
    return b"".join(replacements.get(i, b"line %d\n" % i) for i in range(10))


def two(files: dict[str, bytes] | None = None) -> tuple[Branch, Branch]:
    tree = MemoryTree.from_files(files if files is not None else {"f.txt": BASE})
    return Branch.from_tree(tree, "ours"), Branch.from_tree(tree, "theirs")


def outcome(result: MergeResult) -> dict[str, tuple[str, int] | None]:
    tree = result.tree()
    return {
        p: None if (s := tree.state(p)) is None else (s.digest, s.mode)
        for p in result.net_changes()
    }


# --------------------------------------------------------------------------- properties

Edit = tuple[str, int, int]  # (owner, start line, how many new lines)


@st.composite
def disjoint_edits(
    draw: st.DrawFn, owners: Sequence[str] = ("a", "b")
) -> tuple[list[bytes], list[Edit]]:
    """Base lines and edits where different owners' blocks are separated by a kept line."""
    n = draw(st.integers(3, 30))
    base = [b"base %d\n" % i for i in range(n)]
    edits: list[Edit] = []
    i = draw(st.integers(0, 1))
    while i < n:
        owner = draw(st.sampled_from(list(owners)))
        edits.append((owner, i, draw(st.integers(0, 2))))
        i += 2 + draw(st.integers(0, 3))  # at least one untouched line before the next edit
    return base, edits


def apply_edits(base: list[bytes], edits: Sequence[Edit], owners: set[str]) -> bytes:
    out: list[bytes] = []
    mine = {start: (owner, count) for owner, start, count in edits if owner in owners}
    for i, line in enumerate(base):
        if i in mine:
            owner, count = mine[i]
            out.extend(b"%s-%d-%d\n" % (owner.encode(), i, k) for k in range(count))
        else:
            out.append(line)
    return b"".join(out)


@settings(max_examples=150, deadline=None)
@given(st.lists(disjoint_edits(), min_size=1, max_size=3))
def test_disjoint_line_edits_merge_like_applying_both_by_hand(
    files: list[tuple[list[bytes], list[Edit]]],
) -> None:
    """Two branches editing separated lines of the same files merge to both edits applied."""
    tree = MemoryTree.from_files({f"f{i}.txt": b"".join(base) for i, (base, _) in enumerate(files)})
    a, b = Branch.from_tree(tree, "a"), Branch.from_tree(tree, "b")
    for i, (base, edits) in enumerate(files):
        a.write(f"f{i}.txt", apply_edits(base, edits, {"a"}))
        b.write(f"f{i}.txt", apply_edits(base, edits, {"b"}))
    result = merge_branches([a, b])
    assert result.ok
    merged = result.tree()
    for i, (base, edits) in enumerate(files):
        assert merged.read(f"f{i}.txt") == apply_edits(base, edits, {"a", "b"})


@settings(max_examples=100, deadline=None)
@given(disjoint_edits(("a", "b", "c")), st.booleans(), st.booleans())
def test_merge_is_order_independent_without_conflicts(
    edits: tuple[list[bytes], list[Edit]], a_adds: bool, c_deletes: bool
) -> None:
    """Without conflicts, every merge order of three branches gives the same tree."""
    base, plan = edits
    tree = MemoryTree.from_files({"f.txt": b"".join(base), "g.txt": b"g\n", "x.sh": b"x\n"})
    branches = [Branch.from_tree(tree, name) for name in "abc"]
    for br in branches:
        br.write("f.txt", apply_edits(base, plan, {br.name}))
    if a_adds:
        branches[0].write("new.txt", b"from a\n")
    if c_deletes:
        branches[2].delete("g.txt")
    branches[1].chmod("x.sh", 0o755)
    results = [outcome(merge_branches(order)) for order in itertools.permutations(branches)]
    assert all(r == results[0] for r in results)
    assert not any(merge_branches(order).conflicts for order in itertools.permutations(branches))


@settings(max_examples=100, deadline=None)
@given(st.integers(3, 20), st.data())
def test_conflicting_pair_is_always_reported_under_fail(n: int, data: st.DataObject) -> None:
    """Different changes to the same line are never merged silently under `fail`."""
    base = [b"base %d\n" % i for i in range(n)]
    line = data.draw(st.integers(0, n - 1))
    ours_text = data.draw(st.binary(min_size=1, max_size=8).map(lambda x: x.hex().encode() + b"\n"))
    theirs_text = data.draw(
        st.binary(min_size=1, max_size=8).map(lambda x: x.hex().encode() + b"\n")
    )
    if ours_text == theirs_text:
        theirs_text = b"other " + theirs_text
    tree = MemoryTree.from_files({"f.txt": b"".join(base), "other.txt": b"o\n"})
    a, b = Branch.from_tree(tree, "a"), Branch.from_tree(tree, "b")
    a.write("f.txt", b"".join(ours_text if i == line else x for i, x in enumerate(base)))
    b.write("f.txt", b"".join(theirs_text if i == line else x for i, x in enumerate(base)))
    b.write("other.txt", b"clean\n")
    for order in ([a, b], [b, a]):
        result = merge_branches(order, strategy="fail")
        assert [c.path for c in result.conflicts] == ["f.txt"]
        assert "f.txt" not in result.changes
        assert result.tree().read("f.txt") == b"".join(base)
        assert result.tree().read("other.txt") == b"clean\n"
        assert not result.resolved


# --------------------------------------------------------------------------- files


def test_different_regions_merge_cleanly_over_a_workspace(tmp_path: Path) -> None:
    """Two branches of a real workspace editing different regions merge without conflict."""
    root = make_tree(tmp_path / "ws", {"f.txt": BASE, "keep.txt": b"k\n"})
    snap = Workspace.open(root).snapshot()
    a, b = Branch.from_tree(snap, "a"), Branch.from_tree(snap, "b")
    a.write("f.txt", lines_with({1: b"A\n"}))
    b.write("f.txt", lines_with({8: b"B\n"}))
    result = merge_branches([a, b])
    assert result.ok and result.sources == ("a", "b")
    assert dict(result.net_changes()) == {"f.txt": Write(lines_with({1: b"A\n", 8: b"B\n"}))}


def test_same_region_conflicts_and_workspace_is_unchanged(tmp_path: Path) -> None:
    """Overlapping edits make a Conflict with all versions; nothing touches the workspace."""
    root = make_tree(tmp_path / "ws", {"f.txt": BASE})
    before = capture(root)
    snap = Workspace.open(root).snapshot()
    a, b = Branch.from_tree(snap, "a"), Branch.from_tree(snap, "b")
    a.write("f.txt", lines_with({4: b"ours\n"}))
    b.write("f.txt", lines_with({4: b"theirs\n"}))
    result = merge_branches([a, b])
    assert not result.ok
    (conflict,) = result.conflicts
    assert conflict.kind == "content"
    assert (conflict.base, conflict.ours, conflict.theirs) == (
        BASE,
        lines_with({4: b"ours\n"}),
        lines_with({4: b"theirs\n"}),
    )
    assert conflict.hunks[0].base == (4, 5)
    assert conflict.hunks[0].ours == (4, 5) and conflict.hunks[0].theirs == (4, 5)
    assert (conflict.ours_name, conflict.theirs_name) == ("a", "b")
    with pytest.raises(MergeConflictError):
        apply_changes(result, state_dir=tmp_path / "state")
    with pytest.raises(MergeConflictError):
        result.fork("next")
    assert capture(root) == before


def test_markers_render_diff3_style() -> None:
    """with_markers shows ours, base and theirs between conflict markers."""
    a, b = two()
    a.write("f.txt", lines_with({2: b"mine\n"}))
    b.write("f.txt", lines_with({2: b"yours\n"}))
    (conflict,) = merge_branches([a, b]).conflicts
    text = conflict.with_markers()
    assert b"<<<<<<< ours\nmine\n||||||| base\nline 2\n=======\nyours\n>>>>>>> theirs\n" in text
    binary = Conflict("x", "binary", b"\0", b"\0a", b"\0b")
    with pytest.raises(ValueError, match="no line-level"):
        binary.with_markers()


def test_same_change_on_both_sides_is_not_a_conflict() -> None:
    """Identical edits (and identical new files, and both deleting) merge silently and rightly."""
    a, b = two({"f.txt": BASE, "gone.txt": b"g"})
    for br in (a, b):
        br.write("f.txt", lines_with({3: b"same\n"}))
        br.write("new.txt", b"same new\n")
        br.delete("gone.txt")
    result = merge_branches([a, b])
    assert result.ok
    assert dict(result.changes) == {
        "f.txt": Write(lines_with({3: b"same\n"})),
        "new.txt": Write(b"same new\n"),
        "gone.txt": Delete(),
    }


def test_one_side_changes_are_taken() -> None:
    """A path changed by one side only (even binary) takes that side."""
    a, b = two({"f.txt": BASE, "img.bin": b"\0\1\2"})
    a.write("img.bin", b"\0\x09\x09")
    b.write("f.txt", lines_with({0: b"B\n"}))
    result = merge_branches([a, b])
    assert result.ok
    assert result.tree().read("img.bin") == b"\0\x09\x09"


def test_binary_difference_is_a_conflict() -> None:
    """Both sides changing a binary file differently conflict, whatever the bytes."""
    a, b = two({"img.bin": b"\0head\nmiddle\ntail\n"})
    a.write("img.bin", b"\0HEAD\nmiddle\ntail\n")
    b.write("img.bin", b"\0head\nmiddle\nTAIL\n")
    (conflict,) = merge_branches([a, b]).conflicts
    assert conflict.kind == "binary"


def test_delete_against_modify_and_rename() -> None:
    """A deletion (or a rename away) against a modification conflicts; renames are delete + add."""
    a, b = two({"f.txt": BASE, "other.txt": b"o\n"})
    a.delete("f.txt")
    a.write("renamed.txt", BASE)
    b.write("f.txt", lines_with({0: b"edited\n"}))
    result = merge_branches([a, b])
    (conflict,) = result.conflicts
    assert conflict.kind == "delete/modify" and conflict.ours is None
    assert result.tree().read("renamed.txt") == BASE
    ours = merge_branches([a, b], strategy="ours")
    assert not ours.tree().exists("f.txt")
    theirs = merge_branches([a, b], strategy="theirs")
    assert theirs.tree().read("f.txt") == lines_with({0: b"edited\n"})


def test_modes_merge_on_their_own() -> None:
    """A mode change on one side and a content change on the other both survive."""
    a, b = two({"run.sh": BASE})
    a.chmod("run.sh", 0o755)
    b.write("run.sh", lines_with({9: b"echo\n"}))
    result = merge_branches([a, b])
    assert result.ok
    state = result.tree().state("run.sh")
    assert state is not None and state.mode == 0o100755 and state.data == lines_with({9: b"echo\n"})


def test_conflicting_modes() -> None:
    """Both sides setting different modes is a mode conflict; ours/theirs pick one."""
    a, b = two({"run.sh": BASE})
    a.chmod("run.sh", 0o755)
    b.chmod("run.sh", 0o600)
    (conflict,) = merge_branches([a, b]).conflicts
    assert conflict.kind == "mode"
    assert merge_branches([a, b], strategy="theirs").tree().mode("run.sh") == 0o100600
    a.write("run.sh", lines_with({0: b"first\n"}))
    b.write("run.sh", lines_with({9: b"last\n"}))
    (conflict,) = merge_branches([a, b]).conflicts
    assert conflict.kind == "mode"
    state = merge_branches([a, b], strategy="ours").tree().state("run.sh")
    assert state is not None and state.mode == 0o100755
    assert state.data == lines_with({0: b"first\n", 9: b"last\n"})
    assert merge_branches([a, b], strategy="union").conflicts


def test_add_add_conflict_and_union() -> None:
    """Two different new files at one path conflict; union keeps both, ours first."""
    a, b = two({})
    a.write("CHANGES", b"a entry\n")
    b.write("CHANGES", b"b entry\n")
    (conflict,) = merge_branches([a, b]).conflicts
    assert conflict.kind == "add/add" and conflict.base is None
    assert merge_branches([a, b], strategy="union").tree().read("CHANGES") == b"a entry\nb entry\n"


@pytest.mark.parametrize(
    ("strategy", "expected"),
    [
        ("ours", b"head\nA\nmiddle\ntail\n"),
        (ConflictStrategy.THEIRS, b"head\nB\nmiddle\ntail\n"),
        ("union", b"head\nA\nB\nmiddle\ntail\n"),
    ],
)
def test_builtin_strategies_on_an_append_conflict(
    strategy: str | ConflictStrategy, expected: bytes
) -> None:
    """ours, theirs and union settle overlapping hunks and report the conflict as resolved."""
    a, b = two({"log": b"head\nmiddle\ntail\n"})
    a.write("log", b"head\nA\nmiddle\ntail\n")
    b.write("log", b"head\nB\nmiddle\ntail\n")
    result = merge_branches([a, b], strategy=ConflictStrategy(strategy))
    assert result.ok and len(result.resolved) == 1
    assert result.tree().read("log") == expected


def test_strategies_keep_non_conflicting_hunks() -> None:
    """`ours` only decides overlapping hunks; the other side's separate edits still merge."""
    a, b = two()
    a.write("f.txt", lines_with({2: b"A2\n"}))
    b.write("f.txt", lines_with({2: b"B2\n", 8: b"B8\n"}))
    result = merge_branches([a, b], strategy="ours")
    assert result.tree().read("f.txt") == lines_with({2: b"A2\n", 8: b"B8\n"})


def test_union_cannot_settle_binary_or_deletions() -> None:
    """union leaves non-text conflicts unresolved."""
    a, b = two({"img": b"\0x", "f": b"f\n"})
    a.write("img", b"\0a")
    b.write("img", b"\0b")
    a.delete("f")
    b.write("f", b"g\n")
    assert {c.kind for c in merge_branches([a, b], strategy="union").conflicts} == {
        "binary",
        "delete/modify",
    }


def test_resolver_callback() -> None:
    """A resolver gets each Conflict; bytes, DELETE, FileState and None are honoured."""
    a, b = two({"f.txt": BASE, "g.txt": BASE, "h.txt": BASE, "k.txt": BASE})
    for name in ("f.txt", "g.txt", "h.txt", "k.txt"):
        a.write(name, lines_with({5: b"a\n"}))
        b.write(name, lines_with({5: b"b\n"}))
    answers = {
        "f.txt": b"resolved\n",
        "g.txt": DELETE,
        "h.txt": FileState(b"exec\n", 0o755),
        "k.txt": None,
    }
    seen: list[Conflict] = []

    def resolver(conflict: Conflict) -> bytes | FileState | object | None:
        seen.append(conflict)
        return answers[conflict.path]

    result = merge_branches([a, b], strategy=resolver)
    assert sorted(c.path for c in seen) == ["f.txt", "g.txt", "h.txt", "k.txt"]
    tree = result.tree()
    assert tree.read("f.txt") == b"resolved\n"
    assert not tree.exists("g.txt")
    assert tree.mode("h.txt") == 0o100755
    assert [c.path for c in result.conflicts] == ["k.txt"]
    assert len(result.resolved) == 3


async def test_async_resolver() -> None:
    """merge_branches_async awaits an async resolver; the sync merge refuses one."""
    a, b = two()
    a.write("f.txt", lines_with({5: b"a\n"}))
    b.write("f.txt", lines_with({5: b"b\n"}))

    async def resolver(conflict: Conflict) -> bytes:
        await trio.lowlevel.checkpoint()
        return b"async\n"

    result = await merge_branches_async([a, b], strategy=resolver)
    assert result.tree().read("f.txt") == b"async\n"
    with pytest.raises(TypeError, match="merge_branches_async"):
        merge_branches([a, b], strategy=resolver)
    plain = await merge_branches_async([a, b], strategy=lambda c: b"sync\n")
    assert plain.tree().read("f.txt") == b"sync\n"


def test_n_way_merge_folds_pairwise() -> None:
    """Three branches merge; a path conflicted earlier stays conflicted, later changes join it."""
    tree = MemoryTree.from_files({"f.txt": BASE, "g.txt": BASE})
    a, b, c = (Branch.from_tree(tree, n) for n in "abc")
    a.write("f.txt", lines_with({0: b"a\n"}))
    b.write("f.txt", lines_with({5: b"b\n"}))
    c.write("f.txt", lines_with({9: b"c\n"}))
    a.write("g.txt", lines_with({1: b"a\n"}))
    b.write("g.txt", lines_with({1: b"b\n"}))
    c.write("g.txt", lines_with({1: b"a\n"}))
    result = merge_branches([a, b, c])
    assert result.tree().read("f.txt") == lines_with({0: b"a\n", 5: b"b\n", 9: b"c\n"})
    assert [(x.path, x.ours_name, x.theirs_name) for x in result.conflicts] == [("g.txt", "a", "b")]
    assert result.tree().read("g.txt") == BASE
    c.write("g.txt", lines_with({1: b"c\n"}))
    (conflict,) = merge_branches([a, b, c]).conflicts
    assert (conflict.path, conflict.theirs_name) == ("g.txt", "b")
    assert conflict.also_changed == (("c", lines_with({1: b"c\n"})),)


def test_merge_of_forks_uses_the_nearest_common_base() -> None:
    """Branches forked from a branch merge against the fork point; a step forks from a merge."""
    root = Branch.from_tree(MemoryTree.from_files({"f.txt": BASE}), "root")
    root.write("f.txt", lines_with({0: b"root\n"}))
    x, y = root.fork("x"), root.fork("y")
    assert common_base([x, y]) is x.base
    x.write("f.txt", lines_with({0: b"root\n", 4: b"x\n"}))
    y.write("f.txt", lines_with({0: b"root\n", 8: b"y\n"}))
    merged = merge_branches([x, y])
    assert merged.ok and merged.base is x.base
    step = merged.fork("step")
    assert step.read("f.txt") == lines_with({0: b"root\n", 4: b"x\n", 8: b"y\n"})
    assert dict(merged.net_changes()) == {"f.txt": Write(step.read("f.txt"))}
    single = merge_branches([x])
    assert single.ok and single.tree().read("f.txt") == x.read("f.txt")
    with pytest.raises(ValueError, match="common"):
        common_base([x, Branch.from_tree(MemoryTree.from_files({}), "alien")])
    with pytest.raises(ValueError, match="nothing"):
        merge_branches([])


def test_forks_of_one_merge_merge_against_the_merged_tree() -> None:
    """Branches forked from one merge (a fan-out after it) merge against the merged tree."""
    root = Branch.from_tree(MemoryTree.from_files({}), "root")
    x, y = root.fork("x"), root.fork("y")
    x.write("notes.txt", b"first\n")
    y.write("other.txt", b"other\n")
    merged = merge_branches([x, y])
    a, b = merged.fork("a"), merged.fork("b")
    assert common_base([a, b]) is merged.tree()
    a.write("notes.txt", b"first\na\n")
    b.write("b.txt", b"b\n")
    both = merge_branches([a, b])
    assert both.ok
    assert both.tree().read("notes.txt") == b"first\na\n"
    assert both.tree().read("b.txt") == b"b\n"


def test_merge_file_direct() -> None:
    """merge_file merges one path's three versions."""
    base = FileState(b"1\n2\n3\n")
    assert merge_file("p", base, FileState(b"x\n2\n3\n"), FileState(b"1\n2\ny\n")) == FileState(
        b"x\n2\ny\n"
    )
    assert merge_file("p", base, None, base) is None
    assert isinstance(merge_file("p", base, None, FileState(b"z\n")), Conflict)
    assert ConflictStrategy("union") is ConflictStrategy.UNION


# --------------------------------------------------------------------------- fan-in of several


def fan_in(*names: str, files: dict[str, bytes] | None = None) -> list[Branch]:
    """Branches named ``names`` forked from one tree (a fan-in's parents, in order)."""
    tree = MemoryTree.from_files(files if files is not None else {"CHANGES": b"# Changes\n"})
    return [Branch.from_tree(tree, n) for n in names]


def test_one_unresolved_path_of_many_branches_is_one_conflict() -> None:
    """Four branches clashing on a path make one conflict; the later ones join it, labelled."""
    branches = fan_in("s[a]", "s[b]", "s[c]", "s[d]")
    for b in branches:
        b.write("CHANGES", b"# Changes\n- %s\n" % b.name.encode())
    branches[2].delete("CHANGES")
    (conflict,) = merge_branches(branches).conflicts
    assert (conflict.ours_name, conflict.theirs_name) == ("s[a]", "s[b]")
    # ours is what its label says: the merge so far (here s[a] alone); theirs is s[b]
    assert conflict.ours == b"# Changes\n- s[a]\n"
    assert conflict.theirs == b"# Changes\n- s[b]\n"
    assert conflict.also_changed == (("s[c]", None), ("s[d]", b"# Changes\n- s[d]\n"))


def test_a_resolved_clash_labels_ours_as_the_merge_so_far() -> None:
    """With `union`, the third branch's clash has ours = the merge of the first two, so labelled."""
    branches = fan_in("s[a]", "s[b]", "s[c]")
    for b in branches:
        b.write("CHANGES", b"# Changes\n- %s\n" % b.name.encode())
    result = merge_branches(branches, strategy="union")
    assert result.ok
    first, second = result.resolved
    assert (first.ours_name, first.theirs_name) == ("s[a]", "s[b]")
    assert (second.ours_name, second.theirs_name) == ("s[a]+s[b]", "s[c]")
    assert second.ours == b"# Changes\n- s[a]\n- s[b]\n"
    assert result.tree().read("CHANGES") == b"# Changes\n- s[a]\n- s[b]\n- s[c]\n"


# --------------------------------------------------------------------------- nearest bases


def ancestor_with_three_sinks() -> tuple[Branch, Branch, Branch]:
    """``x`` and ``y`` forked from ``a``, which created notes.txt (y appends to it), and ``z``
    beside ``a``."""
    root = Branch.from_tree(MemoryTree.from_files({}), "root")
    a = root.fork("a")
    a.write("notes.txt", b"first\n")
    x, y = a.fork("x"), a.fork("y")
    y.write("notes.txt", b"first\ny\n")
    z = root.fork("z")
    z.write("z.txt", b"z\n")
    return x, y, z


def test_branches_of_a_nearer_base_merge_against_it_whatever_else_is_merged() -> None:
    """Two forks of a step and a third branch beside it merge cleanly, in every order."""
    x, y, z = ancestor_with_three_sinks()
    for order in itertools.permutations([x, y, z]):
        result = merge_branches(order)
        assert result.ok, order
        assert result.tree().read("notes.txt") == b"first\ny\n"
        assert result.tree().read("z.txt") == b"z\n"
        assert dict(result.net_changes()) == {
            "notes.txt": Write(b"first\ny\n"),
            "z.txt": Write(b"z\n"),
        }
    # the nearer pair merges first, then the rest: merge order and names say so
    assert merge_branches([z, x, y]).sources == ("z", "x", "y")
    assert merge_branches([x, z, y]).sources == ("x", "y", "z")


def test_a_conflict_of_a_nearer_base_keeps_its_base_versions_and_labels() -> None:
    """A clash between forks of one step is against that step's version, labelled by them."""
    x, y, z = ancestor_with_three_sinks()
    x.write("notes.txt", b"first\nx\n")
    (conflict,) = merge_branches([z, x, y]).conflicts
    assert (conflict.path, conflict.kind) == ("notes.txt", "content")
    assert (conflict.base, conflict.ours, conflict.theirs) == (
        b"first\n",
        b"first\nx\n",
        b"first\ny\n",
    )
    assert (conflict.ours_name, conflict.theirs_name, conflict.also_changed) == ("x", "y", ())
    result = merge_branches([z, x, y])
    # the conflicted file stays at its conflict's base version (the step's), the rest merges
    assert result.tree().read("notes.txt") == b"first\n"
    assert result.tree().read("z.txt") == b"z\n"
    # a branch beside them that changed the path too joins the one conflict, in merge order
    z.write("notes.txt", b"z\n")
    (conflict,) = merge_branches([z, x, y]).conflicts
    assert (conflict.ours_name, conflict.theirs_name) == ("x", "y")
    assert conflict.also_changed == (("z", b"z\n"),)
    (conflict,) = merge_branches([x, y, z]).conflicts
    assert conflict.also_changed == (("z", b"z\n"),)


def test_strategies_settle_each_merge_against_its_own_base() -> None:
    """`theirs` settles the forks' clash, then the merge of them against the branch beside."""
    x, y, z = ancestor_with_three_sinks()
    x.write("notes.txt", b"first\nx\n")
    z.write("notes.txt", b"z\n")
    result = merge_branches([z, x, y], strategy="theirs")
    assert result.ok
    first, second = result.resolved
    assert (first.ours_name, first.theirs_name, first.base) == ("x", "y", b"first\n")
    assert (second.ours_name, second.theirs_name, second.kind) == ("z", "x+y", "add/add")
    assert (second.base, second.ours, second.theirs) == (None, b"z\n", b"first\ny\n")
    assert result.tree().read("notes.txt") == b"first\ny\n"
    ours = merge_branches([z, x, y], strategy="ours")
    assert ours.tree().read("notes.txt") == b"z\n"


def test_a_step_and_one_forked_from_it_merge_against_the_fork_point() -> None:
    """A branch and its fork merge against the tree the fork started from, while it is current."""
    root = Branch.from_tree(MemoryTree.from_files({}), "root")
    a = root.fork("a")
    a.write("notes.txt", b"first\n")
    after = a.fork("after")
    after.write("notes.txt", b"first\nafter\n")
    assert common_base([a, after]) is after.base
    result = merge_branches([a, after])
    assert result.ok
    assert result.tree().read("notes.txt") == b"first\nafter\n"
    assert merge_branches([after, a]).tree().read("notes.txt") == b"first\nafter\n"
    # a branch changed after the fork came from the fork point: a clash is against it
    a.write("notes.txt", b"first\na\n")
    (conflict,) = merge_branches([a, after]).conflicts
    assert (conflict.kind, conflict.base) == ("content", b"first\n")
    assert (conflict.ours, conflict.theirs) == (b"first\na\n", b"first\nafter\n")
    a.write("notes.txt", b"first\n")
    a.write("a.txt", b"a\n")
    result = merge_branches([a, after])
    assert result.ok
    assert result.tree().read("notes.txt") == b"first\nafter\n"
    assert result.tree().read("a.txt") == b"a\n"


def parents() -> tuple[Branch, Branch]:
    """Two branches of an empty tree, each creating a file."""
    root = Branch.from_tree(MemoryTree.from_files({}), "root")
    a, b = root.fork("a"), root.fork("b")
    a.write("a.txt", b"a\n")
    b.write("b.txt", b"b\n")
    return a, b


def test_a_step_after_a_merge_and_one_after_a_parent_merge_against_that_parent() -> None:
    """A fork of a merge and a fork of one merged branch merge against that branch's state."""
    a, b = parents()
    after_both = merge_branches([a, b]).fork("after_both")
    after_a = a.fork("after_a")
    after_a.write("a.txt", b"a\nafter a\n")
    for order in ([after_both, after_a], [after_a, after_both]):
        result = merge_branches(order)
        assert result.ok
        assert dict(result.net_changes()) == {
            "a.txt": Write(b"a\nafter a\n"),
            "b.txt": Write(b"b\n"),
        }


def test_forks_of_separate_merges_of_the_same_branches_merge_against_them() -> None:
    """Two steps after the same parents merge them apart; their branches still merge cleanly."""
    a, b = parents()
    first, second = merge_branches([a, b]), merge_branches([b, a])
    assert first.tree() is not second.tree()
    left, right = first.fork("left"), second.fork("right")
    left.write("a.txt", b"a\nleft\n")
    right.write("right.txt", b"right\n")
    result = merge_branches([left, right])
    assert result.ok
    assert dict(result.net_changes()) == {
        "a.txt": Write(b"a\nleft\n"),
        "b.txt": Write(b"b\n"),
        "right.txt": Write(b"right\n"),
    }


def test_merges_that_settled_a_clash_apart_merge_against_a_virtual_base() -> None:
    """Forks of two merges of one clash compare against the clash's own merge (criss-cross)."""
    a, b = parents()
    a.write("f.txt", b"a\n")
    b.write("f.txt", b"b\n")
    first, second = merge_branches([a, b], strategy="ours"), merge_branches([a, b], strategy="ours")
    left, right = first.fork("left"), second.fork("right")
    left.write("left.txt", b"left\n")
    # settled the same way: no change of either side against their parents' merge
    result = merge_branches([left, right])
    assert result.ok
    assert result.tree().read("f.txt") == b"a\n"
    assert result.tree().read("left.txt") == b"left\n"
    # settled differently: the clash is theirs again, against the version both parents had
    other = merge_branches([a, b], strategy="theirs").fork("other")
    (conflict,) = merge_branches([left, other]).conflicts
    assert (conflict.path, conflict.kind) == ("f.txt", "add/add")
    assert (conflict.base, conflict.ours, conflict.theirs) == (None, b"a\n", b"b\n")
    assert (conflict.ours_name, conflict.theirs_name) == ("left", "other")


PATHS = ("p", "q", "r")


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_random_forks_merge_each_against_their_nearest_common_base(data: st.DataObject) -> None:
    """Any set of branches of a random tree of forks and edits merges as its nearest bases say.

    A model of the branches' frozen states (a branch never changed is its base; one frozen by a
    fork is that tree until it changes; a later state comes from the last one frozen) gives
    each branch's chain of trees. Merging, for every tree from the nearest up, what the
    branches through each tree above it merged to gives the expected files. A path no two
    branches changed differently from their nearest common tree never conflicts and holds
    that; with no such path at all, the merge is clean and the same in any order.
    """
    Files = dict[str, bytes]
    contents: dict[object, Files] = {"root": {"p": b"0\n"}}  # tree -> its files
    below: dict[object, object] = {}  # tree -> the tree its state came from
    branches = [Branch.from_tree(MemoryTree.from_files(contents["root"]), "b0")]
    states: list[Files] = [dict(contents["root"])]
    bases: list[object] = ["root"]
    frozen: list[object | None] = [None]  # the branch frozen as it is now, if it was
    last: list[object | None] = [None]  # the last tree the branch was frozen to
    versions = [0]
    written = itertools.count(1)

    def freeze(i: int) -> object:
        """The tree branch ``i`` is now, as Branch.freeze makes it."""
        if frozen[i] is None:
            if last[i] is None and states[i] == contents[bases[i]]:
                return bases[i]
            tree = ("state of", i, versions[i])
            contents[tree] = dict(states[i])
            below[tree] = bases[i] if last[i] is None else last[i]
            frozen[i] = last[i] = tree
        return frozen[i]

    for _ in range(data.draw(st.integers(2, 20), label="ops")):
        i = data.draw(st.integers(0, len(branches) - 1), label="branch")
        op = data.draw(st.sampled_from(["fork", "fork", "write", "write", "delete"]), label="op")
        if op == "fork":
            branches.append(branches[i].fork(f"b{len(branches)}"))
            bases.append(freeze(i))
            states.append(dict(states[i]))
            frozen.append(None)
            last.append(None)
            versions.append(0)
            continue
        path = data.draw(st.sampled_from(PATHS), label="path")
        if op == "delete" and path not in states[i]:
            continue
        if op == "delete":
            branches[i].delete(path)
            del states[i][path]
        else:
            # one line, never written before: two different changes of a file conflict, and
            # two branches make the same change only by sharing it (or both deleting a file)
            value = b"%d\n" % next(written)
            branches[i].write(path, value)
            states[i][path] = value
        versions[i] += 1
        frozen[i] = None
    chosen = data.draw(st.permutations(range(len(branches))), label="order")
    members = chosen[: data.draw(st.integers(min(2, len(chosen)), len(chosen)), label="how many")]

    def chain(i: int) -> list[object]:
        trees = []
        tree: object | None = freeze(i)
        while tree is not None:
            trees.append(tree)
            tree = below.get(tree)
        return trees

    def nearest(group: Sequence[int]) -> object:
        return next(t for t in chain(group[0]) if all(t in chain(j) for j in group[1:]))

    def expect(group: Sequence[int], base: object) -> tuple[Files, set[str]]:
        """The merge of ``group`` over ``base``, their nearest common tree: files, conflicts."""
        by_tree: dict[object, list[int]] = {}
        for j in group:
            trees = chain(j)
            at = trees.index(base)
            by_tree.setdefault(trees[at - 1] if at else ("own", j), []).append(j)
        sides = [
            expect(g, nearest(g)) if len(g) > 1 else (states[g[0]], set()) for g in by_tree.values()
        ]
        files, conflicts = dict(contents[base]), set().union(*(c for _, c in sides))
        for path in PATHS:
            changed = {s.get(path) for s, _ in sides if s.get(path) != files.get(path)}
            if len(changed) > 1:
                conflicts.add(path)
            elif changed and path not in conflicts:
                value = changed.pop()
                if value is None:
                    files.pop(path, None)
                else:
                    files[path] = value
        return files, conflicts

    def differently(i: int, j: int, path: str) -> bool:
        base = contents[nearest([i, j])].get(path)
        ours, theirs = states[i].get(path), states[j].get(path)
        return ours != base and theirs != base and ours != theirs

    files, _ = expect(members, nearest(members))
    names = {branches[j].name for j in members}
    clean = [
        p
        for p in PATHS
        if not any(differently(i, j, p) for i, j in itertools.combinations(members, 2))
    ]
    outcomes = []
    for order in (members, members[::-1]):
        result = merge_branches([branches[j] for j in order])
        conflicted = [c.path for c in result.conflicts]
        assert len(set(conflicted)) == len(conflicted)  # one conflict per path
        for c in result.conflicts:
            # a real one: both sides changed the path from its base, differently
            assert len({c.base, c.ours, c.theirs}) == 3
            labels = [c.ours_name, c.theirs_name, *(name for name, _ in c.also_changed)]
            assert {n for label in labels for n in label.split("+")} <= names
        merged = result.tree()
        for p in clean:
            assert p not in conflicted
            assert merged.state(p) == (None if p not in files else FileState(files[p]))
        outcomes.append(outcome(result))
        if len(clean) == len(PATHS):
            assert result.ok
    if len(clean) == len(PATHS):
        assert outcomes[0] == outcomes[1]
