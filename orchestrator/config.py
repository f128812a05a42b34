"""Configuration files: the agents table and the limits, in layers.

Layers, later ones winning: the built-in table (:func:`orchestrator.agents.builtin_agents`) <
the user file < the project file.

- The user file is ``$ORCHESTRATOR_CONFIG`` when that is set (then it must exist), else
  ``$XDG_CONFIG_HOME/acp-orchestrator/config.toml``, else
  ``~/.config/acp-orchestrator/config.toml`` (a missing default file is no error).
- The project file is ``.orchestrator.toml`` in the project directory given, and only there:
  no parent directory is searched.

The format::

    [limits]
    max_sessions = 8          # global limit of live sessions
    max_requests_in_flight = 10000   # an agent's requests unanswered at once
    max_unsent_bytes = 268435456     # bytes of answers an agent leaves unread
    max_turn_record_bytes = 8388608  # what the run store keeps of a turn

    [agents.claude]           # override part of a known agent: unspecified fields keep theirs
    env = { ANTHROPIC_BASE_URL = "http://127.0.0.1:8080" }   # merged into its env

    [agents.mine]             # a new agent (it needs a command)
    command = "python my_agent.py --acp"   # a string (split like a shell would) or a list
    sessions_per_process = 1
    policy = "read-only"

An agent table takes the fields of :class:`~orchestrator.agents.AgentSpec`: ``command``,
``env``, ``description``, ``install``, ``sessions_per_process``, ``startup_timeout``,
``auth_method``, ``policy``, ``max_sessions``, ``max_restarts``, ``cwd``, ``writes`` and
``notes``. Relative paths in a file (in ``command``, ``cwd``, and a ``policy`` that names a
``.toml`` file) are taken relative to the directory of that file, so a project file's paths
resolve against the project. Anything else (unknown keys, wrong types, negative numbers, bad
TOML) is a :class:`~orchestrator.errors.UsageError` naming the file and the key.
"""

from __future__ import annotations

import difflib
import math
import os
import re
import shlex
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
from attrs import field, frozen

from .agents import (
    WRITE_MODES,
    AgentSpec,
    builtin_agents,
    is_policy_path,
    label_agents,
    resolve_agent,
    resolve_argv,
)
from .errors import UsageError
from .policy import PRESETS

__all__ = [
    "CONFIG_ENV",
    "PROJECT_FILE",
    "Config",
    "user_config_path",
]

#: The environment variable naming the user config file.
CONFIG_ENV = "ORCHESTRATOR_CONFIG"
#: The project config file's name, looked up in the project directory only.
PROJECT_FILE = ".orchestrator.toml"
_APP_DIR = "acp-orchestrator"

_TOP_KEYS = ("limits", "agents")
_LIMIT_KEYS = (
    "max_sessions",
    "max_requests_in_flight",
    "max_unsent_bytes",
    "max_turn_record_bytes",
)
_AGENT_KEYS = (
    "command",
    "env",
    "description",
    "install",
    "sessions_per_process",
    "startup_timeout",
    "auth_method",
    "policy",
    "max_sessions",
    "max_restarts",
    "cwd",
    "writes",
    "notes",
)
# an agent name must survive `--agent NAME` and `--agent LABEL=NAME` unchanged
_AGENT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def user_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """Where the user config file is (whether or not it exists); see the module doc."""
    env = os.environ if environ is None else environ
    explicit = env.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    xdg = env.get("XDG_CONFIG_HOME")
    # the XDG spec says to ignore a relative XDG_CONFIG_HOME
    if xdg and os.path.isabs(xdg):
        return Path(xdg) / _APP_DIR / "config.toml"
    home = env.get("HOME")
    base = Path(home) if home else Path.home()
    return base / ".config" / _APP_DIR / "config.toml"


@frozen
class Config:
    """The agents table and the limits, after layering the config files."""

    #: every agent known by name: built-in, then the ones the files added, in file order
    agents: Mapping[str, AgentSpec]
    #: the global limit of live sessions (None = no limit)
    max_sessions: int | None = None
    #: the files read, in layering order (user, then project)
    sources: tuple[str, ...] = ()
    #: an agent's requests unanswered at once before it is cut off (None: not set, the
    #: built-in default applies; see :class:`~orchestrator.agent.client.ClientOptions`)
    max_requests_in_flight: int | None = None
    #: bytes of answers an agent may leave unread before it is cut off (None: not set)
    max_unsent_bytes: int | None = None
    #: bytes the run store keeps of a turn's text, tool calls and transcript, each (None: not
    #: set, :data:`~orchestrator.agent.turn.DEFAULT_MAX_TURN_RECORD_BYTES`)
    max_turn_record_bytes: int | None = None

    @classmethod
    def builtin(cls) -> Config:
        """The built-in table, no limits, no files."""
        return cls(builtin_agents())

    @classmethod
    def load(
        cls,
        project: str | os.PathLike[str] | None = None,
        *,
        environ: Mapping[str, str] | None = None,
    ) -> Config:
        """Built-in < user file < ``<project>/.orchestrator.toml`` (see the module doc).

        ``environ`` (default: ``os.environ``) is where ``ORCHESTRATOR_CONFIG``,
        ``XDG_CONFIG_HOME`` and ``HOME`` are looked up. Reads files: call it from a thread in
        trio code that must not block.
        """
        env = os.environ if environ is None else environ
        config = cls.builtin()
        user = user_config_path(env)
        if env.get(CONFIG_ENV) and not user.is_file():
            raise UsageError(f"${CONFIG_ENV} names {user}, which is not a file")
        if user.is_file():
            config = cls.from_file(user, base=config)
        if project is not None:
            path = Path(project) / PROJECT_FILE
            if path.is_file():
                config = cls.from_file(path, base=config)
        return config

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], *, base: Config | None = None) -> Config:
        """One file layered over ``base`` (default: built-in); its paths are relative to it."""
        where = Path(path)
        try:
            text = where.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise UsageError(f"cannot read config file {where}: {e}") from e
        return cls.from_toml(text, base, source=str(where), root=where.absolute().parent)

    @classmethod
    def from_toml(
        cls,
        text: str,
        base: Config | None = None,
        source: str = "<config>",
        *,
        root: str | os.PathLike[str] | None = None,
    ) -> Config:
        """One layer, from TOML text, over ``base`` (default: built-in).

        ``source`` names the layer in errors and in :attr:`sources`. Relative paths resolve
        against ``root`` when given (:meth:`from_file` passes the file's directory), else
        they are kept as written.
        """
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{source}: invalid TOML: {e}") from e
        layer = _Layer(source, None if root is None else os.fspath(root))
        start = cls.builtin() if base is None else base
        _check_keys(data, _TOP_KEYS, source, "")
        limits = layer.table(data.get("limits", {}), "limits")
        _check_keys(limits, _LIMIT_KEYS, source, "limits")
        # every limit is an integer >= 1, named like the Config field it sets
        values = {key: layer.integer(value, f"limits.{key}", 1) for key, value in limits.items()}
        agents = dict(start.agents)
        for name, table in layer.table(data.get("agents", {}), "agents").items():
            agents[name] = layer.agent(name, table, agents.get(name))
        return attrs.evolve(start, agents=agents, sources=(*start.sources, source), **values)

    def with_agents(self, agents: Mapping[str, AgentSpec]) -> Config:
        """This config with ``agents`` added to (or replacing entries of) its table."""
        return attrs.evolve(self, agents={**self.agents, **agents})

    def resolve_agent(self, text: str) -> AgentSpec:
        """An agent from ``--agent`` (a name in this table, ``NAME=COMMAND`` or a command)."""
        return resolve_agent(text, self.agents)

    def resolve_agents(
        self, agents: Sequence[str | AgentSpec], *, base: str | os.PathLike[str] | None = None
    ) -> list[AgentSpec]:
        """The agents of one run through this table, each under a label unique in the run.

        See :func:`orchestrator.agents.label_agents`: relative paths resolve against ``base``
        when given; the same agent keeps one label, different agents get different ones.
        """
        return label_agents(agents, self.resolve_agent, base=base)


@frozen
class _Layer:
    """Validation of one file's values, naming the file and the key in every error."""

    source: str
    root: str | None = field(default=None)

    def fail(self, key: str, message: str) -> UsageError:
        return UsageError(f"{self.source}: {key}: {message}")

    def table(self, value: Any, key: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(key, f"must be a table, got {_kind(value)}")
        return value

    def string(self, value: Any, key: str) -> str:
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {_kind(value)}")
        return value

    def nonempty(self, value: Any, key: str) -> str:
        text = self.string(value, key)
        if not text.strip():
            raise self.fail(key, "must not be empty")
        return text

    def integer(self, value: Any, key: str, minimum: int) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"must be an integer >= {minimum}, got {_kind(value)}")
        if value < minimum:
            raise self.fail(key, f"must be an integer >= {minimum}, got {value}")
        return value

    def seconds(self, value: Any, key: str) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.fail(key, f"must be a number of seconds, got {_kind(value)}")
        if not math.isfinite(value) or value <= 0:
            raise self.fail(key, f"must be a positive number of seconds, got {value}")
        return float(value)

    def path(self, value: str) -> str:
        expanded = os.path.expanduser(value)
        if self.root is None or os.path.isabs(expanded):
            return expanded
        return os.path.join(self.root, expanded)

    def command(self, value: Any, key: str) -> tuple[str, ...]:
        if isinstance(value, str):
            try:
                argv = tuple(shlex.split(value))
            except ValueError as e:
                raise self.fail(key, f"cannot split {value!r}: {e}") from e
        elif isinstance(value, list) and all(isinstance(arg, str) for arg in value):
            argv = tuple(value)
        else:
            raise self.fail(key, f"must be a string or a list of strings, got {_kind(value)}")
        if not argv or not argv[0]:
            raise self.fail(key, "must name a program")
        return argv if self.root is None else resolve_argv(argv, self.root)

    def env(self, value: Any, key: str) -> dict[str, str]:
        table = self.table(value, key)
        for name, item in table.items():
            if not isinstance(item, str):
                raise self.fail(f"{key}.{_toml_key(name)}", f"must be a string, got {_kind(item)}")
        return dict(table)

    def policy(self, value: Any, key: str) -> str:
        text = self.nonempty(value, key)
        if text in PRESETS:
            return text
        if not is_policy_path(text):
            raise self.fail(
                key, f"{text!r} is neither a preset ({', '.join(PRESETS)}) nor a .toml file path"
            )
        return self.path(text)

    def writes(self, value: Any, key: str) -> str:
        text = self.string(value, key)
        if text not in WRITE_MODES:
            raise self.fail(key, f"must be one of {', '.join(WRITE_MODES)}, got {text!r}")
        return text

    def agent(self, name: str, value: Any, base: AgentSpec | None) -> AgentSpec:
        """Agent ``name`` from its table, field-wise over ``base`` (None: a new agent)."""
        where = f"agents.{_toml_key(name)}"
        if not _AGENT_NAME.fullmatch(name):
            raise self.fail(
                where, "an agent name is letters, digits, '.', '_' or '-' (starting alphanumeric)"
            )
        table = self.table(value, where)
        _check_keys(table, _AGENT_KEYS, self.source, where)
        fields: dict[str, Any] = {}
        for key, item in table.items():
            at = f"{where}.{key}"
            if key == "command":
                fields[key] = self.command(item, at)
            elif key == "env":
                # merged, so an override can add one variable without restating the others
                fields[key] = {**(base.env if base else {}), **self.env(item, at)}
            elif key in ("description", "install", "notes"):
                fields[key] = self.string(item, at)
            elif key == "auth_method":
                fields[key] = self.nonempty(item, at)
            elif key in ("sessions_per_process", "max_sessions"):
                fields[key] = self.integer(item, at, 1)
            elif key == "max_restarts":
                fields[key] = self.integer(item, at, 0)
            elif key == "startup_timeout":
                fields[key] = self.seconds(item, at)
            elif key == "policy":
                fields[key] = self.policy(item, at)
            elif key == "cwd":
                fields[key] = self.path(self.nonempty(item, at))
            else:  # writes: _check_keys admits nothing else
                fields[key] = self.writes(item, at)
        if base is None and "command" not in fields:
            raise self.fail(where, "a new agent needs a command")
        try:
            return AgentSpec(name, **fields) if base is None else attrs.evolve(base, **fields)
        except UsageError as e:  # the spec's own checks, should they disagree with ours
            raise self.fail(where, str(e)) from e


def _check_keys(table: Mapping[str, Any], allowed: tuple[str, ...], source: str, at: str) -> None:
    for key in table:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            where = f"{at}.{_toml_key(key)}" if at else _toml_key(key)
            raise UsageError(
                f"{source}: {where}: unknown key (allowed: {', '.join(allowed)}){hint}"
            )


def _toml_key(key: str) -> str:
    # a key as it would be written in the file: bare when it can be, else quoted
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else '"' + key.replace('"', '\\"') + '"'


def _kind(value: Any) -> str:
    names = {bool: "a boolean", int: "an integer", float: "a number", str: "a string"}
    names |= {list: "an array", dict: "a table"}
    return names.get(type(value), type(value).__name__)
