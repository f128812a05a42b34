"""Configuration files: the agents table and the limits, in layers.

Layers, later ones winning: the built-in table (:func:`orchestrator.agents.builtin_agents`) <
the user file < the project file.

- The user file is ``$ORCHESTRATOR_CONFIG`` when that is set (then it must exist), else
  ``$XDG_CONFIG_HOME/acp-orchestrator/config.toml``, else
  ``~/.config/acp-orchestrator/config.toml`` (a missing default file is no error).
- A config file that is there but is not a regular file (a directory, a FIFO, a symlink to
  nothing) is an error naming it, never silently no config.
- The project file is ``.orchestrator.toml`` in the project directory given, and only there:
  no parent directory is searched. It comes with the project (a cloned repository can carry
  one), so its keys that start programs, widen what an agent may do or pass secrets on
  (``command``, ``env``, ``cwd``, ``policy``, ``terminal_env``:
  :data:`~orchestrator.trust.NEEDS_TRUST`) are used only when the user trusted that file
  (:class:`~orchestrator.trust.TrustStore`, by path and digest); otherwise they are ignored,
  an agent the file defines is left out, and :attr:`Config.ignored` says so.

The format::

    [limits]
    max_sessions = 8          # global limit of live sessions
    max_file_size = "100M"    # the largest file a run records as changed (bytes, or K/M/G;
                              # an untrusted project file may only lower it)
    max_requests_in_flight = 10000   # an agent's requests unanswered at once
    max_unsent_bytes = 268435456     # bytes of answers an agent leaves unread
    max_turn_record_bytes = 8388608  # what the run store keeps of a turn

    [agents.claude]           # override part of a known agent: unspecified fields keep theirs
    env = { ANTHROPIC_BASE_URL = "http://127.0.0.1:8080" }   # merged into its env
    terminal_env = ["NPM_TOKEN"]   # passed from the environment to its terminals, by name

    [agents.mine]             # a new agent (it needs a command)
    command = "python my_agent.py --acp"   # a string (split like a shell would) or a list
    sessions_per_process = 1
    policy = "read-only"

    [sandbox]                 # runs confine their agents with Landlock (orchestrator.sandbox)
    enabled = true            # default true; false: these rules only when a run asks
    read = ["/usr", "/etc", "~/.nvm"]   # trees they may read (default: everything)
    write = ["~/.cache/pip"]  # more trees they may write (the branch, home and temp always)
    ports = [443]             # the only TCP ports they may connect to (default: any)
    home = "~/agent-home"     # their HOME (default: a private one per agent)

    [agents.codex.sandbox]    # this agent always runs confined, with its own rules
    ports = [443]

    [mcp_servers.docs]        # an MCP server (orchestrator.mcp): a stdio program ...
    command = "npx -y @acme/docs-mcp"   # a string (split like a shell would) or a list
    args = ["--stdio"]
    env = { DOCS_TOKEN = "..." }
    [mcp_servers.api]         # ... or an HTTP (type = "http", the default) or SSE endpoint
    url = "https://mcp.example.com/mcp"
    headers = { Authorization = "Bearer ..." }

    [agents.claude]
    mcp_servers = ["docs", "api"]   # every session of the agent gets these

An agent table takes the fields of :class:`~orchestrator.agents.AgentSpec`: ``command``,
``env``, ``description``, ``install``, ``sessions_per_process``, ``startup_timeout``,
``auth_method``, ``policy``, ``max_sessions``, ``max_restarts``, ``cwd``, ``writes``,
``notes``, ``terminal_env``, ``sandbox`` (``true``, ``false`` or a table of rules as above,
without ``enabled``) and ``mcp_servers`` (names of ``[mcp_servers]`` tables of that file or an
earlier one). A stdio MCP server an untrusted project file defines is a program: it is left out
(and listed in :attr:`Config.ignored`), as the file's agents' commands are. No file turns
off a sandbox an earlier file turned on, for the runs or for an agent; a later file's rules
replace an earlier one's.

Relative paths in a file (in ``command``, ``cwd``, a ``policy`` that names a ``.toml`` file,
and sandbox paths) are taken relative to the directory of that file, so a project file's paths
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
from attrs import define, field, frozen

from ._sizes import DEFAULT_MAX_FILE_SIZE, DEFAULT_MAX_TURN_RECORD_BYTES, parse_size
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
from .jsonrpc.connection import DEFAULT_MAX_REQUESTS_IN_FLIGHT, DEFAULT_MAX_UNSENT_BYTES
from .mcp import MCP_KINDS, McpServer, parse_mcp_server
from .policy import PRESETS
from .sandbox import Sandbox
from .trust import NEEDS_TRUST, TrustStore

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

_TOP_KEYS = ("limits", "agents", "sandbox", "mcp_servers")
_MCP_KEYS = ("type", "command", "args", "env", "url", "headers")
_SANDBOX_KEYS = ("enabled", "read", "write", "ports", "home")
_LIMIT_KEYS = (
    "max_sessions",
    "max_file_size",
    "max_requests_in_flight",
    "max_unsent_bytes",
    "max_turn_record_bytes",
)
# the limits on what an agent may cost, with their built-in defaults: an untrusted project file
# may lower them, not raise them
_BOUNDS = {
    "max_requests_in_flight": DEFAULT_MAX_REQUESTS_IN_FLIGHT,
    "max_unsent_bytes": DEFAULT_MAX_UNSENT_BYTES,
    "max_turn_record_bytes": DEFAULT_MAX_TURN_RECORD_BYTES,
}
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
    "terminal_env",
    "sandbox",
    "mcp_servers",
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


def _config_file_there(path: Path) -> bool:
    """Whether the config file ``path`` is there; one that is there but is not a regular file
    (a directory, a FIFO, a link to nothing) is a :class:`UsageError`, not silently no config."""
    if path.is_file():
        return True
    if os.path.lexists(path):
        raise UsageError(f"the config file {path} is there but is not a regular file")
    return False


@frozen
class Config:
    """The agents table and the limits, after layering the config files."""

    #: every agent known by name: built-in, then the ones the files added, in file order
    agents: Mapping[str, AgentSpec]
    #: the global limit of live sessions (None = no limit)
    max_sessions: int | None = None
    #: the files read, in layering order (user, then project)
    sources: tuple[str, ...] = ()
    #: what an untrusted project file said and was not used, as ``FILE: KEY`` (e.g.
    #: ``/p/.orchestrator.toml: agents.demo.command``)
    ignored: tuple[str, ...] = ()
    #: agents that only an untrusted project file defines: name -> that file
    untrusted_agents: Mapping[str, str] = field(factory=dict)
    #: the rules of a run's sandbox (None: the defaults of :class:`~orchestrator.sandbox.Sandbox`)
    sandbox: Sandbox | None = field(default=None, kw_only=True)
    #: whether runs confine their agents when they do not ask themselves
    sandboxed: bool = field(default=False, kw_only=True)
    #: the largest content (bytes) a run records for a changed file (None = the default)
    max_file_size: int | None = field(default=None, kw_only=True)
    #: an agent's requests unanswered at once before it is cut off (None: not set, the
    #: built-in default applies; see :class:`~orchestrator.agent.client.ClientOptions`)
    max_requests_in_flight: int | None = field(default=None, kw_only=True)
    #: bytes of answers an agent may leave unread before it is cut off (None: not set)
    max_unsent_bytes: int | None = field(default=None, kw_only=True)
    #: bytes the run store keeps of a turn's text, tool calls and transcript, each (None: not
    #: set, :data:`~orchestrator._sizes.DEFAULT_MAX_TURN_RECORD_BYTES`)
    max_turn_record_bytes: int | None = field(default=None, kw_only=True)
    #: MCP servers by name (``[mcp_servers.NAME]``), for ``--mcp-server NAME`` and the agents'
    #: ``mcp_servers``
    mcp_servers: Mapping[str, McpServer] = field(factory=dict, kw_only=True)
    #: stdio MCP servers that only an untrusted project file defines: name -> that file
    untrusted_mcp_servers: Mapping[str, str] = field(factory=dict, kw_only=True)

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
        trusted: bool | None = None,
        state_dir: str | os.PathLike[str] | None = None,
    ) -> Config:
        """Built-in < user file < ``<project>/.orchestrator.toml`` (see the module doc).

        ``environ`` (default: ``os.environ``) is where ``ORCHESTRATOR_CONFIG``,
        ``XDG_CONFIG_HOME`` and ``HOME`` are looked up. ``trusted`` says whether the project
        file may start programs; None (the default) asks the trust record in ``state_dir``
        (default: the state directory). Reads files: call it from a thread in trio code that
        must not block.
        """
        env = os.environ if environ is None else environ
        config = cls.builtin()
        user = user_config_path(env)
        if env.get(CONFIG_ENV) and not user.is_file():
            raise UsageError(f"${CONFIG_ENV} names {user}, which is not a file")
        if _config_file_there(user):
            config = cls.from_file(user, base=config)
        if project is not None:
            path = Path(project) / PROJECT_FILE
            if _config_file_there(path):
                data = _read(path)
                # the digest is of the very bytes parsed below: no window for a swap
                ok = trusted
                if ok is None:
                    ok = TrustStore.at(state_dir).status(path, data) == "trusted"
                config = cls.from_toml(
                    _decode(path, data),
                    config,
                    source=str(path),
                    root=path.absolute().parent,
                    trusted=ok,
                )
        return config

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, base: Config | None = None, trusted: bool = True
    ) -> Config:
        """One file layered over ``base`` (default: built-in); its paths are relative to it."""
        where = Path(path)
        text = _decode(where, _read(where))
        return cls.from_toml(
            text, base, source=str(where), root=where.absolute().parent, trusted=trusted
        )

    @classmethod
    def from_toml(
        cls,
        text: str,
        base: Config | None = None,
        source: str = "<config>",
        *,
        root: str | os.PathLike[str] | None = None,
        trusted: bool = True,
    ) -> Config:
        """One layer, from TOML text, over ``base`` (default: built-in).

        ``source`` names the layer in errors and in :attr:`sources`. Relative paths resolve
        against ``root`` when given (:meth:`from_file` passes the file's directory), else
        they are kept as written. An untrusted layer is checked whole, but its keys in
        :data:`~orchestrator.trust.NEEDS_TRUST` are not used (see :attr:`ignored`), nor are
        the agents it alone defines.
        """
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise UsageError(f"{source}: invalid TOML: {e}") from e
        except RecursionError:  # the parser recurses once per level of arrays and tables
            raise UsageError(f"{source}: invalid TOML: values nested too deeply") from None
        layer = _Layer(source, None if root is None else os.fspath(root), trusted)
        start = cls.builtin() if base is None else base
        _check_keys(data, _TOP_KEYS, source, "")
        max_sessions = start.max_sessions
        max_file_size = start.max_file_size
        limits = layer.table(data.get("limits", {}), "limits")
        _check_keys(limits, _LIMIT_KEYS, source, "limits")
        if "max_sessions" in limits:
            max_sessions = layer.integer(limits["max_sessions"], "limits.max_sessions", 1)
        if "max_file_size" in limits:
            size = layer.size(limits["max_file_size"], "limits.max_file_size")
            if trusted or size <= (max_file_size or DEFAULT_MAX_FILE_SIZE):
                max_file_size = size
            else:  # it bounds what a hostile agent can make: an untrusted file only lowers it
                layer.ignored.append("limits.max_file_size")
        bounds: dict[str, int] = {}
        for key, default in _BOUNDS.items():
            if key in limits:
                value = layer.integer(limits[key], f"limits.{key}", 1)
                current = getattr(start, key)
                if trusted or value <= (default if current is None else current):
                    bounds[key] = value
                else:  # they bound what a hostile agent can cost: an untrusted file only lowers
                    layer.ignored.append(f"limits.{key}")
        servers = dict(start.mcp_servers)
        untrusted_servers = dict(start.untrusted_mcp_servers)
        for name, table in layer.table(data.get("mcp_servers", {}), "mcp_servers").items():
            server = layer.mcp_server(name, table)
            if server.kind == "stdio" and not trusted:  # a program, like an agent's command
                layer.ignored.append(f"mcp_servers.{_toml_key(name)}")
                if name not in servers:
                    untrusted_servers[name] = source
            else:
                servers[name] = server
                untrusted_servers.pop(name, None)
        layer.servers = servers
        agents = dict(start.agents)
        untrusted = dict(start.untrusted_agents)
        for name, table in layer.table(data.get("agents", {}), "agents").items():
            spec = layer.agent(name, table, agents.get(name))
            if spec is None:
                untrusted[name] = source
            else:
                agents[name] = spec
        sandboxed, rules = start.sandboxed, start.sandbox
        if "sandbox" in data:
            on, given = layer.sandbox(data["sandbox"], "sandbox", top=True)
            if not trusted:  # its rules could open paths and ports to every agent
                layer.ignored.append("sandbox")
            else:
                sandboxed = sandboxed or on  # a later file does not turn it off
                rules = given if given is not None else rules
        return cls(
            agents,
            max_sessions,
            (*start.sources, source),
            (*start.ignored, *(f"{source}: {key}" for key in layer.ignored)),
            untrusted,
            sandbox=rules,
            sandboxed=sandboxed,
            max_file_size=max_file_size,
            mcp_servers=servers,
            untrusted_mcp_servers=untrusted_servers,
            **{key: bounds.get(key, getattr(start, key)) for key in _BOUNDS},
        )

    def with_agents(self, agents: Mapping[str, AgentSpec]) -> Config:
        """This config with ``agents`` added to (or replacing entries of) its table."""
        return attrs.evolve(self, agents={**self.agents, **agents})

    def resolve_agent(self, text: str) -> AgentSpec:
        """An agent from ``--agent`` (a name in this table, ``NAME:MODEL``, ``NAME=COMMAND`` or
        a command; see :func:`orchestrator.agents.resolve_agent`)."""
        name = text if text in self.agents else text.partition(":")[0]  # NAME:MODEL
        source = self.untrusted_agents.get(name)
        if source is not None and name not in self.agents:
            # never taken for a command line either: the name is the untrusted file's
            raise UsageError(
                f"agent {text!r} is defined in {source}, which is not trusted to start programs"
            )
        return resolve_agent(text, self.agents)

    def mcp_server(self, text: str | McpServer) -> McpServer:
        """An MCP server from ``--mcp-server`` (``NAME=COMMAND``, ``NAME=URL``,
        ``NAME=sse+URL``, or the name of a server of this config; see
        :func:`orchestrator.mcp.parse_mcp_server`)."""
        if isinstance(text, McpServer):
            return text
        source = self.untrusted_mcp_servers.get(text.strip())
        if source is not None and "=" not in text:
            raise UsageError(
                f"MCP server {text!r} is defined in {source}, which is not trusted to start"
                " programs"
            )
        return parse_mcp_server(text, self.mcp_servers)

    def resolve_agents(
        self, agents: Sequence[str | AgentSpec], *, base: str | os.PathLike[str] | None = None
    ) -> list[AgentSpec]:
        """The agents of one run through this table, each under a label unique in the run.

        See :func:`orchestrator.agents.label_agents`: relative paths resolve against ``base``
        when given; the same agent keeps one label, different agents get different ones.
        """
        return label_agents(agents, self.resolve_agent, base=base)


@define
class _Layer:
    """Validation of one file's values, naming the file and the key in every error."""

    source: str
    root: str | None = field(default=None)
    trusted: bool = True
    #: keys left unused because the layer is not trusted
    ignored: list[str] = field(factory=list)
    #: the MCP servers an agent table may name: the earlier files' and this one's
    servers: Mapping[str, McpServer] = field(factory=dict)

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

    def size(self, value: Any, key: str) -> int:
        try:
            return parse_size(value)
        except (TypeError, ValueError) as e:
            raise self.fail(key, str(e)) from e

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

    def names(self, value: Any, key: str) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
            raise self.fail(key, f"must be a list of variable names, got {_kind(value)}")
        return tuple(value)

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

    def sandbox(self, value: Any, key: str, *, top: bool) -> tuple[bool, Sandbox | None]:
        """``true``/``false``, or a table of rules: whether it is on, and its rules if given."""
        if isinstance(value, bool):
            return value, None
        if not isinstance(value, dict):
            raise self.fail(key, f"must be true, false or a table, got {_kind(value)}")
        _check_keys(value, _SANDBOX_KEYS if top else _SANDBOX_KEYS[1:], self.source, key)
        enabled = value.get("enabled", True)
        if not isinstance(enabled, bool):
            raise self.fail(f"{key}.enabled", f"must be true or false, got {_kind(enabled)}")
        fields: dict[str, Any] = {}
        for name in ("read", "write"):
            if name in value:
                items = value[name]
                if not isinstance(items, list):
                    raise self.fail(f"{key}.{name}", f"must be an array, got {_kind(items)}")
                fields[name] = tuple(
                    self.path(self.nonempty(item, f"{key}.{name}")) for item in items
                )
        if "ports" in value:
            ports = value["ports"]
            if not isinstance(ports, list):
                raise self.fail(f"{key}.ports", f"must be an array, got {_kind(ports)}")
            fields["ports"] = tuple(self.integer(p, f"{key}.ports", 1) for p in ports)
        if "home" in value:
            fields["home"] = self.path(self.nonempty(value["home"], f"{key}.home"))
        try:
            return enabled, Sandbox(**fields)
        except UsageError as e:
            raise self.fail(key, str(e)) from e

    def mcp_server(self, name: str, value: Any) -> McpServer:
        """MCP server ``name`` from its ``[mcp_servers.NAME]`` table."""
        where = f"mcp_servers.{_toml_key(name)}"
        table = self.table(value, where)
        _check_keys(table, _MCP_KEYS, self.source, where)
        kind = table.get("type", "stdio" if "command" in table else "http")
        if kind not in MCP_KINDS:
            raise self.fail(f"{where}.type", f"must be one of {', '.join(MCP_KINDS)}, got {kind!r}")
        try:
            if kind == "stdio":
                if "command" not in table:
                    raise self.fail(where, "a stdio server needs a command")
                argv = self.command(table["command"], f"{where}.command")
                args = table.get("args", [])
                if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
                    raise self.fail(
                        f"{where}.args", f"must be a list of strings, got {_kind(args)}"
                    )
                env = self.env(table.get("env", {}), f"{where}.env")
                rest = [k for k in ("url", "headers") if k in table]
                if rest:
                    raise self.fail(where, f"a stdio server takes no {' or '.join(rest)}")
                return McpServer(name, "stdio", argv + tuple(args), env)
            extra = [k for k in ("command", "args", "env") if k in table]
            if extra:
                raise self.fail(where, f"an {kind} server takes no {' or '.join(extra)}")
            url = self.nonempty(table.get("url", ""), f"{where}.url")
            headers = self.env(table.get("headers", {}), f"{where}.headers")
            return McpServer(name, kind, url=url, headers=headers)
        except UsageError as e:
            if str(e).startswith(self.source):
                raise
            raise self.fail(where, str(e)) from e

    def server_names(self, value: Any, key: str) -> tuple[McpServer, ...]:
        """An agent's ``mcp_servers``: names of ``[mcp_servers]`` tables."""
        if not isinstance(value, list) or not all(isinstance(n, str) and n for n in value):
            raise self.fail(key, f"must be a list of MCP server names, got {_kind(value)}")
        out: list[McpServer] = []
        for name in value:
            server = self.servers.get(name)
            if server is None:
                if not self.trusted:  # the key is not used anyway
                    continue
                known = ", ".join(sorted(self.servers)) or "none"
                raise self.fail(key, f"no [mcp_servers.{_toml_key(name)}] (defined: {known})")
            out.append(server)
        return tuple(out)

    def agent(self, name: str, value: Any, base: AgentSpec | None) -> AgentSpec | None:
        """Agent ``name`` from its table, field-wise over ``base`` (None: a new agent).

        None when the layer is untrusted and the agent is new: it could only run its command.
        """
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
            elif key == "terminal_env":
                fields[key] = self.names(item, at)
            elif key == "mcp_servers":
                fields[key] = self.server_names(item, at)
            elif key == "sandbox":
                on, rules = self.sandbox(item, at, top=False)
                if on or not (base and base.sandbox):  # a later file does not turn it off
                    fields[key] = rules if rules is not None else on
            else:  # writes: _check_keys admits nothing else
                fields[key] = self.writes(item, at)
        if base is None and "command" not in fields:
            raise self.fail(where, "a new agent needs a command")
        if not self.trusted:
            if base is None:
                self.ignored.append(where)
                return None
            for key in NEEDS_TRUST:
                if fields.pop(key, None) is not None:
                    self.ignored.append(f"{where}.{key}")
        try:
            return AgentSpec(name, **fields) if base is None else attrs.evolve(base, **fields)
        except UsageError as e:  # the spec's own checks, should they disagree with ours
            raise self.fail(where, str(e)) from e


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as e:
        raise UsageError(f"cannot read config file {path}: {e.strerror or e}") from e


def _decode(path: Path, data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"cannot read config file {path}: {e}") from e


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
