"""Agent specs: how to launch an agent, by a known name or by a command line.

``--agent`` accepts a known name (``claude``, ``codex``, ``gemini``, ``qwen``, ``demo``, ...), a
command line (``"npx some-agent --acp"``), or ``NAME=COMMAND`` to label a command line. A
command line's own label names the script or package it runs (:func:`derive_label`); the
agents of one run get labels unique in it (:func:`label_agents`), because agents are the same
only when their :attr:`AgentSpec.identity` is, never because their labels are.

An :class:`AgentSpec` also carries the agent's operating profile: how many sessions one process
serves, how long ``initialize`` may take, which auth method to use, its policy and limits, and
how it writes files (through ``fs/*``, on disk, or both). :data:`KNOWN_AGENTS` is the built-in
table; :mod:`orchestrator.config` layers the user's and the project's config files over it.
"""

from __future__ import annotations

import difflib
import math
import os
import shlex
import shutil
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs
from attrs import field, frozen

from ._agentlabels import derive_label
from ._env import is_secret
from .errors import UnknownAgent, UsageError
from .mcp import McpServer
from .sandbox import Sandbox, SandboxChoice

__all__ = [
    "KNOWN_AGENTS",
    "WRITE_MODES",
    "AgentIdentity",
    "AgentNeeds",
    "AgentSpec",
    "WriteMode",
    "builtin_agents",
    "derive_label",
    "is_policy_path",
    "label_agents",
    "resolve_agent",
    "resolve_argv",
]

#: How an agent changes files: through the client (``fs/write_text_file``), on disk itself
#: (its own tools or shell commands), both, or not known.
WriteMode = Literal["fs", "disk", "both", "unknown"]
#: The values of :data:`WriteMode`, in the order they are documented.
WRITE_MODES: tuple[WriteMode, ...] = ("fs", "disk", "both", "unknown")

# What `to_json` shows instead of a secret value (orchestrator._env.is_secret): the listing is
# printed, logged and recorded with runs, and config files often carry API keys.
_REDACTED = "<redacted>"

#: What makes two specs the same agent (:attr:`AgentSpec.identity`): the command, the extra
#: environment (sorted), the working directory, and the model and mode of its sessions.
AgentIdentity = tuple[
    tuple[str, ...], tuple[tuple[str, str], ...], str | None, str | None, str | None
]


def _argv(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _names(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _servers(value: Iterable[McpServer]) -> tuple[McpServer, ...]:
    return tuple(value)


def _check_command(instance: AgentSpec, attribute: attrs.Attribute[Any], value: Any) -> None:
    if not value or not all(isinstance(arg, str) for arg in value) or not value[0]:
        raise UsageError(f"agent {instance.name!r}: command must be a non-empty list of strings")


def _at_least(minimum: int) -> Any:
    def check(instance: AgentSpec, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise UsageError(
                f"agent {instance.name!r}: {attribute.name} must be an integer >= {minimum},"
                f" got {value!r}"
            )

    return check


def _check_timeout(instance: AgentSpec, attribute: attrs.Attribute[Any], value: Any) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise UsageError(
            f"agent {instance.name!r}: startup_timeout must be a positive number of seconds,"
            f" got {value!r}"
        )


def _check_sandbox(instance: AgentSpec, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, bool | Sandbox):
        raise UsageError(
            f"agent {instance.name!r}: sandbox must be true, false or a Sandbox, got {value!r}"
        )


def _check_writes(instance: AgentSpec, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value not in WRITE_MODES:
        raise UsageError(
            f"agent {instance.name!r}: writes must be one of {', '.join(WRITE_MODES)},"
            f" got {value!r}"
        )


def _strs(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


@frozen
class AgentNeeds:
    """What an agent needs before it can work, beyond being installed.

    Shown by ``orchestrator agents`` (and ``--json`` as ``needs``) and used by its ``--check``
    to say what to do when the agent asks for a login.
    """

    #: the runtime its program needs (``Node.js >= 22``), or None
    runtime: str | None = None
    #: the command a person runs once to log in, or None
    login: str | None = None
    #: environment variables holding an API key or token; any one of them serves
    api_keys: tuple[str, ...] = field(default=(), converter=_strs)
    #: a service that must be running while it works (OpenClaw's Gateway), or None
    service: str | None = None
    #: anything else, in a phrase (a subscription, a provider to configure)
    other: str | None = None

    def __bool__(self) -> bool:
        return any((self.runtime, self.login, self.api_keys, self.service, self.other))

    def summary(self) -> str:
        """The needs in one line (empty when there are none)."""
        parts = []
        if self.runtime:
            parts.append(self.runtime)
        if self.login and self.api_keys:
            parts.append(f"a login ({self.login}) or {_any_of(self.api_keys)}")
        elif self.login:
            parts.append(f"a login ({self.login})")
        elif self.api_keys:
            parts.append(_any_of(self.api_keys))
        if self.service:
            parts.append(self.service)
        if self.other:
            parts.append(self.other)
        return "; ".join(parts)

    @classmethod
    def from_json(cls, data: Any) -> AgentNeeds:
        """The needs :meth:`to_json` wrote (nothing for anything else)."""
        if not isinstance(data, dict):
            return cls()

        def text(key: str) -> str | None:
            value = data.get(key)
            return value if isinstance(value, str) else None

        keys = data.get("apiKeys")
        return cls(
            runtime=text("runtime"),
            login=text("login"),
            api_keys=[k for k in keys if isinstance(k, str)] if isinstance(keys, list) else (),
            service=text("service"),
            other=text("other"),
        )

    def to_json(self) -> dict[str, Any]:
        """The needs as JSON values (``needs`` in ``orchestrator agents --json``)."""
        return {
            "runtime": self.runtime,
            "login": self.login,
            "apiKeys": list(self.api_keys),
            "service": self.service,
            "other": self.other,
        }


def _any_of(names: Sequence[str]) -> str:
    return names[0] if len(names) == 1 else f"one of {', '.join(names)}"


@frozen
class AgentSpec:
    """How to start one agent, and how it behaves once started."""

    #: the label used in logs, reports and ``--json`` output
    name: str
    #: the argv to run
    command: tuple[str, ...] = field(converter=_argv, validator=_check_command)
    #: extra environment variables
    env: Mapping[str, str] = field(factory=dict)
    #: one line on what it is
    description: str = ""
    #: how to install it, for messages when the command is missing
    install: str = ""
    #: sessions one process serves: None = any number; 1 = one session per process, so the pool
    #: spawns a process per session (also right for agents that ignore the session's ``cwd``)
    sessions_per_process: int | None = field(default=None, kw_only=True, validator=_at_least(1))
    #: seconds within which ``initialize`` must answer (npx may download the agent first)
    startup_timeout: float = field(default=120.0, kw_only=True, validator=_check_timeout)
    #: the auth method id to ``authenticate`` with when the agent requires auth; None = the only
    #: method offered, else fail listing them
    auth_method: str | None = field(default=None, kw_only=True)
    #: this agent's permission policy: a preset name or the path of a policy TOML file
    policy: str | None = field(default=None, kw_only=True)
    #: this agent's concurrency limit: live sessions at once (None = only the global limit)
    max_sessions: int | None = field(default=None, kw_only=True, validator=_at_least(1))
    #: how many times its pool restarts it after crashes before giving up
    max_restarts: int = field(default=3, kw_only=True, validator=_at_least(0))
    #: the process's working directory; None = the session's branch directory
    cwd: str | None = field(default=None, kw_only=True)
    #: how it writes files (profile, shown by ``orchestrator agents``)
    writes: WriteMode = field(default="unknown", kw_only=True, validator=_check_writes)
    #: its quirks, in a sentence or two (shown by ``orchestrator agents``)
    notes: str = field(default="", kw_only=True)
    #: names (globs, case-insensitive) of the orchestrator's environment variables its
    #: terminals get beyond the basic set (``PATH``, ``HOME``, ``LANG``, ...); never values
    terminal_env: tuple[str, ...] = field(default=(), kw_only=True, converter=_names)
    #: run it confined by Landlock (:mod:`orchestrator.sandbox`) with these rules, or ``True``
    #: with the run's rules; ``False``/None: only when the run or the step asks
    sandbox: SandboxChoice = field(default=None, kw_only=True, validator=_check_sandbox)
    #: the model each session runs (a value or name of the agent's ``model`` config option),
    #: set after ``session/new``; None = the agent's default. ``NAME:MODEL`` sets it
    model: str | None = field(default=None, kw_only=True)
    #: the session mode each session runs in (one the agent offers); None = its default
    mode: str | None = field(default=None, kw_only=True)
    #: what it needs beyond being installed: a runtime, a login, an API key, a service
    needs: AgentNeeds = field(factory=AgentNeeds, kw_only=True)
    #: MCP servers every session of this agent gets; per session, so not part of what makes
    #: two specs one agent (nor of their equality)
    mcp_servers: tuple[McpServer, ...] = field(
        default=(), kw_only=True, converter=_servers, eq=False
    )

    def resolved(self, base: str | os.PathLike[str]) -> AgentSpec:
        """The spec with relative paths in its command, ``cwd`` and ``policy`` made absolute.

        Agents run in their branch directory, not where the user typed the command, so
        ``--agent "python tools/agent.py"`` must name ``tools/agent.py`` absolutely. Rewritten:
        a relative program path containing ``/``, and relative arguments containing ``/`` that
        exist under ``base``; everything else (options, words, URLs) is left alone. A relative
        ``cwd`` and a policy given as a file path are joined to ``base``. Returns ``self`` when
        nothing changed; every other field is kept.
        """
        root = os.fspath(base)
        argv = resolve_argv(self.command, root)
        cwd = None if self.cwd is None else _join(root, self.cwd)
        policy = self.policy
        if policy is not None and is_policy_path(policy):
            policy = _join(root, policy)
        if (argv, cwd, policy) == (self.command, self.cwd, self.policy):
            return self
        return attrs.evolve(self, command=argv, cwd=cwd, policy=policy)

    @property
    def identity(self) -> AgentIdentity:
        """What makes two specs the same agent: the command, the environment, ``cwd``, and
        the model and mode its sessions run.

        The label is no part of it: two different command lines that read as the same label
        are two agents, and one agent stays one whatever it is called. Compare specs whose
        paths are resolved (:meth:`resolved`), so the same script named relatively and
        absolutely is one agent.
        """
        return (
            self.command,
            tuple(sorted(self.env.items())),
            self.cwd,
            self.model,
            self.mode,
        )

    def with_name(self, name: str) -> AgentSpec:
        """The same agent under another label (``--agent fast=claude``)."""
        return attrs.evolve(self, name=name)

    def executable_found(self) -> bool:
        """Whether the command's program is on PATH (or is a path that exists)."""
        return shutil.which(self.command[0]) is not None

    def to_json(self, *, redact: bool = True) -> dict[str, Any]:
        """The spec as JSON values (``orchestrator agents --json``).

        Keys are camelCase like the rest of the CLI's JSON. With ``redact`` (the default), the
        values of environment variables whose names look secret (``*KEY*``, ``*TOKEN*``,
        ``*PASS*``, ``*SESSION*``, ...) or that hold URL credentials
        (``http://user:pass@proxy``) are replaced by ``"<redacted>"``.
        """
        return {
            "name": self.name,
            "command": list(self.command),
            "env": {
                key: _REDACTED if redact and is_secret(key, value) else value
                for key, value in self.env.items()
            },
            "description": self.description,
            "install": self.install,
            "sessionsPerProcess": self.sessions_per_process,
            "startupTimeout": self.startup_timeout,
            "authMethod": self.auth_method,
            "policy": self.policy,
            "maxSessions": self.max_sessions,
            "maxRestarts": self.max_restarts,
            "cwd": self.cwd,
            "writes": self.writes,
            "notes": self.notes,
            "terminalEnv": list(self.terminal_env),
            "sandbox": (
                self.sandbox.to_json() if isinstance(self.sandbox, Sandbox) else self.sandbox
            ),
            "model": self.model,
            "mode": self.mode,
            "needs": self.needs.to_json(),
            "mcpServers": [s.to_json(redact=redact) for s in self.mcp_servers],
        }


def resolve_argv(argv: tuple[str, ...], root: str) -> tuple[str, ...]:
    """``argv`` with its relative paths made absolute against ``root`` (see :meth:`resolved`)."""
    out = list(argv)
    head = out[0]
    if "/" in head and not os.path.isabs(head):
        out[0] = os.path.join(root, head)
    for i, arg in enumerate(out[1:], start=1):
        if (
            "/" in arg
            and not arg.startswith("-")
            and "://" not in arg
            and not os.path.isabs(arg)
            and os.path.exists(os.path.join(root, arg))
        ):
            out[i] = os.path.join(root, arg)
    return tuple(out)


def is_policy_path(policy: str) -> bool:
    """Whether a ``policy`` value names a file rather than a preset (it has a ``/`` or ends
    in ``.toml``; preset names have neither)."""
    return "/" in policy or os.sep in policy or policy.endswith(".toml")


def _join(root: str, path: str) -> str:
    expanded = os.path.expanduser(path)
    return expanded if os.path.isabs(expanded) else os.path.join(root, expanded)


def _demo_command() -> tuple[str, ...]:
    return (sys.executable, "-m", "orchestrator.demo")


# Commands, packages and needs as the packages installable here say (checked 2026-12-02 with
# `npm view` and the packages' READMEs and bundles, `pip download` for Python): claude
# @agentclientprotocol/claude-agent-acp 0.101.0 (node >= 22); codex
# @agentclientprotocol/codex-acp 2.6.0; gemini @google/gemini-cli 0.61.0 (node >= 20); qwen
# @qwen-code/qwen-code 0.24.4 (node >= 22); opencode opencode-ai 1.18.33 (a native binary);
# copilot @github/copilot 1.0.102 (its token variables are GitHub's documented ones); auggie
# @augmentcode/auggie 0.36.0 (node >= 20); qoder @qoder-ai/qodercli 1.1.52 (installs `qodercli`
# and `qoder`); openclaw 2026.9.6 (node >= 24.16); hermes hermes-agent 0.19.0 (PyPI, Python
# 3.11-3.13, `hermes acp` with the [acp] extra). Kiro CLI is not on npm: its installer is a
# script, so its command is as Kiro documents it. Agents whose support for several sessions in
# different directories is not documented get one session per process: it always works, at the
# price of a process each.
#: Known agents and their usual ACP launch commands.
KNOWN_AGENTS: dict[str, AgentSpec] = {
    spec.name: spec
    for spec in (
        AgentSpec(
            "claude",
            ("npx", "-y", "@agentclientprotocol/claude-agent-acp"),
            description="Claude Code through its ACP adapter (Claude Agent SDK)",
            install="needs Node.js: npx fetches it, or npm install -g "
            "@agentclientprotocol/claude-agent-acp (command claude-agent-acp)",
            sessions_per_process=None,
            startup_timeout=300.0,
            writes="fs",
            needs=AgentNeeds(
                runtime="Node.js >= 22", login="claude /login", api_keys=("ANTHROPIC_API_KEY",)
            ),
            notes="verified with its former name @zed-industries/claude-code-acp 0.16.2 (bundles "
            "Claude Code 2.1.44), which works the same way: log in with `claude /login` or set "
            "ANTHROPIC_API_KEY; reads and edits go through fs/*, Bash through terminal/* (a "
            "whole shell line, no cwd); one process serves many sessions, each in its own cwd; "
            "permission requests leave out the tool kind (taken from the tool call) and offer "
            "allow/allow_always/reject; bypassPermissions is refused as root unless IS_SANDBOX=1",
        ),
        AgentSpec(
            "codex",
            ("npx", "-y", "@agentclientprotocol/codex-acp"),
            description="OpenAI Codex through its ACP adapter (Codex app server)",
            install="needs Node.js: npx fetches it, or npm install -g "
            "@agentclientprotocol/codex-acp (command codex-acp)",
            sessions_per_process=None,
            startup_timeout=300.0,
            writes="disk",
            needs=AgentNeeds(
                runtime="Node.js",
                api_keys=("OPENAI_API_KEY", "CODEX_API_KEY"),
                other="or a ChatGPT login through the agent (a browser)",
            ),
            notes="formerly @zed-industries/codex-acp; offers several auth methods (ChatGPT "
            "login, CODEX_API_KEY, OPENAI_API_KEY): set auth_method to pick one; applies "
            "patches and runs commands itself",
        ),
        AgentSpec(
            "gemini",
            ("gemini", "--acp"),
            description="Gemini CLI in ACP mode",
            install="npm install -g @google/gemini-cli",
            sessions_per_process=None,
            writes="both",
            needs=AgentNeeds(
                runtime="Node.js >= 20",
                login="gemini, then Login with Google",
                api_keys=("GEMINI_API_KEY",),
            ),
            notes="older releases only know --experimental-acp; reads and writes through fs/* "
            "when offered, runs shell commands itself; a new prompt aborts the one in flight",
        ),
        AgentSpec(
            "qwen",
            ("qwen", "--acp"),
            # Qwen Code connects to a session's MCP servers in the background after
            # session/new, so the first prompt could run without their tools; this, its own
            # switch, makes session/new wait (set at launch: it must be in place before the
            # agent says who it is, so it cannot be a quirk of the table)
            env={"QWEN_CODE_LEGACY_MCP_BLOCKING": "1"},
            description="Qwen Code in ACP mode",
            install="npm install -g @qwen-code/qwen-code",
            sessions_per_process=None,
            writes="both",
            needs=AgentNeeds(
                runtime="Node.js >= 22 (runs on 20)",
                login="qwen, then /auth",
                api_keys=("OPENAI_API_KEY",),
                other="with an API key, also --auth-type openai, OPENAI_BASE_URL and OPENAI_MODEL",
            ),
            notes="a Gemini CLI fork, verified with 0.24.4 (declares node >= 22, runs on 20): "
            "reads and edits go through fs/*, shell commands run inside the agent (no "
            "terminal/*; harmless ones unasked); one process serves many sessions, each in its "
            "own cwd; options proceed_once/proceed_always/cancel; sends the undeclared request "
            "craft/drainMidTurnQueue and qwen/notify/... notifications; an API key needs "
            "--auth-type openai with OPENAI_API_KEY, OPENAI_BASE_URL, OPENAI_MODEL; older "
            "releases need --experimental-acp",
        ),
        AgentSpec(
            "opencode",
            ("opencode", "acp"),
            description="OpenCode in ACP mode",
            install="npm install -g opencode-ai",
            sessions_per_process=None,
            writes="both",
            needs=AgentNeeds(login="opencode auth login"),
            notes="log in with `opencode auth login`; runs its own HTTP server in-process; "
            "writes the proposed file through fs/write_text_file before the edit permission "
            "is answered, and edits on disk itself",
        ),
        AgentSpec(
            "copilot",
            ("copilot", "--acp", "--stdio"),
            description="GitHub Copilot CLI in ACP mode (public preview)",
            install="npm install -g @github/copilot",
            sessions_per_process=None,
            writes="unknown",
            needs=AgentNeeds(
                runtime="Node.js",
                login="copilot, then /login",
                api_keys=("COPILOT_GITHUB_TOKEN", "GH_TOKEN", "GITHUB_TOKEN"),
                other="a Copilot subscription",
            ),
            notes="needs a Copilot subscription and `copilot` then /login once; ACP support is "
            "in preview and may change",
        ),
        AgentSpec(
            "auggie",
            ("auggie", "--acp"),
            description="Augment Code's Auggie CLI in ACP mode",
            install="npm install -g @augmentcode/auggie",
            sessions_per_process=1,
            writes="unknown",
            needs=AgentNeeds(
                runtime="Node.js >= 20",
                login="auggie login",
                api_keys=("AUGMENT_SESSION_AUTH",),
            ),
            notes="log in with `auggie login` (or AUGMENT_SESSION_AUTH, the session JSON it "
            "prints); not every interactive feature exists in ACP mode",
        ),
        AgentSpec(
            "qoder",
            ("qodercli", "--acp"),
            description="Qoder CLI in ACP mode",
            install="npm install -g @qoder-ai/qodercli (or curl -fsSL https://qoder.com/install "
            "| bash)",
            sessions_per_process=1,
            writes="fs",
            needs=AgentNeeds(
                runtime="Node.js >= 20",
                login="qodercli login",
                api_keys=("QODER_PERSONAL_ACCESS_TOKEN",),
            ),
            notes="log in with `qodercli login`, or QODER_PERSONAL_ACCESS_TOKEN; documents "
            "file operations and terminals through the client; the package also installs "
            "`qoder`, a dispatcher to the same program",
        ),
        AgentSpec(
            "kiro",
            ("kiro-cli", "acp"),
            description="Kiro CLI in ACP mode",
            install="curl -fsSL https://cli.kiro.dev/install | bash",
            sessions_per_process=1,
            writes="unknown",
            needs=AgentNeeds(login="kiro-cli login"),
            notes="log in with `kiro-cli login` first; adds Kiro extensions (_kiro/...) to "
            "standard ACP",
        ),
        AgentSpec(
            "hermes",
            ("hermes", "acp"),
            description="Nous Research's Hermes Agent in ACP mode",
            install="uv tool install 'hermes-agent[acp]' (or the installer from "
            "hermes-agent.nousresearch.com, then the [acp] extra)",
            sessions_per_process=1,
            writes="disk",
            needs=AgentNeeds(
                runtime="Python 3.11-3.13",
                login="hermes acp --setup",
                other="a model provider configured by that setup",
            ),
            notes="configure a model provider first (`hermes acp --setup`, which it also "
            "offers as its terminal auth method); uses its own file and terminal tools",
        ),
        AgentSpec(
            "openclaw",
            ("openclaw", "acp"),
            description="OpenClaw's ACP bridge to a running OpenClaw Gateway",
            install="npm install -g openclaw@latest, then openclaw onboard --install-daemon",
            sessions_per_process=1,
            writes="disk",
            needs=AgentNeeds(
                runtime="Node.js >= 24.16",
                login="openclaw onboard --install-daemon",
                service="a running OpenClaw Gateway",
            ),
            notes="a bridge: the work runs in the Gateway, which must be running; no client "
            "fs/* and no per-session MCP servers; its edits land in the Gateway's workspace, "
            "not in the session's branch",
        ),
    )
}


def builtin_agents() -> dict[str, AgentSpec]:
    """The built-in table: :data:`KNOWN_AGENTS` plus ``demo`` (the rule-based demo agent)."""
    table = dict(KNOWN_AGENTS)
    table.setdefault(
        "demo",
        AgentSpec(
            "demo",
            _demo_command(),
            description="built-in rule-based demo agent (no model, no network)",
            writes="both",
            notes="edits through fs/* when offered, creates new files on disk itself, and runs "
            "commands in terminals it asks the client for",
        ),
    )
    return table


def resolve_agent(text: str, known: Mapping[str, AgentSpec] | None = None) -> AgentSpec:
    """An agent from ``--agent``: a known name, ``NAME:MODEL``, ``NAME=COMMAND``, or a
    command line.

    ``registry:ID`` is the agent ID of the ACP registry (:mod:`orchestrator.registry`: the
    file ``$ORCHESTRATOR_REGISTRY`` names, else the snapshot shipped with the package),
    labelled ID. ``NAME:MODEL`` is the known agent NAME whose sessions run MODEL (set through
    its ``model`` config option), labelled ``NAME:MODEL``; only a name of the table takes a
    model this way, so a command line with a colon stays a command line. ``LABEL=NAME:MODEL``
    relabels it.
    ``known`` is the table of names (default: :func:`builtin_agents`; a config's table comes
    from :meth:`orchestrator.config.Config.resolve_agent`); ``demo`` is always known. A command
    line without ``NAME=`` is labelled by what it runs (:func:`derive_label`): the package or
    script, not the interpreter or launcher (``python tools/agent.py`` is ``agent``).

    A single word that is no known name, no program on PATH and close to a known name is a
    typo: :class:`~orchestrator.errors.UnknownAgent` names the agent it most likely meant.
    """
    table = builtin_agents() if known is None else dict(known)
    if "demo" not in table:
        table["demo"] = builtin_agents()["demo"]
    text = text.strip()
    if not text:
        raise UsageError("an agent needs a name or a command")
    found = _known(text, table) or _from_registry(text)
    if found is not None:
        return found
    label, text = _split_label(text)
    found = (_known(text, table) or _from_registry(text)) if label is not None else None
    if found is not None:
        return found.with_name(label or found.name)
    try:
        argv = tuple(shlex.split(text))
    except ValueError as e:
        raise UsageError(f"cannot parse agent command {text!r}: {e}") from e
    if not argv:  # NAME= with nothing after it: a name given, its command left out
        raise UsageError(
            f"{label}=: no command after the =" if label else "an agent needs a name or a command"
        )
    if len(argv) == 1:
        _refuse_typo(argv[0], table)
    return AgentSpec(label or derive_label(argv), argv)


#: how close (difflib's ratio) a word must be to a known name to be taken for a typo of it
_TYPO_CUTOFF = 0.75


def _refuse_typo(word: str, table: Mapping[str, AgentSpec]) -> None:
    """Raise :class:`UnknownAgent` if ``word`` is no program on PATH (nor a path) and reads
    like a known name mistyped (``claud``): run as a command it could only fail to start."""
    if "/" in word or os.sep in word or shutil.which(word) is not None:
        return
    close = difflib.get_close_matches(word.lower(), list(table), n=1, cutoff=_TYPO_CUTOFF)
    if close:
        raise UnknownAgent(word, close[0])


def _known(text: str, table: Mapping[str, AgentSpec]) -> AgentSpec | None:
    """A name of ``table``, or ``NAME:MODEL`` (that agent running MODEL, labelled so); None
    for anything else (a command line keeps its meaning, colons and all)."""
    if text in table:
        return table[text]
    name, sep, model = text.partition(":")
    if sep and name in table and model.strip():
        return attrs.evolve(table[name], name=text, model=model.strip())
    return None


def _from_registry(text: str) -> AgentSpec | None:
    """``registry:ID``: that agent of the ACP registry (:mod:`orchestrator.registry`)."""
    if not text.startswith("registry:"):  # orchestrator.registry.PREFIX; imported only if so
        return None
    from .registry import resolve_registry_agent

    return resolve_registry_agent(text)


def _split_label(text: str) -> tuple[str | None, str]:
    """``NAME=COMMAND`` as ``(NAME, COMMAND)``; any other text as ``(None, text)``."""
    head, sep, rest = text.partition("=")
    if sep and head and " " not in head and "/" not in head:
        return head, rest.strip()
    return None, text


def label_agents(
    agents: Sequence[str | AgentSpec],
    resolve: Callable[[str], AgentSpec] | None = None,
    *,
    base: str | os.PathLike[str] | None = None,
) -> list[AgentSpec]:
    """The agents of one run, each under a label unique in the run, in the order given.

    Each text is resolved with ``resolve`` (default: :func:`resolve_agent`), then its paths
    against ``base`` when given (:meth:`AgentSpec.resolved`). Labels follow three rules:

    - a label the user gave (``NAME=COMMAND``, a name of the table, an :class:`AgentSpec`
      given as is) is kept; two different agents (:attr:`AgentSpec.identity`) given the
      same label are a :class:`~orchestrator.errors.UsageError`;
    - the same agent named twice keeps one label: a command line that runs an agent already
      labelled (by the user, or earlier in ``agents``) gets that agent's label;
    - a different agent whose derived label is taken gets the first free of ``LABEL-2``,
      ``LABEL-3``, ... in the order given, so the same list always gives the same labels.

    Two labels the user gave to one agent (``a=demo``, ``b=demo``) stay two agents.
    """
    lookup = resolve or resolve_agent
    named: list[tuple[AgentSpec, bool]] = []
    for agent in agents:
        if isinstance(agent, AgentSpec):
            spec, given = agent, True
        else:
            spec = lookup(agent)
            given = _split_label(agent.strip())[0] is not None or agent.strip() == spec.name
        named.append((spec if base is None else spec.resolved(base), given))
    # the user's labels first, wherever they come: a derived label must not take one
    labelled: dict[str, AgentSpec] = {}
    for spec, given in named:
        if not given:
            continue
        other = labelled.setdefault(spec.name, spec)
        if other.identity != spec.identity:
            raise UsageError(
                f"agent label {spec.name!r} names two different agents: "
                f"{_describe(other, spec)} and {_describe(spec, other)}"
            )
    by_identity: dict[AgentIdentity, AgentSpec] = {}
    for spec in labelled.values():
        by_identity.setdefault(spec.identity, spec)
    out: list[AgentSpec] = []
    for spec, given in named:
        if given:
            out.append(labelled[spec.name])
            continue
        same = by_identity.get(spec.identity)
        if same is None:
            label, n = spec.name, 1
            while label in labelled:
                n += 1
                label = f"{spec.name}-{n}"
            same = labelled[label] = by_identity[spec.identity] = spec.with_name(label)
        out.append(same)
    return out


def _describe(spec: AgentSpec, other: AgentSpec) -> str:
    """``spec``'s command, or what else sets it apart from ``other`` (for one-line errors)."""
    if spec.command != other.command:
        return repr(shlex.join(spec.command))
    if spec.cwd != other.cwd:
        return f"{shlex.join(spec.command)!r} in {spec.cwd or 'its session directory'}"
    if (spec.model, spec.mode) != (other.model, other.mode):
        chosen = ", ".join(
            f"{what} {value or '(default)'}"
            for what, value in (("model", spec.model), ("mode", spec.mode))
        )
        return f"{shlex.join(spec.command)!r} with {chosen}"
    keys = sorted(k for k in {*spec.env, *other.env} if spec.env.get(k) != other.env.get(k))
    env = ", ".join(f"{k}=..." if k in spec.env else f"no {k}" for k in keys)
    return f"{shlex.join(spec.command)!r} with {env}"
