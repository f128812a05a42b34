"""Shell command lines as the permission policy sees them (a pure leaf: standard library only).

:func:`parse_command` splits a line (or an argv, unwrapping ``bash -lc LINE``) into simple
commands, the variables the line sets for them and redirection targets, and flags what it
cannot see through; :func:`prefix_matches`
matches one simple command against an argv prefix of globs; :func:`command_of` finds the command
line in a tool call's raw input. The rules built on these are documented in
:mod:`orchestrator.policy`, which re-exports :class:`CommandLine` and :func:`parse_command`.
"""

from __future__ import annotations

import fnmatch
import io
import posixpath
import re
import shlex
from collections.abc import Sequence
from typing import Any

from attrs import frozen

__all__ = ["CommandLine", "command_of", "parse_command", "prefix_matches"]

_SHELLS = frozenset(("sh", "bash", "zsh", "dash", "ksh", "fish"))
_BIN_DIRS = frozenset(("/bin", "/usr/bin", "/usr/local/bin", "/sbin", "/usr/sbin"))
_OPERATOR_CHARS = frozenset("();<>|&")
_OPAQUE = ("\n", "\r", "`", "$(", "<(", ">(")
# NAME=value, NAME+=value: an assignment when unquoted and before the command word
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\+?=")
# builtins whose arguments set, export or unset variables for the commands after them
_DECLARING = frozenset(("export", "declare", "typeset", "readonly", "local", "unset"))
_WORD_BOUNDARY = frozenset(" \t;&|()<>")


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
    #: names of the variables the line sets for its commands, in first-seen order:
    #: ``NAME=value`` before a command or alone, ``export``/``declare``/``unset`` and the like,
    #: ``env NAME=value``
    variables: tuple[str, ...] = ()


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
    segments = (tuple(argv),) if argv else ()
    return CommandLine(shlex.join(argv), segments, variables=_variables(segments, []))


def _variables(segments: Sequence[tuple[str, ...]], assigned: list[str]) -> tuple[str, ...]:
    """``assigned`` and the names ``export``-like builtins and ``env`` set, without repeats."""
    names = list(assigned)
    for argv in segments:
        program = posixpath.basename(argv[0])
        if program in _DECLARING:
            words = [a for a in argv[1:] if not a.startswith(("-", "+"))]
        elif program == "env":  # env [-i] NAME=value ... command
            words = []
            for arg in argv[1:]:
                if not arg.startswith("-") and _ASSIGNMENT.match(arg) is None:
                    break
                words.append(arg)
        else:
            continue
        for word in words:
            name = word.split("=", 1)[0].rstrip("+")
            if _ASSIGNMENT.fullmatch(name + "="):
                names.append(name)
    return tuple(dict.fromkeys(names))


def _words(text: str) -> list[tuple[str, bool]]:
    """The shell words and operators of ``text``, each with whether it is written as an
    unquoted assignment (``NAME=...``, the name not quoted nor escaped).

    ``"PATH=/x" ls`` runs a program named ``PATH=/x``: only the source text tells it from
    ``PATH=/x ls``, so each word is traced back to its span of ``text``.
    """
    stream = io.StringIO(text)
    lexer = shlex.shlex(stream, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = ""
    words: list[tuple[str, bool]] = []
    end = 0
    while (token := lexer.get_token()) != lexer.eof:
        assert token is not None  # posix mode: eof is None, handled by the loop condition
        # characters read ahead and pushed back belong to the next word (a miscount could only
        # misplace a word's start, and then the boundary check below fails: no assignment)
        stop = stream.tell() - len(getattr(lexer, "_pushback_chars", ()))
        raw = text[end:stop]
        start = end + len(raw) - len(raw.lstrip(" \t"))
        end = stop
        bounded = start == 0 or text[start - 1] in _WORD_BOUNDARY
        words.append((token, bounded and _ASSIGNMENT.match(text, start) is not None))
    return words


def _parse_shell(line: str) -> CommandLine:
    opaque = any(marker in line for marker in _OPAQUE)
    lenient = line
    for marker in _OPAQUE:  # let eager (reject/ask) rules still see what hides behind them
        lenient = lenient.replace(marker, " ; ")
    try:
        tokens = _words(lenient)
    except ValueError:
        opaque = True
        tokens = [(word, _ASSIGNMENT.match(word) is not None) for word in lenient.split()]
    segments: list[tuple[str, ...]] = []
    redirects: list[str] = []
    assigned: list[str] = []
    current: list[str] = []
    redirect: str | None = None
    for token, assignment in tokens:
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
        elif assignment and not current:
            assigned.append(token.split("=", 1)[0].rstrip("+"))
        else:
            current.append(token)
    if current:
        segments.append(tuple(current))
    variables = _variables(segments, assigned)
    return CommandLine(line, tuple(segments), opaque, tuple(redirects), variables)


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
