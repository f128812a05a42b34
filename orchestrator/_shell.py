"""Shell command lines as the permission policy sees them (a pure leaf: standard library only).

:func:`parse_command` splits a line (or an argv, unwrapping ``bash -lc LINE``) into simple
commands and redirection targets, and flags what it cannot see through; :func:`prefix_matches`
matches one simple command against an argv prefix of globs; :func:`command_of` finds the command
line in a tool call's raw input. The rules built on these are documented in
:mod:`orchestrator.policy`, which re-exports :class:`CommandLine` and :func:`parse_command`.
"""

from __future__ import annotations

import fnmatch
import posixpath
import shlex
from collections.abc import Sequence
from typing import Any

from attrs import frozen

__all__ = ["CommandLine", "command_of", "parse_command", "prefix_matches"]

_SHELLS = frozenset(("sh", "bash", "zsh", "dash", "ksh", "fish"))
_BIN_DIRS = frozenset(("/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin"))
_OPERATOR_CHARS = frozenset("();<>|&")
_OPAQUE = ("\n", "\r", "`", "$(", "<(", ">(")


@frozen
class CommandLine:
    """A command line as the policy understands it."""

    #: the command line as text (the inner line of a ``sh -c`` wrapper)
    line: str
    #: the simple commands, as argv tuples, in order
    segments: tuple[tuple[str, ...], ...]
    #: the line hides commands the parser cannot see (newlines, backticks, ``$(``, bad quoting)
    opaque: bool = False
    #: redirection targets that are files
    redirects: tuple[str, ...] = ()


def parse_command(command: str | Sequence[str]) -> CommandLine:
    """Parse a shell line, or an argv (unwrapping ``bash -lc LINE`` and the like)."""
    if isinstance(command, str):
        return _parse_shell(command)
    argv = list(command)
    if argv and posixpath.basename(argv[0]) in _SHELLS:
        index, saw_c = 1, False
        while index < len(argv) and argv[index].startswith("-") and argv[index] != "--":
            saw_c = saw_c or ("c" in argv[index][1:] and not argv[index].startswith("--"))
            index += 1
        if saw_c and index < len(argv):
            return _parse_shell(argv[index])
    return CommandLine(shlex.join(argv), (tuple(argv),) if argv else ())


def _parse_shell(line: str) -> CommandLine:
    opaque = any(marker in line for marker in _OPAQUE)
    lenient = line
    for marker in _OPAQUE:  # let eager (reject/ask) rules still see what hides behind them
        lenient = lenient.replace(marker, " ; ")
    lexer = shlex.shlex(lenient, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    try:
        tokens = list(lexer)
    except ValueError:
        opaque, tokens = True, lenient.split()
    segments: list[tuple[str, ...]] = []
    redirects: list[str] = []
    current: list[str] = []
    redirect: str | None = None
    for token in tokens:
        if redirect is not None:
            if redirect != "<<<" and not token.isdigit() and token != "-":
                redirects.append(token)
            redirect = None
        elif token and set(token) <= _OPERATOR_CHARS:
            if "<" in token or ">" in token:
                redirect = token
                opaque = opaque or (token.startswith("<<") and token != "<<<")
                continue
            if current:
                segments.append(tuple(current))
            current = []
        else:
            current.append(token)
    if current:
        segments.append(tuple(current))
    return CommandLine(line, tuple(segments), opaque, tuple(redirects))


def prefix_matches(prefix: tuple[str, ...], argv: tuple[str, ...]) -> bool:
    """Whether ``argv`` starts with ``prefix`` (globs; ``/usr/bin/git`` counts as ``git``)."""
    if len(argv) < len(prefix):
        return False
    for index, (pattern, arg) in enumerate(zip(prefix, argv, strict=False)):
        if index == 0 and "/" not in pattern and posixpath.dirname(arg) in _BIN_DIRS:
            arg = posixpath.basename(arg)
        if not fnmatch.fnmatchcase(arg, pattern):
            return False
    return True


def command_of(kind: str, raw: Any, title: str | None) -> str | list[str] | None:
    """The command line a tool call carries in its raw input (or its title, for execute)."""
    keys: tuple[str, ...] = ("command", "cmd", "commandLine", "command_line")
    if kind == "execute":
        keys += ("argv", "args", "script")
    if isinstance(raw, dict):
        for key in keys:
            value = raw.get(key)
            if isinstance(value, str) and value.strip():
                args = raw.get("args")
                if key == "command" and isinstance(args, list) and args:
                    return [value, *(str(arg) for arg in args)]
                return value
            if isinstance(value, list) and value and all(isinstance(v, str) for v in value):
                return list(value)
    if kind == "execute":
        if isinstance(raw, str) and raw.strip():
            return raw
        if title:
            return title
    return None
