"""Permission policy: ordered rules over a tool call decide allow, reject or ask.

Pure and synchronous (a leaf: no trio, no protocol types). The permission adapter
(:mod:`orchestrator.agent.permissions`) turns an ACP request into a :class:`PermissionQuery`,
asks :meth:`PolicySet.evaluate` for a verdict and maps it to one of the agent's options with
:func:`choose_option`.

Evaluation
    1. Every path the request touches (``locations``, diff paths, raw-input keys such as ``path``,
       ``file_path``, ``filePath``, ``paths``, ``abs_path``, ``cwd``, Codex ``changes``, shell
       redirection targets, and a command's arguments that are absolute paths, start with ``~``
       or climb with ``..``, alone or as an option's value: ``--output=/x``, ``-o/x``) is
       resolved against the session root. Any path outside it rejects the request, whatever the
       rules say (rule ``outside-workspace``). A command's program (its first word) and
       :data:`HARMLESS_PATHS` (``/dev/null``, ``/dev/stdin``, ``/dev/stdout``, ``/dev/stderr``,
       ``/dev/tty``) are not counted. Resolution is lexical here; the caller may pass
       ``realpath`` to :meth:`PolicySet.evaluate` to follow symlinks (the permission service
       does: ``link/x`` with ``link -> /tmp`` is ``/tmp/x``, and any other word of a command
       counts as a path when a symlink takes it outside). Words are taken as the shell
       expands them: quoted text is literal; braces are expanded and each alternative checked;
       a glob is outside when its literal directory, a part that can match ``..``, or (with
       the caller's ``glob``, which the permission service passes) anything it matches at any
       level leads outside; a variable, a substitution or an extglob has a value known only
       when it runs and is outside, as is ``cd`` with no directory or ``-``.
    2. Scopes are searched narrowest first: the step's policies, then the agent's, then the run's.
       The first rule that matches decides (rule name ``<scope>/<rule>``).
    3. No rule matches: reject. The rule is named after the widest policy that was searched
       and given (``run/ci.toml: default``, ``step:review/rules.toml: default``); ``default``
       alone only when no policy applies at all (none given to the run, nor to the step or
       the agent).

A rule matches when every condition it sets holds (unset conditions match anything):

- ``kinds``: the tool kind (a request without one counts as ``other``);
- ``title`` (glob, case-insensitive) or ``title_regex`` (searched);
- ``paths``: globs relative to the session root (absolute globs match absolute paths). ``**``
  spans directories, ``*`` and ``?`` stay within one; a glob without ``/`` matches at any depth
  (``.env``, ``*.pem``). A request without paths never matches a rule with ``paths``;
- ``command`` (argv prefixes; tokens may be globs) or ``command_regex`` (full match), tried on
  each simple command of the line: the line is split at ``;``, ``&&``, ``||``, ``|``, ``&`` and
  parentheses, redirections are removed, and ``bash -lc "..."`` wrappers are unwrapped (a
  reject or ask rule with only a regex also tries the whole line);
- ``agents``, ``steps``: globs on the agent name and the pipeline step;
- ``env``: globs (case-insensitive) on the names of the variables a command sets: in the
  request's ``env`` (``terminal/create``, or an ``env`` in the raw input), as ``NAME=value``
  before a command or alone, with ``export`` and the like, or with ``env NAME=value``. On an
  allow rule they are permissions, not a condition (see below); a reject or ask rule with
  ``env`` matches a command that sets one of them.

Allow verdicts are strict, reject and ask are eager: an allow rule needs *every* path and *every*
simple command to match and never matches a line it cannot see through (newlines, backticks,
``$(...)``, unbalanced quotes); a reject or ask rule needs only one.

Command environment: a command may set only the variables the deciding rule allows. When the
first rule that matches says allow or ask, every variable the command sets must match the
rule's ``env``, except the few that change only how output looks (:data:`FREE_ENV`: ``LANG``,
the ``LC_*`` locale categories, ``TZ``, ``TERM``, ``COLUMNS``, ``LINES``, ``NO_COLOR``,
``FORCE_COLOR``, ``CLICOLOR``, ``CLICOLOR_FORCE``, ``CI``, ``PYTHONUNBUFFERED``; exact names);
otherwise the request is rejected with rule ``command-environment: NAMES not allowed by
<scope>/<rule>``. ``CFLAGS=-O2 make`` needs a rule with ``env = ["CFLAGS"]``: a variable names
programs (``CC``), options (``MAKEFLAGS``, ``PYTEST_ADDOPTS``, ``TAR_OPTIONS``) or files to
load too often to be vetted one by one. The ``trusted`` preset's execute rule allows any
(``env = ["*"]``).

Verdicts: ``allow``, ``allow_always``, ``reject``, ``reject_always``, ``ask`` (escalate to a
callback; no answer in ``ask_timeout`` seconds rejects). Option choice (:func:`choose_option`):
``allow_always`` takes the agent's allow_always option, else allow_once; ``allow`` takes
allow_once only (an allow_always answer would stop the agent from asking again); ``reject``
takes reject_once, else reject_always; ``reject_always`` the reverse. An allow verdict without
any allow option offered becomes a reject; a reject with no reject option is answered with the
``cancelled`` outcome. An allow option is never chosen for a reject.

Presets: ``read-only`` (allow read, search, think, fetch; reject the rest), ``edit`` (also edit,
delete and move with every path inside the workspace), ``trusted`` (also execute, with any
environment), ``deny-all``.
A preset ends with a catch-all reject, so a scope with a preset never falls through to a wider
scope; rules added to a preset (:meth:`Policy.extend`) come before it.

The TOML format (examples in ``examples/policies/``)::

    preset = "edit"              # run-wide preset, optional
    name = "ci"                  # what decisions call this policy (default: the file's name)
    ask_timeout = 60             # seconds an `ask` waits for an answer

    [[rules]]                    # run-wide rules, tried before the preset's
    name = "tests"
    verdict = "allow"
    kinds = ["execute"]
    commands = ["pytest", ["npm", "test"]]   # several prefixes; `command = "git status"` for one
    env = ["NODE_OPTIONS"]       # variables that change what runs, allowed to these commands

    [[rules]]
    name = "secrets"
    verdict = "reject"
    paths = [".env", "secrets/**"]

    [agents.codex]               # only for agent "codex" (the key is a glob)
    preset = "read-only"

    [steps.review]               # only for pipeline step "review"
    preset = "read-only"
    [[steps.review.rules]]
    verdict = "ask"
    kinds = ["fetch"]

    [[elicitation]]              # elicitation/create answers (default: decline)
    message = "*branch name*"
    action = "accept"
    values = { branch = "main" }
"""

from __future__ import annotations

import fnmatch
import itertools
import math
import os
import posixpath
import re
import shlex
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import attrs
from attrs import field, frozen

from orchestrator._env import FREE_ENV, is_free
from orchestrator._paths import compile_glob, raw_paths, resolve
from orchestrator._shell import CommandLine, command_of, parse_command, prefix_matches
from orchestrator.errors import UsageError

__all__ = [
    "COMMAND_ENVIRONMENT",
    "DEFAULT_RULE",
    "FREE_ENV",
    "HARMLESS_PATHS",
    "OUTSIDE_WORKSPACE",
    "PRESETS",
    "Answer",
    "Choice",
    "CommandLine",
    "Evaluation",
    "Facts",
    "OfferedOption",
    "PermissionQuery",
    "Policy",
    "PolicySet",
    "Rule",
    "RuleVerdict",
    "analyze",
    "choose_option",
    "compile_glob",
    "memory_key",
    "parse_command",
]

RuleVerdict = Literal["allow", "allow_always", "reject", "reject_always", "ask"]
Answer = Literal["allow", "allow_always", "reject", "reject_always"]

#: rule name of the hard rejection of paths outside the session root
OUTSIDE_WORKSPACE = "outside-workspace"
#: rule name of the decision when no rule matches and no policy was given; a given policy's
#: own fallthrough is ``<scope>/<its name>: default``
DEFAULT_RULE = "default"
#: rule name (followed by ``: NAMES not allowed by RULE``) of the rejection of a command that
#: sets a variable the deciding rule does not allow (nor :data:`FREE_ENV`)
COMMAND_ENVIRONMENT = "command-environment"
#: names accepted by :meth:`Policy.preset`
PRESETS = ("read-only", "edit", "trusted", "deny-all")

_READ_KINDS = ("read", "search", "think", "fetch")
_EDIT_KINDS = ("edit", "delete", "move")
#: paths a command may name outside the workspace: they reach no file
HARMLESS_PATHS = frozenset(("/dev/null", "/dev/stdin", "/dev/stdout", "/dev/stderr", "/dev/tty"))


# --------------------------------------------------------------------------- inputs


@frozen
class OfferedOption:
    """One permission option as the agent offered it."""

    option_id: str
    kind: str
    name: str = ""


@frozen
class PermissionQuery:
    """What the policy sees of one permission request (plain values, no protocol types)."""

    tool_call_id: str
    kind: str | None
    title: str | None
    #: the session root: relative paths resolve against it, nothing may leave it
    root: str
    options: tuple[OfferedOption, ...] = ()
    agent: str = ""
    session_id: str = ""
    step: str | None = None
    #: paths from the tool call's ``locations`` and diff contents
    locations: tuple[str, ...] = ()
    #: the tool call's ``rawInput`` (any JSON value)
    raw_input: Any = None
    #: names of the variables the request sets for its command (``terminal/create``'s ``env``)
    env: tuple[str, ...] = ()


# --------------------------------------------------------------------------- names


def _named(name: str | None, globs: Sequence[str]) -> bool:
    """No globs match anything; otherwise ``name`` must match one (None matches none)."""
    return not globs or (name is not None and any(fnmatch.fnmatchcase(name, g) for g in globs))


# --------------------------------------------------------------------------- facts


@frozen
class Facts:
    """A request reduced to what rules match on (computed once by :func:`analyze`)."""

    kind: str
    title: str
    agent: str
    step: str | None
    #: every touched path, absolute and normalized, in first-seen order
    paths: tuple[str, ...]
    #: each path relative to the root (``.`` for the root itself), None when outside it
    relative: tuple[str | None, ...]
    command: CommandLine | None
    #: names of the variables the command sets (the request's ``env``, an ``env`` in the raw
    #: input, and the line's own assignments), in first-seen order
    env: tuple[str, ...] = ()

    @property
    def outside(self) -> tuple[str, ...]:
        """The paths that lie outside the session root."""
        return tuple(p for p, rel in zip(self.paths, self.relative, strict=True) if rel is None)

    @property
    def controlled_env(self) -> tuple[str, ...]:
        """The variables set that a rule must allow (all but :data:`FREE_ENV`)."""
        return tuple(name for name in self.env if not is_free(name))


def _raw_env(raw: Any) -> list[str]:
    """Variable names of an ``env`` in a tool call's raw input: a table of names, or a list of
    ``{"name": ..., "value": ...}`` (the ACP form)."""
    env = raw.get("env") if isinstance(raw, dict) else None
    if isinstance(env, dict):
        return [str(name) for name in env]
    if isinstance(env, list):
        return [str(v["name"]) for v in env if isinstance(v, dict) and "name" in v]
    return []


# A character of a shell word and how it was written: "u" unquoted, "d" inside double quotes,
# "s" literal (single quotes, a backslash escape), "x" something the analysis cannot resolve.
_Char = tuple[str, str]
_SHELL_BREAK = frozenset(" \t\r\n;&|()<>")
_PARAMETER = re.compile(r"[A-Za-z0-9_{(?@*#$!-]")
_NUMBERS = re.compile(r"(-?\d+)\.\.(-?\d+)(?:\.\.-?\d+)?")
_LETTERS = re.compile(r"([A-Za-z])\.\.([A-Za-z])(?:\.\.-?\d+)?")
#: brace alternatives, and glob matches, past which a word counts as unknown
_MAX_EXPANSION = 1024
_CD = frozenset(("cd", "pushd"))


def _shell_words(line: str) -> list[tuple[list[_Char], bool]]:
    """The words of a shell line with how each character was quoted, and whether the word
    is a program or an assignment (the first words of a simple command) rather than an
    argument or a redirection target."""
    words: list[tuple[list[_Char], bool]] = []
    word: list[_Char] = []
    started, at_start, after_redirect = False, True, False
    i, n = 0, len(line)
    while i < n:
        c = line[i]
        if c in _SHELL_BREAK:
            if c == "(" and word and word[-1][1] == "u" and word[-1][0] in "?*+@!":
                word.append((c, "x"))  # an extglob: what it matches is not worked out
                i += 1
                continue
            if started:
                text = "".join(ch for ch, _ in word)
                assignment = word[0][1] == "u" and _ASSIGNMENT_WORD.match(text) is not None
                head = at_start and not after_redirect
                words.append((word, head))
                at_start = at_start and (assignment or not head) and not after_redirect
                if head and not assignment:
                    at_start = False
                after_redirect = False
            word, started = [], False
            if c in ";&|(":
                at_start = True
            elif c in "<>":
                after_redirect = True
        elif c == "'":
            end = line.find("'", i + 1)
            end = n if end < 0 else end
            word += [(ch, "s") for ch in line[i + 1 : end]]
            started, i = True, end
        elif c == "$" and line.startswith("$'", i):  # ANSI-C quoting: escapes spell anything
            end = i + 2
            while end < n and line[end] != "'":
                word.append((line[end], "x" if line[end] == "\\" else "s"))
                end += 2 if line[end] == "\\" else 1
            started, i = True, end
        elif c == '"':
            end = i + 1
            while end < n and line[end] != '"':
                if line[end] == "\\" and end + 1 < n and line[end + 1] in '$`"\\\n':
                    word.append((line[end + 1], "s"))
                    end += 2
                else:
                    word.append((line[end], "d"))
                    end += 1
            started, i = True, end
        elif c == "\\":
            if i + 1 < n:
                word.append((line[i + 1], "s"))
            started, i = True, i + 1
        else:
            word.append((c, "u"))
            started = True
        i += 1
    if started:
        words.append((word, at_start and not after_redirect))
    return words


_ASSIGNMENT_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?=")


def _text(word: Sequence[_Char]) -> str:
    return "".join(ch for ch, _ in word)


def _unknown(word: Sequence[_Char]) -> bool:
    """Whether the shell makes of ``word`` something only running it tells: a variable or a
    command substitution, an ANSI-C escape, an extglob."""
    for index, (ch, how) in enumerate(word):
        if how == "x" or (how != "s" and ch == "`"):
            return True
        if how != "s" and ch == "$" and index + 1 < len(word):
            following, quoted = word[index + 1]
            if quoted != "s" and _PARAMETER.match(following):
                return True
    return False


def _sequence(body: Sequence[_Char]) -> list[list[_Char]] | None:
    """The words of a sequence expression ``{1..3}``, ``{a..e}`` (None: not one)."""
    text = _text(body)
    if any(how != "u" for _, how in body):
        return None
    if match := _NUMBERS.fullmatch(text):
        first, last = int(match[1]), int(match[2])
        if abs(last - first) >= _MAX_EXPANSION:
            return [[("?", "x")]]
        padded = any(len(e.lstrip("-")) > 1 and e.lstrip("-")[0] == "0" for e in match.groups()[:2])
        width = max(len(match[1]), len(match[2])) if padded else 0
        step = 1 if last >= first else -1
        return [[(ch, "u") for ch in str(v).zfill(width)] for v in range(first, last + step, step)]
    if match := _LETTERS.fullmatch(text):
        first, last = ord(match[1]), ord(match[2])
        step = 1 if last >= first else -1
        return [[(chr(v), "u")] for v in range(first, last + step, step)]
    return None


def _braces(word: list[_Char]) -> list[list[_Char]]:
    """``word`` after brace expansion (``{a,b}``, nested, ``{1..3}``): its alternatives. Past
    :data:`_MAX_EXPANSION` alternatives the result holds a word the analysis cannot resolve."""
    for start, (ch, how) in enumerate(word):
        if ch != "{" or how != "u" or (start and word[start - 1] == ("$", "u")):
            continue
        depth, commas, end = 0, [], -1
        for index in range(start, len(word)):
            c, h = word[index]
            if h != "u":
                continue
            if c == "{":
                depth += 1
            elif c == "}":
                depth -= 1
                if depth == 0:
                    end = index
                    break
            elif c == "," and depth == 1:
                commas.append(index)
        if end < 0:
            continue
        if commas:
            cuts = [start, *commas, end]
            parts = [word[a + 1 : b] for a, b in itertools.pairwise(cuts)]
        else:
            sequence = _sequence(word[start + 1 : end])
            if sequence is None:
                continue
            parts = sequence
        results: list[list[_Char]] = []
        for part in parts:
            results += [word[:start] + rest for rest in _braces(part + word[end + 1 :])]
            if len(results) > _MAX_EXPANSION:
                return [[("?", "x")]]
        return results
    return [word]


def _values(word: list[_Char]) -> list[list[_Char]]:
    """The parts of an argument that may name a path: the word, an option's or an operand's
    value (``--output=/x``, ``-o/x``, ``of=/x``)."""
    text = _text(word)
    values = [word]
    if "=" in text:
        values.append(word[text.index("=") + 1 :])
    if text.startswith("-") and not text.startswith("--") and len(text) > 2:
        values.append(word[2:])
    return [v for v in values if v and _text(v) not in HARMLESS_PATHS and v[0][0] != "-"]


def _is_glob(value: Sequence[_Char]) -> bool:
    return any(how == "u" and ch in "*?[" for ch, how in value)


def _escaped(value: Sequence[_Char]) -> str:
    """A glob for :func:`glob.glob` in which only the unquoted glob characters are special."""
    return "".join(ch if how == "u" or ch not in "*?[" else f"[{ch}]" for ch, how in value)


@frozen
class _Words:
    """The arguments of a command line sorted by what they may name."""

    #: absolute, ``~`` or climbing: checked as paths
    found: tuple[str, ...]
    #: other words: paths outside only through a symlink
    others: tuple[str, ...]
    #: words whose value the analysis cannot know: outside
    unknown: tuple[str, ...]
    #: glob patterns (relative or absolute, only their unquoted glob characters special)
    globs: tuple[str, ...]


def _command_words(command: CommandLine, depth: int = 0) -> _Words:
    """What the arguments and redirection targets of ``command`` may name, after the
    expansions the shell does: braces expanded, variables and substitutions unknown, globs
    left to be matched; ``cd`` without a directory, or to ``-``, goes outside."""
    found: list[str] = []
    others: list[str] = []
    unknown: list[str] = []
    globs: list[str] = []
    for word, head in _shell_words(command.line):
        if head:
            continue
        for alternative in _braces(word):
            if _unknown(alternative):
                unknown.append(_text(word))
                continue
            for value in _values(alternative):
                text = _text(value)
                if value[0] == ("~", "u"):  # a home directory
                    unknown.append(text)
                elif text.startswith(("/", "file://")) or ".." in text.split("/"):
                    found.append(text)
                else:
                    others.append(text)
                if _is_glob(value):
                    globs.append(_escaped(value))
    for argv in command.segments:
        if posixpath.basename(argv[0]) in _CD:
            operands = [a for a in argv[1:] if a == "-" or not a.startswith("-")]
            if not operands:
                unknown.append("~")  # $HOME
            elif operands[0] == "-":
                unknown.append("$OLDPWD")
        inner = parse_command(argv)
        if depth < 4 and inner.line != shlex.join(argv):  # a ``bash -c LINE`` inside the line
            nested = _command_words(inner, depth + 1)
            found += nested.found
            others += nested.others
            unknown += nested.unknown
            globs += nested.globs
    return _Words(tuple(found), tuple(others), tuple(unknown), tuple(globs))


def _glob_reaches(
    pattern: str, root: str, glob: Callable[[str], Iterable[str]] | None
) -> tuple[list[str], bool]:
    """The places a glob may name: its literal directory, ``..`` where a part can match it,
    and with ``glob`` (I/O) what each of its directory levels matches now. True with them
    when it matches more than :data:`_MAX_EXPANSION` (then it counts as unknown)."""
    parts = posixpath.join(root, pattern).split("/")
    magic = [index for index, part in enumerate(parts) if any(c in part for c in "*?[")]
    reaches = ["/".join(parts[: magic[0]]) or "/"] if magic else []
    for index in magic:
        if fnmatch.fnmatchcase("..", parts[index]):  # ``.[.]``, ``.?``: a glob may climb
            reaches.append("/".join([*parts[:index], ".."]))
        if glob is not None:
            matches = list(itertools.islice(glob("/".join(parts[: index + 1])), _MAX_EXPANSION + 1))
            if len(matches) > _MAX_EXPANSION:
                return reaches, True
            reaches += matches
    return reaches, False


def _place(
    candidate: str, root: str, realpath: Callable[[str], str] | None, *, literal: bool = False
) -> tuple[str, str | None]:
    """``candidate`` made absolute and relative to ``root`` (None: outside), following
    symlinks with ``realpath`` when given: a link inside the root to a place outside it is
    outside, and the path is then the one it reaches. A ``literal`` candidate is a word as the
    shell passes it on (its ``$`` and ``~`` are characters, not expansions)."""
    if literal:
        base = posixpath.normpath(root)
        absolute = posixpath.normpath(posixpath.join(base, candidate.removeprefix("file://")))
        prefix = base.rstrip("/") + "/"
        relative = absolute[len(prefix) :] if absolute.startswith(prefix) else None
        relative = "." if absolute == base else relative
    else:
        absolute, relative = resolve(candidate, root)
    if realpath is None or relative is None:
        return absolute, relative
    real, real_root = realpath(absolute), realpath(root)
    if real == real_root:
        return root, "."
    if not real.startswith(real_root.rstrip("/") + "/"):
        return real, None
    inside = real[len(real_root.rstrip("/")) + 1 :]
    return posixpath.join(root, inside), inside


def analyze(
    query: PermissionQuery,
    *,
    realpath: Callable[[str], str] | None = None,
    glob: Callable[[str], Iterable[str]] | None = None,
) -> Facts:
    """Extract the kind, title, paths, command line and command environment of a request.

    ``realpath`` maps an absolute path to the one it reaches through symlinks, ``glob`` an
    absolute glob to the paths it matches now (I/O the policy leaves to its caller); without
    them, paths are placed lexically and globs by their literal part.
    """
    kind = query.kind or "other"
    raw = command_of(kind, query.raw_input, query.title)
    command = parse_command(raw) if raw is not None else None
    env = list(query.env)
    if command is not None:
        env += [*_raw_env(query.raw_input), *command.variables]
    candidates = [*query.locations, *raw_paths(query.raw_input)]
    paths: dict[str, str | None] = {}
    for candidate in candidates:
        if candidate:
            absolute, relative = _place(candidate, query.root, realpath)
            paths.setdefault(absolute, relative)
    if command is not None:
        words = _command_words(command)
        for word in words.unknown:  # its value is known only when it runs: not inside
            paths.setdefault(word, None)
        # redirection targets are files wherever they are; other words are paths when they
        # look like one, or reach outside through a symlink or a glob
        redirects = [p for p in command.redirects if not p.startswith("~") and "$" not in p]
        reached = list(words.others) if realpath is not None else []
        for pattern in words.globs:
            reaches, too_many = _glob_reaches(pattern, query.root, glob)
            if too_many:
                paths.setdefault(pattern, None)
            reached += reaches
        for word in [*redirects, *words.found]:
            if word not in HARMLESS_PATHS:
                absolute, relative = _place(word, query.root, realpath, literal=True)
                paths.setdefault(absolute, relative)
        for word in reached:
            absolute, relative = _place(word, query.root, realpath, literal=True)
            if relative is None:
                paths.setdefault(absolute, relative)
    return Facts(
        kind=kind,
        title=query.title or "",
        agent=query.agent,
        step=query.step,
        paths=tuple(paths),
        relative=tuple(paths.values()),
        command=command,
        env=tuple(dict.fromkeys(env)),
    )


def memory_key(facts: Facts) -> tuple[str, str | None]:
    """What an "always" answer is remembered by: the kind, and for execute the command line
    with the names of the variables it sets from outside the line."""
    if facts.command is None or facts.kind != "execute":
        return facts.kind, None
    line = facts.command.line
    outside = [name for name in facts.env if name not in facts.command.variables]
    return facts.kind, " ".join([*(f"{name}=" for name in outside), line])


# --------------------------------------------------------------------------- rules


def _strings(value: str | Iterable[str] | None) -> tuple[str, ...]:
    if value is None:
        return ()
    return (value,) if isinstance(value, str) else tuple(value)


def _prefixes(value: str | Sequence[str | Sequence[str]] | None) -> tuple[tuple[str, ...], ...]:
    """One prefix (a str to split, or a list of tokens) or several (a list of lists)."""
    if not value:
        return ()
    if isinstance(value, str):
        return (tuple(shlex.split(value)),)
    if all(isinstance(item, str) for item in value):
        return (tuple(str(item) for item in value),)
    return tuple(
        tuple(shlex.split(item)) if isinstance(item, str) else tuple(item) for item in value
    )


def _regex(pattern: str | None) -> re.Pattern[str] | None:
    try:
        return re.compile(pattern) if pattern is not None else None
    except re.error as exc:
        raise ValueError(f"bad regex {pattern!r}: {exc}") from exc


@frozen
class Rule:
    """One policy rule: conditions (all must hold) and a verdict. See the module doc."""

    verdict: RuleVerdict
    name: str = ""
    kinds: tuple[str, ...] = field(default=(), converter=_strings)
    title: str | None = None
    title_regex: str | None = None
    paths: tuple[str, ...] = field(default=(), converter=_strings)
    command: tuple[tuple[str, ...], ...] = field(default=(), converter=_prefixes)
    command_regex: str | None = None
    agents: tuple[str, ...] = field(default=(), converter=_strings)
    steps: tuple[str, ...] = field(default=(), converter=_strings)
    env: tuple[str, ...] = field(default=(), converter=_strings)
    _title_re: re.Pattern[str] | None = field(init=False, eq=False, repr=False)
    _command_re: re.Pattern[str] | None = field(init=False, eq=False, repr=False)
    _path_res: tuple[tuple[bool, re.Pattern[str]], ...] = field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if self.verdict not in get_args(RuleVerdict):
            raise ValueError(
                f"unknown verdict {self.verdict!r}; use one of {get_args(RuleVerdict)}"
            )
        if any(not prefix for prefix in self.command):
            raise ValueError("an empty command prefix would match every command")
        paths = tuple((p.startswith("/"), compile_glob(p)) for p in self.paths)
        object.__setattr__(self, "_title_re", _regex(self.title_regex))
        object.__setattr__(self, "_command_re", _regex(self.command_regex))
        object.__setattr__(self, "_path_res", paths)

    @property
    def label(self) -> str:
        """The rule's name, or a description of it when it has none."""
        if self.name:
            return self.name
        parts = [self.verdict] + [f"{k}={v}" for k, v in self._conditions().items()]
        return " ".join(parts)

    def _conditions(self) -> dict[str, object]:
        names: tuple[str, ...] = ("kinds", "title", "title_regex", "paths", "command")
        names += ("command_regex", "agents", "steps", "env")
        return {n: getattr(self, n) for n in names if getattr(self, n)}

    def allows_env(self, name: str) -> bool:
        """Whether ``name`` matches one of this rule's ``env`` globs (case-insensitive)."""
        upper = name.upper()
        return any(fnmatch.fnmatchcase(upper, glob.upper()) for glob in self.env)

    def refused_env(self, facts: Facts) -> tuple[str, ...]:
        """The variables the command sets that this rule, deciding it, does not allow (none for
        a reject rule, whose verdict stands; :data:`FREE_ENV` needs no allowing)."""
        if self.verdict in ("reject", "reject_always"):
            return ()
        return tuple(name for name in facts.controlled_env if not self.allows_env(name))

    def matches(self, facts: Facts) -> bool:
        """Whether every condition of this rule holds for ``facts``."""
        strict = self.verdict in ("allow", "allow_always")
        title = facts.title
        checks = (
            not self.kinds or facts.kind in self.kinds,
            _named(facts.agent, self.agents) and _named(facts.step, self.steps),
            self.title is None or fnmatch.fnmatchcase(title.lower(), self.title.lower()),
            self._title_re is None or self._title_re.search(title) is not None,
        )
        if not all(checks):
            return False
        # allow: `env` lists permissions (see refused_env); reject and ask: a condition
        if self.env and not strict and not any(self.allows_env(n) for n in facts.env):
            return False
        if self._path_res and not self._paths_match(facts, strict):
            return False
        return not (self.command or self._command_re) or self._command_matches(facts, strict)

    def _paths_match(self, facts: Facts, strict: bool) -> bool:
        if not facts.paths:
            return False
        hits = [
            any(
                (target := absolute if is_abs else relative) is not None and rx.fullmatch(target)
                for is_abs, rx in self._path_res
            )
            for absolute, relative in zip(facts.paths, facts.relative, strict=True)
        ]
        return all(hits) if strict else any(hits)

    def _command_matches(self, facts: Facts, strict: bool) -> bool:
        command = facts.command
        if command is None or not command.segments or (strict and command.opaque):
            return False

        def segment_ok(argv: tuple[str, ...]) -> bool:
            if self.command and not any(prefix_matches(p, argv) for p in self.command):
                return False
            return (
                self._command_re is None or self._command_re.fullmatch(shlex.join(argv)) is not None
            )

        if strict:
            return all(segment_ok(argv) for argv in command.segments)
        whole = self._command_re is not None and not self.command
        return any(segment_ok(argv) for argv in command.segments) or (
            whole
            and self._command_re is not None
            and self._command_re.fullmatch(command.line) is not None
        )


# --------------------------------------------------------------------------- policies


def _rules(rules: Iterable[Rule]) -> tuple[Rule, ...]:
    return tuple(rules)


def _preset_rules(name: str) -> tuple[Rule, ...]:
    if name not in PRESETS:
        raise UsageError(f"unknown policy preset {name!r}; known presets: {', '.join(PRESETS)}")
    rules: list[Rule] = []
    if name != "deny-all":
        rules.append(Rule("allow", name=f"{name}: read", kinds=_READ_KINDS))
    if name in ("edit", "trusted"):
        rules.append(
            Rule("allow", name=f"{name}: edit in workspace", kinds=_EDIT_KINDS, paths="**")
        )
    if name == "trusted":
        # any command may run, so a command may set any variable too
        rules.append(Rule("allow", name=f"{name}: execute", kinds="execute", env="*"))
    rules.append(Rule("reject", name=f"{name}: everything else"))
    return tuple(rules)


@frozen
class Policy:
    """An ordered list of rules; the first that matches decides."""

    rules: tuple[Rule, ...] = field(default=(), converter=_rules)
    #: the name the policy was given by (a preset, a file's name): a request none of its rules
    #: decides is rejected by rule ``<scope>/<source>: default``; None: not given (``default``)
    source: str | None = None

    @classmethod
    def preset(cls, name: str, *extra: Rule) -> Policy:
        """A preset (see :data:`PRESETS`), with ``extra`` rules tried before its own."""
        return cls((*extra, *_preset_rules(name)), source=name)

    def extend(self, *rules: Rule) -> Policy:
        """This policy with ``rules`` tried first."""
        return Policy((*rules, *self.rules), source=self.source)

    def first_match(self, facts: Facts) -> Rule | None:
        """The first rule that matches, if any."""
        return next((rule for rule in self.rules if rule.matches(facts)), None)


@frozen
class Evaluation:
    """The policy's verdict on one request."""

    verdict: RuleVerdict
    #: the deciding rule as ``<scope>/<rule>`` (``<scope>/<policy>: default`` when a given
    #: policy's rules decide nothing), or ``default`` / ``outside-workspace``
    rule: str
    facts: Facts


@frozen
class PolicySet:
    """Policies scoped per run, per agent and per step (keys are globs); narrowest first."""

    run: Policy = field(factory=Policy)
    agents: Mapping[str, Policy] = field(factory=dict, hash=False)
    steps: Mapping[str, Policy] = field(factory=dict, hash=False)
    #: ``[[elicitation]]`` tables, interpreted by :mod:`orchestrator.agent.elicitation`
    elicitation: tuple[Mapping[str, Any], ...] = ()
    #: seconds an ``ask`` verdict waits for its escalation to answer
    ask_timeout: float = 120.0

    def scopes(self, agent: str, step: str | None) -> list[tuple[str, Policy]]:
        """The policies that apply, narrowest first: step, agent, run."""
        found = [(f"step:{k}", p) for k, p in self.steps.items() if _named(step, [k])]
        found += [(f"agent:{k}", p) for k, p in self.agents.items() if _named(agent, [k])]
        return [*found, ("run", self.run)]

    def evaluate(
        self,
        query: PermissionQuery,
        *,
        realpath: Callable[[str], str] | None = None,
        glob: Callable[[str], Iterable[str]] | None = None,
    ) -> Evaluation:
        """Decide ``query``: outside-workspace check, then scoped rules, then the default.

        ``realpath`` follows symlinks when paths are placed, ``glob`` matches a command's
        globs (see :func:`analyze`).
        """
        facts = analyze(query, realpath=realpath, glob=glob)
        if facts.outside:
            return Evaluation("reject", OUTSIDE_WORKSPACE, facts)
        fallthrough = DEFAULT_RULE
        for scope, policy in self.scopes(query.agent, query.step):
            rule = policy.first_match(facts)
            if rule is not None:
                label = f"{scope}/{rule.label}"
                refused = rule.refused_env(facts)
                if refused:
                    reason = f"{', '.join(refused)} not allowed by {label}"
                    return Evaluation("reject", f"{COMMAND_ENVIRONMENT}: {reason}", facts)
                return Evaluation(rule.verdict, label, facts)
            if policy.source is not None:
                # a given policy decided nothing: its own end, not "no policy at all"
                fallthrough = f"{scope}/{policy.source}: {DEFAULT_RULE}"
        return Evaluation("reject", fallthrough, facts)

    @classmethod
    def resolve(cls, policy: str | os.PathLike[str] | PolicySet | None) -> PolicySet:
        """The policy a run starts with, resolved once: a preset name, a TOML file, a ready
        :class:`PolicySet`, or None (the empty policy: the ``default`` rule rejects everything).
        """
        if policy is None:
            return cls()
        if isinstance(policy, PolicySet):
            return policy
        return cls.load(os.fspath(policy))

    def narrowed(self, scope: str, policy: PolicySet) -> PolicySet:
        """This policy with ``policy`` tried first for the step or agent named by ``scope``.

        ``scope`` is ``step:NAME`` or ``agent:NAME``. A step's or an agent's own policy narrows
        the run's: its rules come first, in that scope, and whatever they do not decide falls
        through to the wider scopes. A preset ends with a catch-all reject, so a preset given
        to a step or an agent decides every request there. Rules of this policy already scoped
        to the same name come before the added ones.
        """
        kind, _, name = scope.partition(":")
        if kind not in ("step", "agent") or not name:
            raise ValueError(f"scope must be step:NAME or agent:NAME, not {scope!r}")
        table = dict(self.steps if kind == "step" else self.agents)
        mine = table.get(name)
        rules = (*mine.rules, *policy.run.rules) if mine is not None else policy.run.rules
        source = policy.run.source or (mine.source if mine is not None else None)
        table[name] = Policy(rules, source=source)
        if kind == "step":
            return attrs.evolve(self, steps=table)
        return attrs.evolve(self, agents=table)

    def to_mapping(self) -> dict[str, Any]:
        """The policy as the mapping :meth:`from_mapping` reads (presets spelled out as rules).

        What a run records of its policy, so that a resumed run decides as the first attempt did.
        """
        out: dict[str, Any] = {"rules": [_rule_table(r) for r in self.run.rules]}
        if self.run.source is not None:
            out["name"] = self.run.source
        for key, scoped in (("agents", self.agents), ("steps", self.steps)):
            if scoped:
                out[key] = {
                    name: {"rules": [_rule_table(r) for r in p.rules]} for name, p in scoped.items()
                }
        if self.elicitation:
            out["elicitation"] = [dict(e) for e in self.elicitation]
        out["ask_timeout"] = self.ask_timeout
        return out

    def describe(self) -> str:
        """One line on the policy: its rule count, scopes, and the command environment its
        rules allow, for messages."""
        parts = [f"{len(self.run.rules)} run rules"]
        if self.agents:
            parts.append(f"{len(self.agents)} agent scopes")
        if self.steps:
            parts.append(f"{len(self.steps)} step scopes")
        policies = [self.run, *self.agents.values(), *self.steps.values()]
        allowed = [
            glob
            for policy in policies
            for rule in policy.rules
            if rule.verdict not in ("reject", "reject_always")
            for glob in rule.env
        ]
        if allowed:
            parts.append(f"commands may set {', '.join(dict.fromkeys(allowed))}")
        return ", ".join(parts)

    @classmethod
    def from_preset(cls, name: str) -> PolicySet:
        """A run-wide preset."""
        return cls(run=Policy.preset(name))  # its fallthrough: the preset's catch-all

    @classmethod
    def load(cls, spec: str | Path) -> PolicySet:
        """A preset name or the path of a TOML file (the CLI's ``--policy``)."""
        if isinstance(spec, str) and spec in PRESETS:
            return cls.from_preset(spec)
        path = Path(spec)
        if not path.is_file():
            raise UsageError(f"policy {spec}: neither a preset ({', '.join(PRESETS)}) nor a file")
        return cls.from_toml(path)

    @classmethod
    def from_toml(cls, path: str | Path) -> PolicySet:
        """Load the TOML format of the module doc."""
        try:
            data = tomllib.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise UsageError(f"cannot read policy {path}: {exc}") from exc
        except RecursionError:  # the parser recurses once per level of arrays and tables
            raise UsageError(f"cannot read policy {path}: values nested too deeply") from None
        return cls.from_mapping(data, source=str(path), name=Path(path).name)

    @classmethod
    def from_mapping(
        cls, data: Mapping[str, Any], *, source: str = "policy", name: str | None = None
    ) -> PolicySet:
        """Build from the parsed TOML document (or an equal dict).

        ``source`` names it in errors; its ``name`` key, else ``name``, in decisions (see
        :attr:`Policy.source`).
        """
        _check_keys(
            data,
            {"name", "preset", "rules", "agents", "steps", "ask_timeout", "elicitation"},
            source,
        )
        given = data.get("name", name)
        if given is not None and (not isinstance(given, str) or not given.strip()):
            raise UsageError(f"{source}: name must be a non-empty string")
        scoped: dict[str, dict[str, Policy]] = {"agents": {}, "steps": {}}
        for key, policies in scoped.items():
            tables = data.get(key, {})
            if not isinstance(tables, Mapping):
                raise UsageError(f"{source}: [{key}] must be a table of tables")
            for name, table in tables.items():
                policies[name] = _policy(table, f"{source}: [{key}.{name}]", given)
        elicitation = data.get("elicitation", [])
        if not isinstance(elicitation, list) or not all(isinstance(t, dict) for t in elicitation):
            raise UsageError(f"{source}: elicitation must be an array of tables")
        timeout = data.get("ask_timeout", 120.0)
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not math.isfinite(timeout)
            or timeout < 0
        ):
            raise UsageError(
                f"{source}: ask_timeout must be a finite, non-negative number of seconds, "
                f"got {timeout!r}"
            )
        return cls(
            run=_policy(data, source, given, top=True),
            agents=scoped["agents"],
            steps=scoped["steps"],
            elicitation=tuple(elicitation),
            ask_timeout=float(timeout),
        )


# --------------------------------------------------------------------------- loading


_RULE_KEYS = {"name", "verdict", "kinds", "title", "title_regex", "paths", "command", "commands"}
_RULE_KEYS |= {"command_regex", "agents", "steps", "env"}


def _check_keys(table: Any, allowed: set[str], where: str) -> None:
    if not isinstance(table, Mapping):
        raise UsageError(f"{where}: expected a table")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise UsageError(f"{where}: unknown keys {unknown}; allowed: {sorted(allowed)}")


def _policy(table: Any, where: str, name: str | None, *, top: bool = False) -> Policy:
    if not top:
        _check_keys(table, {"preset", "rules"}, where)
    rules = table.get("rules", [])
    if not isinstance(rules, list):
        raise UsageError(f"{where}: rules must be an array of tables")
    parsed = [_rule(rule, f"{where} rules[{i}]") for i, rule in enumerate(rules)]
    preset = table.get("preset")
    if preset is None:
        return Policy(parsed, source=name)
    if not isinstance(preset, str):
        raise UsageError(f"{where}: preset must be a string")
    return Policy(Policy.preset(preset, *parsed).rules, source=name)


def _rule_table(rule: Rule) -> dict[str, Any]:
    """A rule as a ``[[rules]]`` table (the inverse of :func:`_rule`)."""
    table: dict[str, Any] = {"verdict": rule.verdict}
    if rule.name:
        table["name"] = rule.name
    for key in ("kinds", "paths", "agents", "steps", "env"):
        value = getattr(rule, key)
        if value:
            table[key] = list(value)
    for key in ("title", "title_regex", "command_regex"):
        value = getattr(rule, key)
        if value is not None:
            table[key] = value
    if rule.command:
        table["commands"] = [list(prefix) for prefix in rule.command]
    return table


def _is_prefix(item: Any) -> bool:
    return isinstance(item, str) or (
        isinstance(item, list) and all(isinstance(i, str) for i in item)
    )


def _rule(table: Any, where: str) -> Rule:
    _check_keys(table, _RULE_KEYS, where)
    if isinstance(table.get("name"), str) and table["name"]:
        where = f"{where} ({table['name']!r})"
    if "verdict" not in table:
        raise UsageError(f"{where}: a rule needs a verdict ({', '.join(get_args(RuleVerdict))})")
    values = dict(table)
    for key, value in values.items():
        if key in ("kinds", "paths", "agents", "steps", "env", "command") and isinstance(
            value, list
        ):
            ok = all(isinstance(item, str) for item in value)
        elif key == "commands":
            ok = isinstance(value, list) and all(_is_prefix(item) for item in value)
        else:
            ok = isinstance(value, str)
        if not ok:
            raise UsageError(f"{where}: bad value for {key}: {value!r}")
    if "commands" in values:
        if "command" in values:
            raise UsageError(f"{where}: give command or commands, not both")
        commands = values.pop("commands")
        values["command"] = [shlex.split(c) if isinstance(c, str) else c for c in commands]
    try:
        return Rule(**values)
    except (TypeError, ValueError) as exc:
        raise UsageError(f"{where}: {exc}") from exc


# --------------------------------------------------------------------------- options


@frozen
class Choice:
    """The answer to send: the effective verdict and the option id (None: ``cancelled``)."""

    verdict: Literal["allow", "reject"]
    option_id: str | None


_WANTED: dict[str, tuple[str, ...]] = {
    "allow_always": ("allow_always", "allow_once"),
    "allow": ("allow_once",),
    "reject": ("reject_once", "reject_always"),
    "reject_always": ("reject_always", "reject_once"),
}


def choose_option(answer: Answer, options: Sequence[OfferedOption]) -> Choice:
    """The offered option for ``answer``, with the fallback order of the module doc."""
    kinds = _WANTED[answer] + (_WANTED["reject"] if answer.startswith("allow") else ())
    first: dict[str, str] = {}
    for option in options:
        first.setdefault(option.kind, option.option_id)
    for kind in kinds:
        if kind in first:
            return Choice("allow" if kind.startswith("allow") else "reject", first[kind])
    return Choice("reject", None)
