"""The summary of a batch run on a terminal: a table with a row per repository, and one line
saying how it went.

Pure functions of the batch object (``batch --json``, ``show --json BATCH``), which ``batch``
prints at its end and ``show BATCH`` prints later, so the two cannot drift apart. Any field may
be null or missing (shown as ``-``); every value that came from a user, a repository or an agent
has its control characters escaped (newlines and tabs too: a row stays one line), and a table
wider than the terminal loses its least useful columns, then has its longest cells cut.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from attrs import define

from ..report._batch import RepoRow, batch_summary, repo_rows
from ..report._format import DASH, count_text, seconds_text
from .output import terminal_text
from .render import _pad, _width, terminal_width

__all__ = ["batch_summary_line", "batch_table", "cell_text"]

#: the least room a cut column keeps (in terminal cells), whatever the width
MIN_CUT = 12
#: the most room a repository's name, outcome or branch takes before the table is cut further
MAX_CELL = {"REPOSITORY": 40, "OUTCOME": 60, "BRANCH": 40}
#: what stands for the cut part of a cell
ELLIPSIS = "\u2026"


def cell_text(text: str) -> str:
    """``text`` as one table cell: control characters escaped as :func:`terminal_text` does,
    and line breaks and tabs too (``\\n``, ``\\r``, ``\\t``), so a row stays one line."""
    flat = text.replace("\r", "\\r").replace("\n", "\\n").replace("\t", "\\t")
    return terminal_text(flat)


def _head(text: str, room: int) -> str:
    """The longest start of ``text`` that fits in ``room`` cells."""
    out = ""
    for char in text:
        if _width(out + char) > room:
            break
        out += char
    return out


def _cut_end(text: str, room: int) -> str:
    """``text`` in at most ``room`` cells, its end replaced by an ellipsis when cut."""
    if _width(text) <= room:
        return text
    return _head(text, room - 1) + ELLIPSIS


def _cut_middle(text: str, room: int) -> str:
    """``text`` in at most ``room`` cells, its middle replaced by an ellipsis when cut: the
    head and the tail of a name (``github.com/org/…/svc-a``) tell names apart best."""
    if _width(text) <= room:
        return text
    tail_room = (room - 1) // 2
    head = _head(text, room - 1 - tail_room)
    tail = _head(text[::-1], tail_room)[::-1]
    return head + ELLIPSIS + tail


@define
class _Column:
    """A column of the table as it is being fitted: its cells escaped, maybe cut."""

    header: str
    #: the lowest is dropped first when the table is too wide
    priority: int
    right: bool
    #: how a cell is cut to a room, None for a column never cut
    cut: Callable[[str, int], str] | None
    cells: list[str]

    @property
    def size(self) -> int:
        return max([_width(self.header), *(_width(c) for c in self.cells)])

    def fit(self, room: int) -> None:
        """Cut every cell to ``room`` cells (never below :data:`MIN_CUT`)."""
        if self.cut is not None:
            cut, room = self.cut, max(MIN_CUT, room)
            self.cells = [cut(c, room) for c in self.cells]


_Cell = Callable[[RepoRow], str]
_Cut = Callable[[str, int], str]
#: (header, priority, right-aligned, how it is cut, the cell of a row)
_COLUMNS: tuple[tuple[str, int, bool, _Cut | None, _Cell], ...] = (
    ("REPOSITORY", 100, False, _cut_middle, lambda r: r.name),
    ("OUTCOME", 90, False, _cut_end, lambda r: r.outcome(None)),
    ("FILES", 50, True, None, lambda r: DASH if r.files is None else str(r.files)),
    ("+/-", 60, True, None, lambda r: r.lines_text()),
    ("VERIFY", 55, False, None, lambda r: r.verify or DASH),
    ("BRANCH", 70, False, _cut_middle, lambda r: r.branch_text()),
    ("TOKENS", 20, True, None, lambda r: count_text(r.tokens)),
    ("TIME", 30, True, None, lambda r: seconds_text(r.seconds)),
)
#: how far the outcome and the name are cut before any column with something in it is dropped
_SHORT = {"OUTCOME": 32, "REPOSITORY": 24}
#: how far a column is cut before it is dropped
_CUT_BEFORE_DROP = {"BRANCH": 20}


def batch_table(batch: Mapping[str, Any], width: int | None = None) -> list[str]:
    """The batch's table: a header, then one row per repository (REPOSITORY, OUTCOME, FILES,
    +/-, VERIFY, BRANCH, TOKENS, TIME), fitted to ``width`` cells (default: the terminal's,
    see :func:`~.render.terminal_width`).

    OUTCOME is ``succeeded`` (``, applied``), ``failed: <error>``, ``skipped: budget``,
    ``interrupted``, ``running`` or ``pending``; BRANCH the branch committed, with ``pushed to
    REMOTE``. A long name, outcome or branch is cut (with an ellipsis) to a sensible length.
    While the table is too wide: columns whose every cell is ``-`` go, then the outcome and the
    name are cut shorter, then the least useful columns go (TOKENS, TIME, FILES, VERIFY, +/-,
    BRANCH, cut shorter first), then the outcome and the name are cut further. No rows: the
    header alone.
    """
    width = width if width is not None and width > 0 else terminal_width()
    rows = repo_rows(batch)
    cols = [
        _Column(header, priority, right, cut, [cell_text(value(r)) for r in rows])
        for header, priority, right, cut, value in _COLUMNS
    ]
    every = list(cols)
    for col in cols:
        if col.header in MAX_CELL:
            col.fit(MAX_CELL[col.header])

    def over() -> int:
        return sum(c.size for c in cols) + 2 * (len(cols) - 1) - width

    def droppable(empty: bool) -> list[_Column]:
        return [
            c
            for c in cols
            if c.header not in ("REPOSITORY", "OUTCOME")
            and (not empty or all(cell == DASH for cell in c.cells))
        ]

    def shrink(shortest: Mapping[str, int]) -> None:
        for col in cols:
            if col.header in shortest and over() > 0:
                col.fit(max(shortest[col.header], col.size - over()))

    while over() > 0 and droppable(True):
        cols.remove(min(droppable(True), key=lambda c: c.priority))
    shrink(_SHORT)
    dropped = []
    while over() > 0 and droppable(False):
        least = min(droppable(False), key=lambda c: c.priority)
        shortest = _CUT_BEFORE_DROP.get(least.header)
        if shortest is not None and least.size > shortest:
            least.fit(max(shortest, least.size - over()))
            continue
        dropped.append(least)
        cols.remove(least)
    # a column dropped before a wider one went may fit again
    order = [c.header for c in every]
    for col in sorted(dropped, key=lambda c: -c.priority):
        cols.append(col)
        cols.sort(key=lambda c: order.index(c.header))
        if over() > 0:
            cols.remove(col)
    shrink(dict.fromkeys(("OUTCOME", "REPOSITORY"), MIN_CUT))
    sizes = [c.size for c in cols]
    last = len(cols) - 1

    def line(cells: list[str]) -> str:
        parts = [
            _pad(cell, size, col.right) if i < last or col.right else cell
            for i, (cell, size, col) in enumerate(zip(cells, sizes, cols, strict=True))
        ]
        return "  ".join(parts).rstrip()

    out = [line([c.header for c in cols])]
    out.extend(line([c.cells[i] for c in cols]) for i in range(len(rows)))
    return out


def batch_summary_line(batch: Mapping[str, Any]) -> str:
    """One line saying how the batch went: ``19 of 20 repositories succeeded; failed: svc-b
    (exit 1), svc-c (clone failed)``; then the repositories skipped, interrupted, still running
    or pending, and the budget spent, if any. Control characters escaped, one line."""
    return cell_text(batch_summary(batch))
