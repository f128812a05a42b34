"""The instruction language of the demo agent (pure: parsing and text edits, no I/O).

One instruction per line of the prompt; other lines are ignored. Quotes are ``"`` or ``'``::

    replace "OLD" with "NEW" in GLOB      literal replacement in every file matching GLOB
    rename OLD to NEW in GLOB             whole-word rename of an identifier
    append "TEXT" to PATH                 add a line at the end of a file
    create PATH with "TEXT"               a new file (``\\n`` in TEXT is a newline)
    delete PATH                           remove a file
    run COMMAND                           run a shell command (through the client's terminal)

GLOB is relative to the session's directory and may use ``**``.
"""

from __future__ import annotations

import re

from attrs import frozen

__all__ = ["Instruction", "apply_edit", "parse_instructions"]

_Q = r"""(?:"((?:[^"\\]|\\.)*)"|'((?:[^'\\]|\\.)*)')"""
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    ("replace", re.compile(rf"^\s*replace\s+{_Q}\s+with\s+{_Q}\s+in\s+(\S+)\s*$", re.I)),
    (
        "rename",
        re.compile(r"^\s*rename\s+([A-Za-z_]\w*)\s+to\s+([A-Za-z_]\w*)\s+in\s+(\S+)\s*$", re.I),
    ),
    ("append", re.compile(rf"^\s*append\s+{_Q}\s+to\s+(\S+)\s*$", re.I)),
    ("create", re.compile(rf"^\s*create\s+(\S+)\s+with\s+{_Q}\s*$", re.I)),
    ("delete", re.compile(r"^\s*delete\s+(\S+)\s*$", re.I)),
    ("run", re.compile(r"^\s*run\s+(.+?)\s*$", re.I)),
]


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


def _unquote(double: str | None, single: str | None) -> str:
    text = double if double is not None else (single or "")
    return text.replace("\\n", "\n").replace('\\"', '"').replace("\\'", "'").replace("\\\\", "\\")


def parse_instructions(text: str) -> list[Instruction]:
    """The instructions found in a prompt, in order."""
    found = []
    for line in text.splitlines():
        for op, pattern in _PATTERNS:
            m = pattern.match(line)
            if m is None:
                continue
            g = m.groups()
            if op == "replace":
                found.append(Instruction(op, g[4], _unquote(g[0], g[1]), _unquote(g[2], g[3])))
            elif op == "rename":
                found.append(Instruction(op, g[2], g[0], g[1]))
            elif op == "append":
                found.append(Instruction(op, g[2], "", _unquote(g[0], g[1])))
            elif op == "create":
                found.append(Instruction(op, g[0], "", _unquote(g[1], g[2])))
            elif op == "delete":
                found.append(Instruction(op, g[0]))
            else:
                found.append(Instruction(op, "", "", g[0]))
            break
    return found


def apply_edit(instruction: Instruction, content: str) -> str:
    """The file content after a replace, rename or append instruction."""
    if instruction.op == "replace":
        return content.replace(instruction.old, instruction.new)
    if instruction.op == "rename":
        return re.sub(rf"\b{re.escape(instruction.old)}\b", instruction.new, content)
    if instruction.op == "append":
        sep = "" if not content or content.endswith("\n") else "\n"
        return f"{content}{sep}{instruction.new}\n"
    raise ValueError(f"{instruction.op} is not an edit")
