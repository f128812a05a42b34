"""The instruction language of the demo agent (pure: parsing and text edits, no I/O).

One instruction per line of the prompt. Quotes are ``"`` or ``'``; in quoted TEXT ``\\n`` is a
newline and ``\\"``, ``\\'`` and ``\\\\`` are the characters themselves::

    replace "OLD" with "NEW" in GLOB      literal replacement in every file matching GLOB
    rename OLD to NEW in GLOB             whole-word rename of an identifier
    append "TEXT" to PATH                 add a line at the end of an existing file
    create PATH with "TEXT"               a new file
    delete PATH                           remove a file
    run COMMAND                           run a shell command (through the client's terminal)

GLOB and PATH are relative to the session's directory (no ``..``); GLOB may use ``**``
(``**`` alone, or at the end, matches every file below). A line that starts with one of these
words but does not have its form is :class:`NotUnderstood`, with the reason; other lines are
ignored.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from attrs import frozen

__all__ = [
    "FORMS",
    "Instruction",
    "NotUnderstood",
    "apply_edit",
    "parse_instructions",
    "parse_line",
    "parse_prompt",
]

#: the form of each instruction, by its first word
FORMS = {
    "replace": 'replace "OLD" with "NEW" in GLOB',
    "rename": "rename OLD to NEW in GLOB",
    "append": 'append "TEXT" to PATH',
    "create": 'create PATH with "TEXT"',
    "delete": "delete PATH",
    "run": "run COMMAND",
}
# the slots of each form after its first word, as (kind, name): kind is "keyword", "text" (in
# quotes) or "word" (GLOB, PATH or an identifier)
_SLOTS: dict[str, tuple[tuple[str, str], ...]] = {
    op: tuple(
        ("keyword", w) if w.islower() else ("text", w.strip('"')) if w[0] == '"' else ("word", w)
        for w in form.split()[1:]
    )
    for op, form in FORMS.items()
    if op != "run"
}
_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
_ESCAPE = re.compile(r"\\(.)", re.S)
_FIRST_WORD = re.compile(r"(\S+)\s*(.*)", re.S)


@frozen
class Instruction:
    """One parsed instruction."""

    #: replace, rename, append, create, delete or run
    op: str
    #: the file glob (replace, rename) or path (append, create, delete); empty for run
    target: str = ""
    #: the text searched for (replace, rename)
    old: str = ""
    #: the new text (replace, rename, append, create) or the command line (run)
    new: str = ""

    def describe(self) -> str:
        """A one-line description, used as plan entries and tool call titles."""
        if self.op == "replace":
            return f"Replace {self.old!r} with {self.new!r} in {self.target}"
        if self.op == "rename":
            return f"Rename {self.old} to {self.new} in {self.target}"
        if self.op == "append":
            return f"Append a line to {self.target}"
        if self.op == "create":
            return f"Create {self.target}"
        if self.op == "delete":
            return f"Delete {self.target}"
        return f"Run {self.new}"


@frozen
class NotUnderstood:
    """A line that starts with an instruction's word but does not have its form."""

    #: the line, without surrounding blanks
    line: str
    #: why it was not understood, with the form expected
    reason: str

    def describe(self) -> str:
        """The answer to the line: ``not understood: LINE (REASON)``."""
        return f"not understood: {self.line} ({self.reason})"


class _Refused(Exception):
    """A line's reason for not being understood (internal to the parser)."""


def _unescape(match: re.Match[str]) -> str:
    char = match.group(1)
    if char == "n":
        return "\n"
    return char if char in "\"'\\" else match.group(0)


def _tokens(text: str) -> list[tuple[bool, str]]:
    """The words of ``text`` as (quoted, value): quoted text unescaped, bare words as written."""
    found: list[tuple[bool, str]] = []
    i, end = 0, len(text)
    while i < end:
        if text[i].isspace():
            i += 1
        elif text[i] in "\"'":
            quote, j = text[i], i + 1
            while j < end and text[j] != quote:
                j += 2 if text[j] == "\\" else 1
            if j >= end:
                raise _Refused(f"a {quote} quote is not closed")
            found.append((True, _ESCAPE.sub(_unescape, text[i + 1 : j])))
            i = j + 1
        else:
            j = i
            while j < end and not text[j].isspace():
                j += 1
            found.append((False, text[i:j]))
            i = j
    return found


def _check_place(slot: str, value: str) -> None:
    """Refuse a GLOB or PATH that is absolute or climbs out of the session's directory."""
    parts = PurePosixPath(value).parts
    if value.startswith(("/", "\\")) or ".." in parts:
        raise _Refused(f"{slot} must be inside the session's directory, without '..'")


def _shown(word: tuple[bool, str]) -> str:
    quoted, value = word
    return f'"{value}"' if quoted else repr(value)


def _fill(op: str, words: list[tuple[bool, str]]) -> dict[str, str]:
    """The placeholders of ``op``'s form filled from ``words``, or the reason they do not fit."""
    values: dict[str, str] = {}
    slots = _SLOTS[op]
    for n, (kind, name) in enumerate(slots):
        before = slots[n - 1] if n else ("keyword", op)
        after = f"after {before[1]!r}" if before[0] == "keyword" else f"after {before[1]}"
        if n >= len(words):
            raise _Refused(f"{repr(name) if kind == 'keyword' else name} is missing {after}")
        quoted, value = words[n]
        if not quoted and ("'" in value or '"' in value) and kind != "word":
            # a quote inside a bare word where a keyword or text belongs: the quotes do not
            # pair up (a quote missing, or one too many inside a text)
            raise _Refused(f"the quotes do not pair up: found {value!r} {after}")
        if kind == "keyword":
            if quoted or value.lower() != name:
                raise _Refused(f"expected {name!r} {after}, found {_shown(words[n])}")
        elif kind == "text":
            if not quoted:
                raise _Refused(f"{name} must be in quotes, found {_shown(words[n])}")
            values[name] = value
        else:
            if quoted:
                raise _Refused(f"{name} is written without quotes, found {_shown(words[n])}")
            values[name] = value
    if len(words) > len(slots):
        raise _Refused(f"unexpected {_shown(words[len(slots)])} after {slots[-1][1]}")
    return values


def _instruction(op: str, rest: str) -> Instruction:
    if op == "run":
        if not rest.strip():
            raise _Refused("COMMAND is missing")
        return Instruction(op, "", "", rest.strip())
    v = _fill(op, _tokens(rest))
    for slot in ("GLOB", "PATH"):
        if slot in v:
            _check_place(slot, v[slot])
    if op == "replace":
        if not v["OLD"]:
            raise _Refused("the text to replace is empty")
        return Instruction(op, v["GLOB"], v["OLD"], v["NEW"])
    if op == "rename":
        for name in (v["OLD"], v["NEW"]):
            if not _IDENTIFIER.fullmatch(name):
                raise _Refused(f"{name!r} is not an identifier")
        return Instruction(op, v["GLOB"], v["OLD"], v["NEW"])
    if op in ("append", "create"):
        return Instruction(op, v["PATH"], "", v["TEXT"])
    return Instruction(op, v["PATH"])


def parse_line(line: str) -> Instruction | NotUnderstood | None:
    """One line of a prompt: an instruction, a line not understood, or None (not one)."""
    stripped = line.strip()
    m = _FIRST_WORD.match(stripped)
    if m is None or m.group(1).lower() not in FORMS:
        return None
    op = m.group(1).lower()
    try:
        return _instruction(op, m.group(2))
    except _Refused as refused:
        return NotUnderstood(stripped, f"{refused}; the form is: {FORMS[op]}")


def parse_prompt(text: str) -> list[Instruction | NotUnderstood]:
    """The instructions of a prompt and the lines that look like one but are not, in order."""
    found = []
    for line in text.splitlines():
        parsed = parse_line(line)
        if parsed is not None:
            found.append(parsed)
    return found


def parse_instructions(text: str) -> list[Instruction]:
    """The instructions found in a prompt, in order (lines not understood left out)."""
    return [p for p in parse_prompt(text) if isinstance(p, Instruction)]


def apply_edit(instruction: Instruction, content: str) -> str:
    """The file content after a replace, rename or append instruction."""
    if instruction.op == "replace":
        return content.replace(instruction.old, instruction.new)
    if instruction.op == "rename":
        return re.sub(rf"\b{re.escape(instruction.old)}\b", instruction.new, content)
    if instruction.op == "append":
        sep = "" if not content or content.endswith("\n") else "\n"
        # TEXT is one line: its own final newline ends it, no blank line is added
        end = "" if instruction.new.endswith("\n") else "\n"
        return f"{content}{sep}{instruction.new}{end}"
    raise ValueError(f"{instruction.op} is not an edit")
