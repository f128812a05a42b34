"""Tests for orchestrator.vfs._lines: the line matcher behind merges and diffs."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator.vfs._lines import LineMatcher, matching_blocks

lines = st.lists(st.sampled_from([b"a\n", b"b\n", b"c\n", b"}\n", b"\n", b"x"]), max_size=40)


@settings(max_examples=300, deadline=None)
@given(lines, lines)
def test_blocks_are_valid_matches(a: list[bytes], b: list[bytes]) -> None:
    """Blocks match equal lines, increase on both sides, do not touch, and end in a sentinel."""
    blocks = matching_blocks(a, b)
    assert blocks[-1] == (len(a), len(b), 0)
    prev_i = prev_j = 0
    for i, j, n in blocks[:-1]:
        assert n > 0 and i >= prev_i and j >= prev_j
        assert a[i : i + n] == b[j : j + n]
        prev_i, prev_j = i + n, j + n
    for (i1, j1, n1), (i2, j2, _) in itertools.pairwise(blocks[:-1]):
        assert not (i1 + n1 == i2 and j1 + n1 == j2), "adjacent blocks are merged"


@settings(max_examples=200, deadline=None)
@given(lines, lines)
def test_opcodes_rebuild_the_target(a: list[bytes], b: list[bytes]) -> None:
    """Replaying the opcodes on a gives b, as difflib's contract says."""
    out: list[bytes] = []
    for tag, i1, i2, j1, j2 in LineMatcher(None, a, b).get_opcodes():
        out.extend(a[i1:i2] if tag == "equal" else b[j1:j2])
    assert out == b


def test_repeated_lines_stay_fast_and_trim_common_ends() -> None:
    """A huge file of identical lines edited at both ends matches in one pass."""
    base = [b"same\n"] * 50_000
    edited = [b"top\n", *base, b"bottom\n"]
    assert matching_blocks(base, edited) == [(0, 1, 50_000), (50_000, 50_002, 0)]


def test_unique_lines_anchor_the_alignment() -> None:
    """Lines unique on both sides anchor the match even around moved blocks."""
    a = [b"def f():\n", b"  pass\n", b"def g():\n", b"  pass\n"]
    b = [b"def g():\n", b"  pass\n", b"def f():\n", b"  pass\n"]
    blocks = matching_blocks(a, b)
    assert sum(n for _, _, n in blocks) == 2
