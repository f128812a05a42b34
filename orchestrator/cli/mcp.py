"""``--mcp-server``, ``--mcp-header`` and ``--mcp-env``: MCP servers for the agents of a run."""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ..config import Config
    from ..mcp import McpServer

__all__ = ["add_mcp_options", "mcp_servers"]

MCP_SERVER_HELP = (
    "an MCP server for the agents' sessions: NAME=COMMAND ARGS (stdio), NAME=https://URL "
    "(HTTP), NAME=sse+https://URL (SSE), or the NAME of a config's [mcp_servers.NAME]; "
    "repeatable"
)


def _setting(text: str) -> tuple[str, str, str]:
    """``SERVER:KEY=VALUE``, checked as argparse reads it (a bad one is a usage error)."""
    server, colon, rest = text.partition(":")
    key, equals, value = rest.partition("=")
    if not colon or not equals or not server.strip() or not key.strip():
        raise argparse.ArgumentTypeError(f"expected SERVER:NAME=VALUE, got {text!r}")
    return server.strip(), key.strip(), value


def _variable(text: str) -> tuple[str, str, str]:
    """``SERVER:VAR=VALUE``, or ``SERVER:VAR`` for the value of ``$VAR`` here (a secret then
    stays out of the command line, where other users' ``ps`` would see it)."""
    server, colon, rest = text.partition(":")
    if colon and "=" not in rest and server.strip() and rest.strip():
        name = rest.strip()
        value = os.environ.get(name)
        if value is None:
            raise argparse.ArgumentTypeError(f"{text!r}: ${name} is not set")
        return server.strip(), name, value
    try:
        return _setting(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(
            f"expected SERVER:VAR=VALUE or SERVER:VAR, got {text!r}"
        ) from None


def add_mcp_options(p: argparse.ArgumentParser) -> None:
    """Add ``--mcp-server``, ``--mcp-header`` and ``--mcp-env`` to a run command."""
    p.add_argument(
        "--mcp-server", action="append", default=[], metavar="SPEC", help=MCP_SERVER_HELP
    )
    p.add_argument(
        "--mcp-header",
        action="append",
        default=[],
        type=_setting,
        metavar="SERVER:HEADER=VALUE",
        help="an HTTP header for the HTTP or SSE server SERVER (its value is redacted in "
        "records and output, unless it is Accept, Accept-Language, Content-Type, User-Agent "
        "or MCP-Protocol-Version); repeatable",
    )
    p.add_argument(
        "--mcp-env",
        action="append",
        default=[],
        type=_variable,
        metavar="SERVER:VAR[=VALUE]",
        help="an environment variable for the stdio server SERVER (without =VALUE: its value "
        "here, which keeps a secret off the command line; values are redacted in records and "
        "output but for a few plain variables such as PATH or LOG_LEVEL, and resume reads "
        "them again from its environment); repeatable",
    )


def mcp_servers(args: argparse.Namespace, config: Config) -> list[McpServer]:
    """The servers the options give, headers and variables set; a bad one is a
    :class:`~orchestrator.errors.UsageError` naming what is wrong."""
    from ..errors import UsageError
    from ..mcp import merge_mcp_servers

    servers = {s.name: s for s in merge_mcp_servers(map(config.mcp_server, args.mcp_server))}
    for option, what, settings in (
        ("--mcp-header", "headers", args.mcp_header),
        ("--mcp-env", "env", args.mcp_env),
    ):
        for name, key, value in settings:
            server = servers.get(name)
            if server is None:
                given = ", ".join(servers) or "none"
                raise UsageError(f"{option} {name}:{key}: no --mcp-server {name} (given: {given})")
            servers[name] = server.with_settings(**{what: {key: value}})
    return list(servers.values())
