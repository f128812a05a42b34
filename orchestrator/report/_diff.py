"""Reading unified diffs (git style or plain) into files, lines and counts.

A report shows what agents changed, so the diff text they produced is split per file with line
numbers, and added/removed lines are counted. Counting follows the hunk headers, so a removed
line whose text starts with ``--`` (shown as ``---...``) is still a removal, not a file header;
a hunk whose header cannot be read falls back to the plain rule (``+``/``-`` but not
``+++``/``---``).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from attrs import define, field, frozen

from .._names import display_name, git_unquote

__all__ = ["DiffLine", "FileDiff", "LineKind", "count_lines", "parse_diff"]

LineKind = Literal["meta", "hunk", "add", "del", "ctx", "note"]
ChangeKind = Literal["added", "deleted", "modified", "renamed"]

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@frozen
class DiffLine:
    """One line of a file's diff, with its line numbers on the old and new side."""

    kind: LineKind
    #: the line without its end of line (for add/del/ctx: without the leading sign)
    text: str
    old_no: int | None = None
    new_no: int | None = None
    #: which hunk (0-based) a code line belongs to; None for meta lines
    hunk: int | None = None


@frozen
class FileDiff:
    """The part of a diff about one file."""

    #: the path shown for the file (the new path, or the old one for a deletion)
    path: str
    old_path: str | None
    new_path: str | None
    change: ChangeKind
    binary: bool
    added: int
    removed: int
    lines: tuple[DiffLine, ...]
    #: this file's part of the diff, verbatim
    text: str


@define
class _Builder:
    header: str | None = None
    old_path: str | None = None
    new_path: str | None = None
    saw_old: bool = False
    saw_new: bool = False
    new_file: bool = False
    deleted_file: bool = False
    rename: bool = False
    binary: bool = False
    added: int = 0
    removed: int = 0
    hunks: int = 0
    lines: list[DiffLine] = field(factory=list)
    raw: list[str] = field(factory=list)

    def meta(self, text: str) -> None:
        self.lines.append(DiffLine("meta", text))

    def build(self) -> FileDiff:
        old, new = self.old_path, self.new_path
        if (old is None or new is None) and self.header is not None:
            from_header = _paths_from_git_header(self.header)
            if from_header is not None:
                # a /dev/null side (seen as ---/+++) stays None; an unseen side comes from
                # the header (mode-only, binary and rename-only diffs have no ---/+++)
                old = old if self.saw_old else from_header[0]
                new = new if self.saw_new else from_header[1]
        if self.new_file or (self.saw_old and old is None):
            change: ChangeKind = "added"
        elif self.deleted_file or (self.saw_new and new is None):
            change = "deleted"
        elif self.rename or (self.header is not None and old is not None and old != new):
            # only git names renames; a plain diff often compares "x.orig" with "x"
            change = "renamed"
        else:
            change = "modified"
        path = (old if change == "deleted" else new) or old or new or "(unnamed)"
        return FileDiff(
            path=path,
            old_path=old,
            new_path=new,
            change=change,
            binary=self.binary,
            added=self.added,
            removed=self.removed,
            lines=tuple(self.lines),
            text="\n".join(self.raw) + "\n" if self.raw else "",
        )


def _unquote(path: str) -> str:
    """A path as git prints it (C-quoted with octal escapes when it has unusual bytes) in the
    display form that ``--json`` objects give it (see :mod:`orchestrator._names`)."""
    if len(path) >= 2 and path[0] == '"' and path[-1] == '"':
        return display_name(git_unquote(path))
    return path


def _side_path(rest: str) -> str | None:
    """The path of a ``---``/``+++`` line (without the marker); None for /dev/null."""
    if "\t" in rest:  # plain diff: "name<TAB>timestamp"
        rest = rest.split("\t", 1)[0]
    rest = _unquote(rest.rstrip("\r"))
    if rest == "/dev/null":
        return None
    if rest.startswith(("a/", "b/")):
        return rest[2:]
    return rest


def _paths_from_git_header(line: str) -> tuple[str, str] | None:
    """(old, new) from ``diff --git a/X b/Y``; None when it cannot be split unambiguously."""
    if not line.startswith("diff --git "):
        return None
    rest = line[len("diff --git ") :].rstrip("\r")
    if rest.startswith('"'):
        end = rest.find('" ', 1)
        if end > 0:
            old, new = _unquote(rest[: end + 1]), _unquote(rest[end + 2 :])
            return _strip_prefix(old), _strip_prefix(new)
        return None
    # unquoted: usually the same path twice, so split in the middle when both halves agree
    n = len(rest)
    if n % 2 == 1:
        left, right = rest[: n // 2], rest[n // 2 + 1 :]
        if left[2:] == right[2:] and left.startswith("a/") and right.startswith("b/"):
            return left[2:], right[2:]
    marker = rest.find(" b/")
    if rest.startswith("a/") and marker > 0:
        return rest[2:marker], rest[marker + 3 :]
    return None


def _strip_prefix(path: str) -> str:
    return path[2:] if path.startswith(("a/", "b/")) else path


def parse_diff(text: str | None) -> tuple[FileDiff, ...]:
    """Split a unified diff (one or many files) into :class:`FileDiff` values, in order.

    Tolerant: text before the first file header becomes a file of its own (``(unnamed)``), and
    junk never raises.
    """
    if not text:
        return ()
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    files: list[FileDiff] = []
    cur: _Builder | None = None
    old_left = new_left = 0
    loose = False  # in a hunk whose header we could not read: count by the plain rule
    old_no = new_no = 0

    for i, raw in enumerate(lines):
        line = raw[:-1] if raw.endswith("\r") else raw
        if cur is not None and (old_left > 0 or new_left > 0):
            sign = line[:1]
            hunk = cur.hunks - 1
            if sign == "+" and new_left > 0:
                cur.lines.append(DiffLine("add", line[1:], None, new_no, hunk))
                cur.added += 1
                new_no += 1
                new_left -= 1
            elif sign == "-" and old_left > 0:
                cur.lines.append(DiffLine("del", line[1:], old_no, None, hunk))
                cur.removed += 1
                old_no += 1
                old_left -= 1
            elif sign in (" ", "") and old_left > 0 and new_left > 0:
                # some tools strip the space of an empty context line
                cur.lines.append(DiffLine("ctx", line[1:], old_no, new_no, hunk))
                old_no += 1
                new_no += 1
                old_left -= 1
                new_left -= 1
            elif sign == "\\":
                cur.lines.append(DiffLine("note", line))
            else:
                # the hunk ended early (a truncated diff): read the line as a header
                old_left = new_left = 0
                sign = "?"
            if sign != "?":
                cur.raw.append(raw)
                continue
        if (
            cur is not None
            and loose
            and line[:1] in ("+", "-", " ")
            and not _is_file_start(line, lines, i)
        ):
            hunk = cur.hunks - 1
            if line.startswith("+") and not line.startswith("+++"):
                cur.lines.append(DiffLine("add", line[1:], hunk=hunk))
                cur.added += 1
            elif line.startswith("-") and not line.startswith("---"):
                cur.lines.append(DiffLine("del", line[1:], hunk=hunk))
                cur.removed += 1
            else:
                cur.lines.append(DiffLine("ctx", line[1:], hunk=hunk))
            cur.raw.append(raw)
            continue
        if line.startswith("@@") and cur is not None:
            m = _HUNK.match(line)
            cur.hunks += 1
            cur.lines.append(DiffLine("hunk", line))
            cur.raw.append(raw)
            loose = m is None
            if m is not None:
                old_no, new_no = int(m.group(1)), int(m.group(3))
                old_left = int(m.group(2)) if m.group(2) is not None else 1
                new_left = int(m.group(4)) if m.group(4) is not None else 1
            continue
        if cur is None or _is_file_start(line, lines, i):
            if cur is not None:
                files.append(cur.build())
            cur = _Builder(header=line if line.startswith("diff ") else None)
            old_left = new_left = 0
            loose = False
        cur.raw.append(raw)
        _header_line(line, cur)
    if cur is not None:
        files.append(cur.build())
    return tuple(files)


def _is_file_start(line: str, lines: list[str], i: int) -> bool:
    if line.startswith("diff "):
        return True
    # a plain unified diff has no "diff" line: "---" then "+++" opens a file, unless the
    # "---" belongs to a git header already opened by "diff --git"
    if line.startswith("--- ") and i + 1 < len(lines) and lines[i + 1].startswith("+++ "):
        prev = lines[i - 1] if i > 0 else ""
        return not _is_git_meta(prev)
    return False


_GIT_META = (
    "diff ",
    "index ",
    "old mode ",
    "new mode ",
    "new file mode ",
    "deleted file mode ",
    "similarity index ",
    "dissimilarity index ",
    "rename from ",
    "rename to ",
    "copy from ",
    "copy to ",
)


def _is_git_meta(line: str) -> bool:
    return line.startswith(_GIT_META)


def _header_line(line: str, cur: _Builder) -> None:
    """Record one line outside hunks (file headers, git metadata, notes) into ``cur``."""
    if line.startswith("--- "):
        cur.old_path = _side_path(line[4:])
        cur.saw_old = True
    elif line.startswith("+++ "):
        cur.new_path = _side_path(line[4:])
        cur.saw_new = True
    elif line.startswith("diff "):
        pass
    elif line.startswith("new file mode"):
        cur.new_file = True
        cur.meta(line)
    elif line.startswith("deleted file mode"):
        cur.deleted_file = True
        cur.meta(line)
    elif line.startswith(("rename from ", "rename to ")):
        cur.rename = True
        cur.meta(line)
    elif line.startswith("Binary files ") or line.startswith("GIT binary patch"):
        cur.binary = True
        cur.meta(line)
    elif line.startswith("index "):
        pass  # blob hashes: noise in a report
    elif line.startswith("\\"):
        cur.lines.append(DiffLine("note", line))
    elif line.strip():
        cur.meta(line)


def count_lines(files: Iterable[FileDiff]) -> tuple[int, int]:
    """(added, removed) over ``files``."""
    added = removed = 0
    for f in files:
        added += f.added
        removed += f.removed
    return added, removed
