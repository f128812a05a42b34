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
       counts as a path when a symlink takes it outside).
    2. Scopes are searched narrowest first: the step's policies, then the agent's, then the run's.
       The first rule that matches decides (rule name ``<scope>/<rule>``).
    3. No rule matches: reject (rule ``default``).

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
#: rule name of the decision when no rule matches
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


def _argument_paths(segments: Iterable[tuple[str, ...]]) -> tuple[list[str], list[str]]:
    """The arguments of each simple command that name a path outside, or may: absolute
    (``/x``, ``file:///x``), in a home directory (``~/x``) or climbing with ``..``; alone, as an
    option's value (``--output=/x``, ``-o/x``) or an operand's (``of=/x``). The program itself
    (the first word) is not counted, nor :data:`HARMLESS_PATHS`. The other words come second:
    they name a path outside only through a symlink."""
    found: list[str] = []
    others: list[str] = []
    for argv in segments:
        for arg in argv[1:]:
            values = [arg]
            if "=" in arg:
                values.append(arg.split("=", 1)[1])
            if arg.startswith("-") and not arg.startswith("--") and len(arg) > 2:
                values.append(arg[2:])
            for value in values:
                if value in HARMLESS_PATHS or not value or value.startswith("-"):
                    continue
                if value.startswith(("/", "~", "file://")) or ".." in value.split("/"):
                    found.append(value)
                else:
                    others.append(value)
    return found, others


def _place(
    candidate: str, root: str, realpath: Callable[[str], str] | None
) -> tuple[str, str | None]:
    """``candidate`` made absolute and relative to ``root`` (None: outside), following
    symlinks with ``realpath`` when given: a link inside the root to a place outside it is
    outside, and the path is then the one it reaches."""
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


def analyze(query: PermissionQuery, *, realpath: Callable[[str], str] | None = None) -> Facts:
    """Extract the kind, title, paths, command line and command environment of a request.

    ``realpath`` maps an absolute path to the one it reaches through symlinks (I/O the policy
    leaves to its caller); without it, paths are placed lexically.
    """
    kind = query.kind or "other"
    raw = command_of(kind, query.raw_input, query.title)
    command = parse_command(raw) if raw is not None else None
    env = list(query.env)
    if command is not None:
        env += [*_raw_env(query.raw_input), *command.variables]
    candidates = [*query.locations, *raw_paths(query.raw_input)]
    if command is not None:
        candidates += [p for p in command.redirects if p not in HARMLESS_PATHS]
        found, others = _argument_paths(command.segments)
        candidates += found
        if realpath is not None:  # a word is a path here only if a symlink takes it outside
            for word in others:
                absolute, relative = _place(word, query.root, realpath)
                if relative is None:
                    candidates.append(absolute)
    paths: dict[str, str | None] = {}
    for candidate in candidates:
        if candidate:
            absolute, relative = _place(candidate, query.root, realpath)
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

    @classmethod
    def preset(cls, name: str, *extra: Rule) -> Policy:
        """A preset (see :data:`PRESETS`), with ``extra`` rules tried before its own."""
        return cls((*extra, *_preset_rules(name)))

    def extend(self, *rules: Rule) -> Policy:
        """This policy with ``rules`` tried first."""
        return Policy((*rules, *self.rules))

    def first_match(self, facts: Facts) -> Rule | None:
        """The first rule that matches, if any."""
        return next((rule for rule in self.rules if rule.matches(facts)), None)


@frozen
class Evaluation:
    """The policy's verdict on one request."""

    verdict: RuleVerdict
    #: the deciding rule as ``<scope>/<rule>``, or ``default`` / ``outside-workspace``
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
        self, query: PermissionQuery, *, realpath: Callable[[str], str] | None = None
    ) -> Evaluation:
        """Decide ``query``: outside-workspace check, then scoped rules, then the default.

        ``realpath`` follows symlinks when paths are placed (see :func:`analyze`).
        """
        facts = analyze(query, realpath=realpath)
        if facts.outside:
            return Evaluation("reject", OUTSIDE_WORKSPACE, facts)
        for scope, policy in self.scopes(query.agent, query.step):
            rule = policy.first_match(facts)
            if rule is not None:
                label = f"{scope}/{rule.label}"
                refused = rule.refused_env(facts)
                if refused:
                    reason = f"{', '.join(refused)} not allowed by {label}"
                    return Evaluation("reject", f"{COMMAND_ENVIRONMENT}: {reason}", facts)
                return Evaluation(rule.verdict, label, facts)
        return Evaluation("reject", DEFAULT_RULE, facts)

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
        rules = (*table[name].rules, *policy.run.rules) if name in table else policy.run.rules
        table[name] = Policy(rules)
        if kind == "step":
            return attrs.evolve(self, steps=table)
        return attrs.evolve(self, agents=table)

    def to_mapping(self) -> dict[str, Any]:
        """The policy as the mapping :meth:`from_mapping` reads (presets spelled out as rules).

        What a run records of its policy, so that a resumed run decides as the first attempt did.
        """
        out: dict[str, Any] = {"rules": [_rule_table(r) for r in self.run.rules]}
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
        return cls(run=Policy.preset(name))

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
        return cls.from_mapping(data, source=str(path))

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any], *, source: str = "policy") -> PolicySet:
        """Build from the parsed TOML document (or an equal dict)."""
        _check_keys(
            data, {"preset", "rules", "agents", "steps", "ask_timeout", "elicitation"}, source
        )
        scoped: dict[str, dict[str, Policy]] = {"agents": {}, "steps": {}}
        for key, policies in scoped.items():
            tables = data.get(key, {})
            if not isinstance(tables, Mapping):
                raise UsageError(f"{source}: [{key}] must be a table of tables")
            for name, table in tables.items():
                policies[name] = _policy(table, f"{source}: [{key}.{name}]")
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
            run=_policy(data, source, top=True),
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


def _policy(table: Any, where: str, *, top: bool = False) -> Policy:
    if not top:
        _check_keys(table, {"preset", "rules"}, where)
    rules = table.get("rules", [])
    if not isinstance(rules, list):
        raise UsageError(f"{where}: rules must be an array of tables")
    parsed = [_rule(rule, f"{where} rules[{i}]") for i, rule in enumerate(rules)]
    preset = table.get("preset")
    if preset is None:
        return Policy(parsed)
    if not isinstance(preset, str):
        raise UsageError(f"{where}: preset must be a string")
    return Policy.preset(preset, *parsed)


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
