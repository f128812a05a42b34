"""Line matching for merges and diffs: common prefix/suffix trimming plus patience anchors.

difflib's matcher is quadratic on files with many repeated lines (without its "popular line"
heuristic, which in turn misaligns such files). :class:`LineMatcher` first trims the common
prefix and suffix (most edits touch a small region), then anchors on lines that occur exactly
once on both sides (patience diff, which also aligns code more naturally) and only hands the
gaps that remain to Myers' algorithm (fast when the gap differs little) or, past a work budget,
to difflib.
"""

from __future__ import annotations

import bisect
import difflib
from collections import Counter
from collections.abc import Sequence
from typing import Any

__all__ = ["LineMatcher", "matching_blocks"]

# Above this many line pairs, a gap without unique anchors uses difflib's popularity heuristic
# rather than risk quadratic time.
_EXACT_LIMIT = 4_000_000
# Work allowed to Myers' algorithm on such a gap, as (N + M) * D.
_MYERS_BUDGET = 20_000_000


def _unique_anchors(
    a: Sequence[bytes], b: Sequence[bytes], alo: int, ahi: int, blo: int, bhi: int
) -> list[tuple[int, int]]:
    """The longest increasing run of lines unique in both ranges (patience sorting)."""
    count_a = Counter(a[alo:ahi])
    count_b = Counter(b[blo:bhi])
    where_b = {b[j]: j for j in range(blo, bhi) if count_b[b[j]] == 1}
    pairs = [(i, where_b[a[i]]) for i in range(alo, ahi) if count_a[a[i]] == 1 and a[i] in where_b]
    if not pairs:
        return []
    tops: list[int] = []  # smallest j ending an increasing run of each length
    top_index: list[int] = []
    back: list[int] = [-1] * len(pairs)
    for k, (_i, j) in enumerate(pairs):
        pile = bisect.bisect_left(tops, j)
        if pile == len(tops):
            tops.append(j)
            top_index.append(k)
        else:
            tops[pile] = j
            top_index[pile] = k
        back[k] = top_index[pile - 1] if pile else -1
    run: list[tuple[int, int]] = []
    k = top_index[-1]
    while k != -1:
        run.append(pairs[k])
        k = back[k]
    run.reverse()
    return run


def _myers(
    a: Sequence[bytes], b: Sequence[bytes], alo: int, ahi: int, blo: int, bhi: int
) -> list[tuple[int, int, int]] | None:
    """Myers' greedy O((N+M)D) matching of two ranges; None when D exceeds the work budget."""
    n, m = ahi - alo, bhi - blo
    max_d = min(n + m, max(64, _MYERS_BUDGET // (n + m)))
    offset = max_d + 1
    v = [0] * (2 * max_d + 3)
    trace: list[list[int]] = []
    for d in range(max_d + 1):
        trace.append(v[offset - d - 1 : offset + d + 2])
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]
            else:
                x = v[offset + k - 1] + 1
            y = x - k
            while x < n and y < m and a[alo + x] == b[blo + y]:
                x += 1
                y += 1
            v[offset + k] = x
            if x >= n and y >= m:
                return _backtrack(trace, n, m, alo, blo)
    return None


def _backtrack(
    trace: list[list[int]], x: int, y: int, alo: int, blo: int
) -> list[tuple[int, int, int]]:
    snakes: list[tuple[int, int, int]] = []
    for d in range(len(trace) - 1, -1, -1):
        v = trace[d]  # v[k + d + 1] is the furthest x on diagonal k before round d
        k = x - y
        down = k == -d or (k != d and v[k - 1 + d + 1] < v[k + 1 + d + 1])
        prev_k = k + 1 if down else k - 1
        prev_x = v[prev_k + d + 1] if d else 0
        prev_y = prev_x - prev_k if d else 0
        run = min(x - prev_x, y - prev_y) if d else min(x, y)
        if run > 0:
            snakes.append((alo + x - run, blo + y - run, run))
        x, y = prev_x, prev_y
    return snakes


def matching_blocks(a: Sequence[bytes], b: Sequence[bytes]) -> list[tuple[int, int, int]]:
    """Matching blocks ``(i, j, n)`` of two line lists, increasing, ending with a sentinel."""
    found: list[tuple[int, int, int]] = []
    stack = [(0, len(a), 0, len(b))]
    while stack:
        alo, ahi, blo, bhi = stack.pop()
        start = 0
        while alo + start < ahi and blo + start < bhi and a[alo + start] == b[blo + start]:
            start += 1
        if start:
            found.append((alo, blo, start))
            alo, blo = alo + start, blo + start
        end = 0
        while ahi - end > alo and bhi - end > blo and a[ahi - end - 1] == b[bhi - end - 1]:
            end += 1
        if end:
            found.append((ahi - end, bhi - end, end))
            ahi, bhi = ahi - end, bhi - end
        if alo == ahi or blo == bhi:
            continue
        anchors = _unique_anchors(a, b, alo, ahi, blo, bhi)
        if anchors:
            prev_i, prev_j = alo, blo
            for i, j in anchors:
                found.append((i, j, 1))
                stack.append((prev_i, i, prev_j, j))
                prev_i, prev_j = i + 1, j + 1
            stack.append((prev_i, ahi, prev_j, bhi))
            continue
        snakes = _myers(a, b, alo, ahi, blo, bhi)
        if snakes is not None:
            found.extend(snakes)
            continue
        exact = (ahi - alo) * (bhi - blo) <= _EXACT_LIMIT
        sub = difflib.SequenceMatcher(None, a[alo:ahi], b[blo:bhi], autojunk=not exact)
        found.extend((alo + i, blo + j, n) for i, j, n in sub.get_matching_blocks() if n)
    found.sort()
    merged: list[tuple[int, int, int]] = []
    for i, j, n in found:
        if merged and merged[-1][0] + merged[-1][2] == i and merged[-1][1] + merged[-1][2] == j:
            last = merged[-1]
            merged[-1] = (last[0], last[1], last[2] + n)
        else:
            merged.append((i, j, n))
    merged.append((len(a), len(b), 0))
    return merged


class LineMatcher(difflib.SequenceMatcher[bytes]):
    """A drop-in ``SequenceMatcher`` for lists of lines using :func:`matching_blocks`."""

    def __init__(
        self,
        isjunk: Any = None,
        a: Sequence[bytes] = (),
        b: Sequence[bytes] = (),
        autojunk: bool = False,
    ):
        # No super().__init__: difflib's index of b is not needed and costs time.
        self.isjunk = None
        self.a = a
        self.b = b
        self.opcodes = None
        self._blocks: list[difflib.Match] | None = None

    def get_matching_blocks(self) -> list[difflib.Match]:
        """The matching blocks (computed once)."""
        if self._blocks is None:
            self._blocks = [difflib.Match(*m) for m in matching_blocks(self.a, self.b)]
        return self._blocks
