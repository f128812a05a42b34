"""What a run was started with: its policy, limits and agents, recorded and restored on resume.

A run records its :class:`RunSettings` before any agent starts: the resolved policy's rules
(presets spelled out; policies named by steps and agents too), the session limit, the turn
limits, the limit on a changed file, the limits on what an agent may leave unanswered and on
what is recorded of a turn, the agent table and the run's sandbox. Environment values whose
names look secret are never stored: the name is, and the value is read again (from the config,
else the environment) when the run is resumed. :func:`restore_settings` rebuilds the settings
from the record; options given to the resume replace what they name, an agent that the config
files now define otherwise is taken from the config (that is how a user fixes an agent's
command before resuming), and the result says what was restored and what was overridden.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import attrs
from attrs import field, frozen

from .._log import get_logger
from .._sizes import DEFAULT_MAX_FILE_SIZE, parse_size
from ..agent.client import ClientOptions
from ..agent.turn import DEFAULT_MAX_TURN_RECORD_BYTES
from ..agents import (
    _REDACTED,
    AgentNeeds,
    AgentSpec,
)  # the marker AgentSpec.to_json writes for secrets
from ..config import Config
from ..errors import UsageError
from ..mcp import McpServer
from ..policy import PolicySet
from ..sandbox import Sandbox, SandboxChoice, choose_sandbox, sandbox_choice

__all__ = [
    "LIMITS",
    "Restored",
    "RunSettings",
    "configured_limits",
    "file_size_option",
    "policy_source",
    "restore_settings",
]

log = get_logger(__name__)


@frozen
class RunSettings:
    """The resolved options of a run, as recorded."""

    #: the run's policy, resolved once
    policy: PolicySet = field(factory=PolicySet)
    #: how the policy was given: a preset name, a file, ``library`` (a PolicySet), or None
    policy_source: str | None = None
    #: policies named by steps and agents (preset names or files), resolved once
    named_policies: Mapping[str, PolicySet] = field(factory=dict)
    #: live sessions at once
    max_sessions: int = 8
    #: the agent table the run resolves its agents from (labels and names as steps give them)
    agents: Mapping[str, AgentSpec] = field(factory=dict)
    #: the run's own sandbox, confining every agent of the run (None: only the agents and
    #: steps that ask are confined)
    sandbox: Sandbox | None = None
    #: the largest content (bytes) a changed file may have
    max_file_size: int = DEFAULT_MAX_FILE_SIZE
    #: the ``[limits]`` of the config files on what an agent may leave unanswered and on what
    #: is recorded of a turn (:data:`LIMITS`), by their keys; a limit not set is absent (its
    #: default applies)
    limits: Mapping[str, int] = field(factory=dict)
    #: the MCP servers every agent session of the run gets (``--mcp-server``)
    mcp_servers: tuple[McpServer, ...] = ()
    #: the record ``mcp_servers`` were restored from, kept as it is: a secret a resume could
    #: not read again stays recorded (redacted), for a later resume that can
    mcp_record: tuple[Mapping[str, Any], ...] | None = None

    def to_json(self) -> dict[str, Any]:
        """The settings as the run store keeps them (no secret values)."""
        return {
            "policy": self.policy.to_mapping(),
            "policySource": self.policy_source,
            "namedPolicies": {k: p.to_mapping() for k, p in self.named_policies.items()},
            "maxSessions": self.max_sessions,
            "maxFileSize": self.max_file_size,
            "agents": {name: spec.to_json(redact=True) for name, spec in self.agents.items()},
            "sandbox": self.sandbox.to_json() if self.sandbox is not None else None,
            "limits": dict(self.limits),
            "mcpServers": (
                [dict(item) for item in self.mcp_record]
                if self.mcp_record is not None
                else [server.to_json() for server in self.mcp_servers]
            ),
        }

    def load_policy(self, name: str) -> PolicySet:
        """A policy named by a step or an agent: as recorded, else loaded now."""
        found = self.named_policies.get(name)
        return found if found is not None else PolicySet.load(name)

    def config(self, base: Config) -> Config:
        """``base`` with this run's agent table on top."""
        return base.with_agents(self.agents)

    def client_options(self, options: ClientOptions | None) -> ClientOptions:
        """``options`` (default: the defaults) with this run's bounds on the agents' backlog."""
        base = options if options is not None else ClientOptions()
        limits = self.limits
        return attrs.evolve(
            base,
            max_requests_in_flight=limits.get(
                "max_requests_in_flight", base.max_requests_in_flight
            ),
            max_unsent_bytes=limits.get("max_unsent_bytes", base.max_unsent_bytes),
        )

    @property
    def max_turn_record_bytes(self) -> int:
        """What the run store keeps of one turn, in bytes, of each part."""
        value = self.limits.get("max_turn_record_bytes")
        return value if value is not None else DEFAULT_MAX_TURN_RECORD_BYTES


#: the limits a run records besides ``max_sessions`` (keys of the config's ``[limits]``)
LIMITS = ("max_requests_in_flight", "max_unsent_bytes", "max_turn_record_bytes")


def configured_limits(config: Config) -> dict[str, int]:
    """The :data:`LIMITS` that ``config``'s files set."""
    values = {key: getattr(config, key) for key in LIMITS}
    return {key: value for key, value in values.items() if value is not None}


def _spec_from_json(
    data: Mapping[str, Any], current: AgentSpec | None, environ: Mapping[str, str]
) -> tuple[AgentSpec, list[str]]:
    """A recorded agent spec, secrets read again; and the secret names that could not be."""
    env: dict[str, str] = {}
    missing: list[str] = []
    for key, value in dict(data.get("env") or {}).items():
        if value != _REDACTED:
            env[key] = str(value)
        elif current is not None and key in current.env:
            env[key] = current.env[key]
        elif key in environ:
            env[key] = environ[key]
        else:
            missing.append(key)
    spec = AgentSpec(
        str(data["name"]),
        tuple(data["command"]),
        env,
        description=str(data.get("description") or ""),
        install=str(data.get("install") or ""),
        sessions_per_process=data.get("sessionsPerProcess"),
        startup_timeout=float(data.get("startupTimeout") or 120.0),
        auth_method=data.get("authMethod"),
        policy=data.get("policy"),
        max_sessions=data.get("maxSessions"),
        max_restarts=int(data.get("maxRestarts", 3)),
        cwd=data.get("cwd"),
        writes=data.get("writes") or "unknown",
        notes=str(data.get("notes") or ""),
        terminal_env=tuple(data.get("terminalEnv") or ()),
        sandbox=_sandbox_from_json(data.get("sandbox")),
        model=data.get("model"),
        mode=data.get("mode"),
        needs=AgentNeeds.from_json(data.get("needs")),
        mcp_servers=mcp_from_json(
            data.get("mcpServers"), current.mcp_servers if current else (), environ, missing
        ),
    )
    return spec, missing


def mcp_from_json(
    items: Any,
    current: Sequence[McpServer],
    environ: Mapping[str, str],
    missing: list[str],
) -> tuple[McpServer, ...]:
    """Recorded MCP servers, their secrets read again: from the server of the same name given
    now (``current``), an environment variable from the environment; a secret found nowhere
    is left out of the server returned and named in ``missing`` (``NAME.env.VAR``,
    ``NAME.headers.HEADER``, ``NAME.url``: its credentials or query values). The record itself
    is not changed (see :attr:`RunSettings.mcp_record`)."""
    now = {server.name: server for server in current}
    out: list[McpServer] = []
    for item in items or ():
        server = McpServer.from_json(item)
        given = now.get(server.name)
        tables: dict[str, dict[str, str]] = {}
        for what in ("env", "headers"):
            table: dict[str, str] = {}
            for key, value in getattr(server, what).items():
                if value != _REDACTED:
                    table[key] = value
                elif given is not None and key in getattr(given, what):
                    table[key] = getattr(given, what)[key]
                elif what == "env" and key in environ:
                    table[key] = environ[key]
                else:
                    missing.append(f"{server.name}.{what}.{key}")
            tables[what] = table
        url = server.url
        if _REDACTED in url:
            if given is not None:
                url = given.url
            else:  # its credentials or query values are lost: it is tried without them
                url = _without_redacted(url)
                missing.append(f"{server.name}.url")
        out.append(attrs.evolve(server, url=url, env=tables["env"], headers=tables["headers"]))
    return tuple(out)


def _without_redacted(url: str) -> str:
    """A recorded URL without its redacted parts: credentials, path parameters, query values,
    fragment (a token-like path segment stays redacted: the path would change without it)."""
    url = url.replace(f"{_REDACTED}@", "").replace(f"#{_REDACTED}", "")
    url = url.replace(f";{_REDACTED}", "")
    base, _, query = url.partition("?")
    kept = [part for part in query.split("&") if part and not part.endswith(f"={_REDACTED}")]
    return f"{base}?{'&'.join(kept)}" if kept else base


def _sandbox_from_json(value: Any) -> SandboxChoice:
    """A recorded sandbox: its rules, or the true or false an agent was given."""
    if isinstance(value, Mapping):
        return Sandbox.from_json(value)
    return bool(value) if value is not None else None


@frozen
class Restored:
    """What :func:`restore_settings` restored, for the user to see."""

    settings: RunSettings
    #: what came from the record: ``policy``, ``maxSessions``, ``maxFileSize``, ``agents``,
    #: ``sandbox``, ``limits``, ``mcpServers``
    restored: tuple[str, ...] = ()
    #: what the resume's own options replaced
    overridden: tuple[str, ...] = ()
    #: secrets recorded redacted that could not be read again now: agents' variables
    #: (``VAR``), MCP servers' values (``SERVER.env.VAR``, ``SERVER.headers.HEADER``,
    #: ``SERVER.url``); the run goes on without them
    missing_secrets: tuple[str, ...] = ()

    @property
    def warning(self) -> str | None:
        """The warning naming :attr:`missing_secrets`, if any."""
        if not self.missing_secrets:
            return None
        return (
            "secrets of the run not set now, left out of this attempt (set them and resume"
            f" again to restore them): {', '.join(self.missing_secrets)}"
        )

    def to_json(self) -> dict[str, Any]:
        s = self.settings
        return {
            "restored": list(self.restored),
            "overridden": list(self.overridden),
            "policy": s.policy_source,
            "policyRules": s.policy.describe(),
            "maxSessions": s.max_sessions,
            "maxFileSize": s.max_file_size,
            "limits": dict(s.limits),
            "agents": sorted(s.agents),
            "missingSecrets": list(self.missing_secrets),
            "sandbox": s.sandbox.to_json() if s.sandbox is not None else None,
            "mcpServers": [server.name for server in s.mcp_servers],
        }


def restore_settings(
    recorded: Mapping[str, Any] | None,
    config: Config,
    *,
    policy: str | os.PathLike[str] | PolicySet | None = None,
    max_sessions: int | None = None,
    max_file_size: int | None = None,
    environ: Mapping[str, str] | None = None,
    sandbox: SandboxChoice = None,
    mcp_servers: Sequence[McpServer] | None = None,
) -> Restored:
    """The settings of a recorded run, with ``policy``, ``max_sessions`` and ``max_file_size``
    replacing theirs.

    A recorded sandbox is kept (a resume does not turn it off); ``sandbox`` confines a run
    that was not, or gives it other rules. The recorded MCP servers are kept, their secret
    values read again (see :func:`mcp_from_json`); ``mcp_servers`` replaces them. A secret
    that cannot be read again is left out, named in a warning and in the result's
    ``missing_secrets``, and the resume goes on; the record keeps it (redacted). A run
    recorded before settings were kept (no ``recorded``) restores nothing: the resume's
    options and the config decide, as for a new run.
    """
    sandbox_choice(sandbox)  # bad usage, refused before the run is touched
    env = os.environ if environ is None else environ
    restored: list[str] = []
    overridden: list[str] = []
    data = dict(recorded or {})
    if policy is not None:
        policy_set, source = PolicySet.resolve(policy), policy_source(policy)
        overridden.append("policy")
    elif "policy" in data:
        policy_set = PolicySet.from_mapping(data["policy"], source="the recorded policy")
        source = data.get("policySource")
        restored.append("policy")
    else:
        policy_set, source = PolicySet(), None
    named = {
        k: PolicySet.from_mapping(v, source=f"the recorded policy {k}")
        for k, v in dict(data.get("namedPolicies") or {}).items()
    }

    def choose(given: int | None, key: str, fallback: int) -> int:
        # the resume's option, else the record's, else (recorded before it was kept) the config's
        if given is not None:
            overridden.append(key)
            return given
        if key in data:
            restored.append(key)
            return int(data[key])
        return fallback

    sessions = choose(max_sessions, "maxSessions", config.max_sessions or 8)
    file_size = choose(max_file_size, "maxFileSize", config.max_file_size or DEFAULT_MAX_FILE_SIZE)
    # the record's limits, and the ones the config sets now that the record has not
    limits = configured_limits(config)
    recorded_limits = {k: int(v) for k, v in dict(data.get("limits") or {}).items() if k in LIMITS}
    if recorded_limits:
        limits.update(recorded_limits)
        restored.append("limits")
    agents: dict[str, AgentSpec] = {}
    missing: list[str] = []
    builtin = Config.builtin().agents
    for name, spec_json in dict(data.get("agents") or {}).items():
        current = config.resolve_agent(name) if name in config.agents else None
        spec, lost = _spec_from_json(spec_json, current, env)
        if current is not None and config.agents[name] != builtin.get(name) and current != spec:
            # the config files define this agent otherwise now (a fixed command, say): the
            # user's current word wins over the record
            overridden.append(f"agents.{name}")
            continue
        agents[name] = spec
        missing += lost
    if agents:
        restored.append("agents")
    kept = data.get("sandbox")
    run_sandbox: Sandbox | None
    if isinstance(sandbox, Sandbox) or (sandbox is True and not kept):
        run_sandbox = choose_sandbox(sandbox, rules=config.sandbox)
        overridden.append("sandbox")
    elif kept:
        run_sandbox = Sandbox.from_json(kept)
        restored.append("sandbox")
    else:  # as a new run: the config may confine it
        run_sandbox = choose_sandbox(config.sandboxed, rules=config.sandbox)
    record: tuple[Mapping[str, Any], ...] | None = None
    if mcp_servers is not None:
        servers = tuple(mcp_servers)
        overridden.append("mcpServers")
    else:
        servers = mcp_from_json(data.get("mcpServers"), (), env, missing)
        record = tuple(dict(item) for item in data.get("mcpServers") or ())
        if servers:
            restored.append("mcpServers")
    settings = RunSettings(
        policy_set,
        source,
        named,
        sessions,
        agents,
        run_sandbox,
        file_size,
        limits,
        servers,
        mcp_record=record,
    )
    done = Restored(settings, tuple(restored), tuple(overridden), tuple(sorted(set(missing))))
    if done.warning is not None:  # shown at every verbosity: the run is not as it was
        log.warning(done.warning)
    return done


def policy_source(policy: str | os.PathLike[str] | PolicySet | None) -> str | None:
    """How a policy was given, for the record: its name or path, ``library``, or None."""
    if policy is None:
        return None
    if isinstance(policy, PolicySet):
        return "library"
    return os.fspath(policy)


def file_size_option(value: int | str | None) -> int | None:
    """``max_file_size`` as given to a run or a resume, in bytes (``"100M"`` too); a
    :class:`~orchestrator.errors.UsageError` when it is no size."""
    if value is None:
        return None
    try:
        return parse_size(value)
    except (TypeError, ValueError) as e:
        raise UsageError(f"max_file_size: {e}") from None
