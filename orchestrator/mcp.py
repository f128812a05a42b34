"""MCP servers the user gives the agents: a stdio program, or an HTTP or SSE endpoint.

An :class:`McpServer` is what ``--mcp-server``, ``@step(mcp_servers=...)``, the library's
``mcp_servers=`` and a config file's ``[mcp_servers.NAME]`` describe; the agent gets it in
``session/new`` (``session/load``, ``session/resume``) as the protocol's ``McpServer`` value
(:meth:`McpServer.to_protocol`) and starts or connects to it itself. Stdio servers every agent
takes; HTTP and SSE ones only an agent whose ``mcpCapabilities`` says so
(:func:`check_mcp_capabilities`).

A server's secrets go to the agent only: :meth:`McpServer.to_json` (what run records,
``--json``, reports and transcripts show) replaces with ``"<redacted>"`` every environment
value except those of :data:`PLAIN_ENV`, every header value except those of
:data:`PLAIN_HEADERS`, a URL's credentials, path parameters (``;...``), path segments that
read as tokens (:func:`shown_url`) and every value of its query (an allowlist: a
secret under a name nobody foresaw, such as ``PGPASS`` or ``Signature``, is hidden too).
Every value is checked when the server is made (:meth:`McpServer.__attrs_post_init__`, whatever
made it): header names are HTTP tokens and values hold no line break, variable names hold no
``=``, NUL or space, and a URL parses.

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
import urllib.parse
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
    "PLAIN_ENV",
    "PLAIN_HEADERS",
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
#: The environment variables of a stdio server whose values are shown (exact names): they
#: say where and how a program runs, never who it is. Every other value is redacted.
PLAIN_ENV = frozenset((
    "PATH", "HOME", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "TZ", "TERM", "NO_COLOR",
    "LOG_LEVEL", "DEBUG", "NODE_ENV", "PYTHONUNBUFFERED",
))  # fmt: skip
#: The headers of an HTTP or SSE server whose values are shown (case-insensitive); every other
#: value is redacted.
PLAIN_HEADERS = frozenset(
    ("accept", "accept-language", "content-type", "user-agent", "mcp-protocol-version")
)
# a header's name: an RFC 7230 token
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")
# what no header value, variable or argument may hold: line breaks (a header injected into the
# request), NUL (which ends a C string) and the other control characters but tab
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# the credentials of scheme://user:password@host, kept out of what is shown
_URL_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")
# a URL's scheme and authority, then its path (up to a query or fragment)
_URL_PATH = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/?#]*)([^?#]*)")
# a path segment that reads as a token (hosted MCP servers put one there: /t/TOKEN/sse): 20 or
# more of [A-Za-z0-9_-], with a letter and a digit; shorter or plainer segments are words
_TOKEN_SEGMENT = re.compile(r"(?=[\w-]*[0-9])(?=[\w-]*[A-Za-z])[A-Za-z0-9_-]{20,}", re.ASCII)


def shown_env(name: str, value: str) -> str:
    """An environment value of a stdio server as records show it (:data:`PLAIN_ENV`)."""
    return value if name in PLAIN_ENV and not is_secret(name, value) else _REDACTED


def shown_header(name: str, value: str) -> str:
    """A header value of an HTTP or SSE server as records show it (:data:`PLAIN_HEADERS`)."""
    plain = name.lower() in PLAIN_HEADERS and not is_secret(name, value)
    return value if plain else _REDACTED


def _shown_path(path: str) -> str:
    """A URL's path with every path parameter (``;...``) and token-like segment redacted."""
    segments = []
    for segment in path.split("/"):
        word, semicolon, _params = segment.partition(";")
        if _TOKEN_SEGMENT.fullmatch(word):
            word = _REDACTED
        segments.append(f"{word};{_REDACTED}" if semicolon else word)
    return "/".join(segments)


def shown_url(url: str) -> str:
    """A server's URL as records show it: its credentials, path parameters (``;...``),
    token-like path segments, every query value and its fragment redacted."""
    url = _URL_USERINFO.sub(rf"\1{_REDACTED}@", url)
    url = _URL_PATH.sub(lambda m: m.group(1) + _shown_path(m.group(2)), url, count=1)
    url, hash_, fragment = url.partition("#")
    base, question, query = url.partition("?")
    if question:
        pairs = [
            f"{key}={_REDACTED}" if sep else key
            for key, sep, _value in (part.partition("=") for part in query.split("&"))
        ]
        base += "?" + "&".join(pairs)
    return f"{base}{hash_}{_REDACTED if fragment else ''}"


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
                self._check_setting(what, key, value)
        if self.kind == "stdio":
            if not self.command or not all(isinstance(a, str) for a in self.command):
                raise UsageError(f"MCP server {self.name!r}: a stdio server needs a command")
            if not self.command[0] or self.url or self.headers:
                raise UsageError(
                    f"MCP server {self.name!r}: a stdio server has a command and env,"
                    " not a url or headers"
                )
            if any("\0" in arg for arg in self.command):
                raise UsageError(f"MCP server {self.name!r}: its command holds a NUL byte")
        else:
            self._check_url()
            if self.command or self.env:
                raise UsageError(
                    f"MCP server {self.name!r}: an {self.kind} server has a url and headers,"
                    " not a command or env"
                )

    def _check_setting(self, what: str, key: str, value: str) -> None:
        """A header (an HTTP token, a value without line breaks) or a variable (a name an
        environment can hold: no ``=``, NUL or white space; a value without NUL)."""
        if what == "headers":
            if not _TOKEN.fullmatch(key):
                raise UsageError(
                    f"MCP server {self.name!r}: header name {key!r} is not an HTTP token"
                    " (letters, digits and !#$%&'*+.^_`|~-)"
                )
            if _CONTROL.search(value):
                raise UsageError(
                    f"MCP server {self.name!r}: the value of header {key!r} holds a line break"
                    " or another control character"
                )
        else:
            if "=" in key or re.search(r"[\s\x00]", key):
                raise UsageError(
                    f"MCP server {self.name!r}: variable name {key!r} holds '=', NUL or white space"
                )
            if "\0" in value:
                raise UsageError(
                    f"MCP server {self.name!r}: the value of variable {key!r} holds a NUL byte"
                )

    def _check_url(self) -> None:
        """An http(s) URL with a host that parses, without white space or control
        characters."""
        bad = UsageError(
            f"MCP server {self.name!r}: an {self.kind} server needs an http:// or https://"
            f" url, got {self.url!r}"
        )
        if not isinstance(self.url, str) or re.search(r"[\s\x00-\x1f\x7f]", self.url):
            raise bad
        try:
            parts = urllib.parse.urlsplit(self.url)
            parts.port  # noqa: B018 (a bad port raises here)
        except ValueError as e:
            raise UsageError(f"MCP server {self.name!r}: url {self.url!r}: {e}") from None
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise bad

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
        a relative path against ``base``, a bare name through ``PATH``; and
        relative arguments that name files under ``base`` made absolute, as an agent's are
        (:func:`orchestrator.agents.resolve_argv`): the agent starts it in its own directory.
        A program that is not there (not on ``PATH``, no executable file) is a
        :class:`~orchestrator.errors.UsageError`."""
        if self.kind != "stdio":
            return self
        from .agents import resolve_argv  # the agents' rule; that module imports this one

        root = os.path.abspath(os.fspath(base))
        argv = list(resolve_argv(self.command, root))
        if not os.path.isabs(argv[0]) and "/" not in argv[0]:
            found = shutil.which(argv[0])
            if found is None:
                raise UsageError(f"MCP server {self.name!r}: program {argv[0]!r} is not on PATH")
            argv[0] = os.path.abspath(found)
        argv[0] = os.path.join(root, argv[0])  # an absolute path stays as it is
        if not (os.path.isfile(argv[0]) and os.access(argv[0], os.X_OK)):
            # the agent would fail to start it, late and in its own words
            raise UsageError(
                f"MCP server {self.name!r}: program {self.command[0]!r} is no executable file"
                f" ({argv[0]})"
            )
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

        With ``redact`` (the default), every value of ``env`` but :data:`PLAIN_ENV`'s, of
        ``headers`` but :data:`PLAIN_HEADERS`', and a URL's credentials, path parameters,
        token-like path segments, query values and fragment (:func:`shown_url`) are replaced
        by ``"<redacted>"``: this is what run records, ``--json`` and reports show.
        """
        out: dict[str, Any] = {"name": self.name, "type": self.kind}
        if self.kind == "stdio":
            env = {k: shown_env(k, v) if redact else v for k, v in self.env.items()}
            out |= {"command": list(self.command), "env": env}
        else:
            headers = {k: shown_header(k, v) if redact else v for k, v in self.headers.items()}
            out |= {"url": shown_url(self.url) if redact else self.url, "headers": headers}
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
        for key, shown in (("env", shown_env), ("headers", shown_header)):
            for pair in server.get(key) or ():
                if not isinstance(pair, dict):
                    continue
                value = str(pair.get("value", ""))
                redacted = shown(str(pair.get("name", "")), value)
                if redacted != value:
                    pair["value"] = redacted
                    changed = True
        url = server.get("url")
        if isinstance(url, str) and shown_url(url) != url:
            server["url"] = shown_url(url)
            changed = True
    return orjson.dumps(message) if changed else frame
