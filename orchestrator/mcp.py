"""MCP servers the user gives the agents: a stdio program, or an HTTP or SSE endpoint.

An :class:`McpServer` is what ``--mcp-server``, ``@step(mcp_servers=...)``, the library's
``mcp_servers=`` and a config file's ``[mcp_servers.NAME]`` describe; the agent gets it in
``session/new`` (``session/load``, ``session/resume``) as the protocol's ``McpServer`` value
(:meth:`McpServer.to_protocol`) and starts or connects to it itself. Stdio servers every agent
takes; HTTP and SSE ones only an agent whose ``mcpCapabilities`` says so
(:func:`check_mcp_capabilities`).

Values of environment variables and headers that look secret
(:func:`orchestrator._env.is_secret`: ``*TOKEN*``, ``Authorization``, URL credentials, ...) go
to the agent only: :meth:`McpServer.to_json` (what run records, ``--json`` and reports show)
replaces them with ``"<redacted>"``.

The command-line form (:func:`parse_mcp_server`)::

    NAME=COMMAND ARGS...        a stdio server (split like a shell would)
    NAME=https://HOST/PATH      an HTTP server (streamable HTTP)
    NAME=sse+https://HOST/PATH  an SSE server
    NAME                        a server defined in a config file's [mcp_servers.NAME]
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

import attrs
import orjson
from attrs import field, frozen

from ._env import is_secret
from .errors import McpServerUnsupported, UsageError
from .protocol import types as t

__all__ = [
    "MCP_KINDS",
    "McpKind",
    "McpServer",
    "check_mcp_capabilities",
    "merge_mcp_servers",
    "parse_mcp_server",
]

#: How the agent reaches an MCP server: it starts a program (stdio) or connects to a URL.
McpKind = Literal["stdio", "http", "sse"]
#: The kinds, in the order they are documented.
MCP_KINDS: tuple[McpKind, ...] = ("stdio", "http", "sse")

_REDACTED = "<redacted>"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# the credentials of scheme://user:password@host, kept out of what is shown
_URL_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


def _argv(value: Iterable[str]) -> tuple[str, ...]:
    return tuple(value)


def _pairs(value: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    return dict(value.items() if isinstance(value, Mapping) else value)


@frozen
class McpServer:
    """One MCP server for the agents: ``stdio`` (a ``command`` with its ``env``) or ``http`` /
    ``sse`` (a ``url`` with its ``headers``). Make one with :meth:`stdio`, :meth:`http` or
    :meth:`sse`; a bad value is a :class:`~orchestrator.errors.UsageError`."""

    #: the name the agent knows it by (its tools are named after it)
    name: str
    #: how the agent reaches it
    kind: McpKind = "stdio"
    #: the program and its arguments (stdio)
    command: tuple[str, ...] = field(default=(), converter=_argv)
    #: extra environment variables for the program (stdio)
    env: Mapping[str, str] = field(factory=dict, converter=_pairs)
    #: the endpoint (http, sse)
    url: str = ""
    #: HTTP headers sent with every request (http, sse)
    headers: Mapping[str, str] = field(factory=dict, converter=_pairs)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise UsageError(
                f"MCP server name {self.name!r}: letters, digits, '.', '_' or '-'"
                " (starting alphanumeric)"
            )
        if self.kind not in MCP_KINDS:
            raise UsageError(
                f"MCP server {self.name!r}: kind must be one of {', '.join(MCP_KINDS)},"
                f" got {self.kind!r}"
            )
        for what, table in (("env", self.env), ("headers", self.headers)):
            for key, value in table.items():
                if not isinstance(key, str) or not key or not isinstance(value, str):
                    raise UsageError(
                        f"MCP server {self.name!r}: {what} must map names to strings,"
                        f" got {key!r}: {value!r}"
                    )
        if self.kind == "stdio":
            if not self.command or not all(isinstance(a, str) for a in self.command):
                raise UsageError(f"MCP server {self.name!r}: a stdio server needs a command")
            if not self.command[0] or self.url or self.headers:
                raise UsageError(
                    f"MCP server {self.name!r}: a stdio server has a command and env,"
                    " not a url or headers"
                )
        else:
            if not re.match(r"https?://[^/\s]", self.url or ""):
                raise UsageError(
                    f"MCP server {self.name!r}: an {self.kind} server needs an http:// or"
                    f" https:// url, got {self.url!r}"
                )
            if self.command or self.env:
                raise UsageError(
                    f"MCP server {self.name!r}: an {self.kind} server has a url and headers,"
                    " not a command or env"
                )

    @classmethod
    def stdio(
        cls, name: str, command: str | Sequence[str], env: Mapping[str, str] | None = None
    ) -> McpServer:
        """A program the agent starts and talks MCP to on its stdin and stdout; ``command`` is
        an argv or a command line (split like a shell would)."""
        argv = _split(name, command) if isinstance(command, str) else tuple(command)
        return cls(name, "stdio", argv, env or {})

    @classmethod
    def http(cls, name: str, url: str, headers: Mapping[str, str] | None = None) -> McpServer:
        """An MCP server the agent reaches over (streamable) HTTP at ``url``."""
        return cls(name, "http", url=url, headers=headers or {})

    @classmethod
    def sse(cls, name: str, url: str, headers: Mapping[str, str] | None = None) -> McpServer:
        """An MCP server the agent reaches over HTTP with server-sent events at ``url``."""
        return cls(name, "sse", url=url, headers=headers or {})

    def resolved(self, base: str | os.PathLike[str]) -> McpServer:
        """The server with its program made absolute (the protocol asks for an absolute path):
        a relative path against ``base``, a bare name through ``PATH`` when found there; and
        relative arguments that name files under ``base`` made absolute, as an agent's are
        (:func:`orchestrator.agents.resolve_argv`): the agent starts it in its own directory."""
        if self.kind != "stdio":
            return self
        from .agents import resolve_argv  # the agents' rule; that module imports this one

        root = os.path.abspath(os.fspath(base))
        argv = list(resolve_argv(self.command, root))
        if not os.path.isabs(argv[0]):
            found = shutil.which(argv[0])
            if found is not None:
                argv[0] = os.path.abspath(found)
        return self if tuple(argv) == self.command else attrs.evolve(self, command=tuple(argv))

    def with_settings(
        self, *, env: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None
    ) -> McpServer:
        """The server with ``env`` (stdio) or ``headers`` (http, sse) added to its own."""
        return attrs.evolve(
            self, env={**self.env, **(env or {})}, headers={**self.headers, **(headers or {})}
        )

    def to_protocol(self) -> t.McpServer:
        """The protocol's value, as ``session/new`` carries it: real values, nothing redacted."""
        if self.kind == "stdio":
            return t.McpServerStdio(
                name=self.name,
                command=self.command[0],
                args=list(self.command[1:]),
                env=[t.EnvVariable(name=k, value=v) for k, v in self.env.items()],
            )
        headers = [t.HttpHeader(name=k, value=v) for k, v in self.headers.items()]
        if self.kind == "http":
            return t.McpServerHttp(name=self.name, url=self.url, headers=headers)
        return t.McpServerSse(name=self.name, url=self.url, headers=headers)

    @property
    def has_secrets(self) -> bool:
        """Whether :meth:`to_json` hides a value of this server."""
        return self.to_json() != self.to_json(redact=False)

    def to_json(self, *, redact: bool = True) -> dict[str, Any]:
        """The server as JSON values (camelCase, like the rest of the CLI's JSON).

        With ``redact`` (the default), secret-looking values of ``env`` and ``headers``
        (:func:`orchestrator._env.is_secret`) and the credentials of a URL are replaced by
        ``"<redacted>"``: this is what run records, ``--json`` and reports show.
        """

        def shown(table: Mapping[str, str]) -> dict[str, str]:
            return {k: _REDACTED if redact and is_secret(k, v) else v for k, v in table.items()}

        out: dict[str, Any] = {"name": self.name, "type": self.kind}
        if self.kind == "stdio":
            out |= {"command": list(self.command), "env": shown(self.env)}
        else:
            url = _URL_USERINFO.sub(rf"\1{_REDACTED}@", self.url) if redact else self.url
            out |= {"url": url, "headers": shown(self.headers)}
        return out

    @classmethod
    def from_json(cls, data: Any) -> McpServer:
        """A server from :meth:`to_json`'s form (a run's record)."""
        if not isinstance(data, Mapping):
            raise UsageError(f"an MCP server must be an object, got {data!r}")
        try:
            return cls(
                data.get("name", ""),
                data.get("type", "stdio"),
                data.get("command") or (),
                data.get("env") or {},
                data.get("url") or "",
                data.get("headers") or {},
            )
        except (TypeError, ValueError) as e:
            raise UsageError(f"MCP server {data.get('name')!r}: {e}") from e


def _split(name: str, line: str) -> tuple[str, ...]:
    try:
        argv = tuple(shlex.split(line))
    except ValueError as e:
        raise UsageError(f"MCP server {name!r}: cannot split {line!r}: {e}") from e
    if not argv:
        raise UsageError(f"MCP server {name!r}: a stdio server needs a command")
    return argv


def parse_mcp_server(text: str, defined: Mapping[str, McpServer] | None = None) -> McpServer:
    """A server from its command-line form (see the module's docstring).

    A bare ``NAME`` is looked up in ``defined`` (the config's ``[mcp_servers]``); anything
    else malformed is a :class:`~orchestrator.errors.UsageError` saying what is expected.
    """
    name, sep, rest = text.partition("=")
    name = name.strip()
    if not sep:
        server = (defined or {}).get(name)
        if server is None:
            known = ", ".join(sorted(defined or {})) or "none"
            raise UsageError(
                f"MCP server {text!r}: expected NAME=COMMAND, NAME=URL, NAME=sse+URL or the"
                f" name of a configured server (configured: {known})"
            )
        return server
    if not rest.strip():
        raise UsageError(f"MCP server {text!r}: nothing after '='; expected a command or a URL")
    rest = rest.strip()
    if rest.startswith("sse+"):
        return McpServer.sse(name, rest[len("sse+") :])
    if re.match(r"[A-Za-z][A-Za-z0-9+.-]*://", rest):
        return McpServer.http(name, rest)
    return McpServer.stdio(name, rest)


def merge_mcp_servers(*groups: Iterable[McpServer]) -> tuple[McpServer, ...]:
    """The servers of ``groups`` in order, a later one replacing an earlier one of its name."""
    out: dict[str, McpServer] = {}
    for group in groups:
        for server in group:
            out.pop(server.name, None)
            out[server.name] = server
    return tuple(out.values())


def check_mcp_capabilities(
    servers: Sequence[t.McpServer], capabilities: t.McpCapabilities | None, agent: str
) -> None:
    """Refuse servers the agent cannot take, before a session is asked for.

    Every agent takes stdio servers; HTTP and SSE ones only when its ``mcpCapabilities`` says
    so. Raises :class:`~orchestrator.errors.McpServerUnsupported` naming each refused server.
    """
    caps = capabilities or t.McpCapabilities()
    allowed = {"http": bool(caps.http), "sse": bool(caps.sse), "acp": bool(caps.acp)}
    refused = [
        (getattr(server, "name", "?"), server.type)
        for server in servers
        if not isinstance(server, t.McpServerStdio) and not allowed.get(server.type, False)
    ]
    if refused:
        raise McpServerUnsupported(refused, agent=agent)


def redact_frame(frame: bytes) -> bytes:
    """A ``session/new`` (``load``, ``resume``) frame as a transcript keeps it: the secret
    values of its ``mcpServers`` redacted (see :meth:`McpServer.to_json`); any other frame
    as it is."""
    if b'"mcpServers"' not in frame:
        return frame
    try:
        message = orjson.loads(frame)
        servers = message["params"]["mcpServers"]
    except (ValueError, KeyError, TypeError):
        return frame
    if not isinstance(servers, list):
        return frame
    changed = False
    for server in servers:
        if not isinstance(server, dict):
            continue
        for key in ("env", "headers"):
            for pair in server.get(key) or ():
                if isinstance(pair, dict) and is_secret(
                    str(pair.get("name", "")), str(pair.get("value", ""))
                ):
                    pair["value"] = _REDACTED
                    changed = True
        url = server.get("url")
        if isinstance(url, str) and _URL_USERINFO.search(url):
            server["url"] = _URL_USERINFO.sub(rf"\1{_REDACTED}@", url)
            changed = True
    return orjson.dumps(message) if changed else frame
