"""A tiny MCP server on stdio (the ``mcp`` package's ``MCPServer``), for the agents' MCP tests.

Its one tool, ``lookup``, answers with a word no model could guess, and the value of
``LOOKUP_TOKEN`` from its environment reversed: so a tool result that reaches the model proves
the agent started this server with the environment the orchestrator gave it, while the token
itself appears nowhere but in that environment.

``python mcp_lookup_server.py`` serves MCP on stdio; ``--http-fd FD`` serves streamable HTTP
(at ``/mcp``) on the listening socket ``FD`` the caller bound (so it takes connections from the
start), answering 401 to a request without the header ``X-Lookup-Key: $LOOKUP_KEY``.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from mcp.server.mcpserver import MCPServer

#: what ``lookup`` answers, before the key and the token
ANSWER = "MCP-LOOKUP-ANSWER-7319"

server = MCPServer("lookup")


@server.tool()
def lookup(key: str) -> str:
    """Look ``key`` up in the project's registry."""
    return f"{ANSWER} key={key} token={os.environ.get('LOOKUP_TOKEN', 'unset')[::-1]}"


def serve_http(fd: int) -> None:
    """Streamable HTTP on the listening socket ``fd``, behind the header check."""
    import uvicorn

    app = server.streamable_http_app(host="127.0.0.1")
    expected = os.environ["LOOKUP_KEY"].encode()

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"x-lookup-key") != expected:
            await send({"type": "http.response.start", "status": 401, "headers": []})
            await send({"type": "http.response.body", "body": b"missing X-Lookup-Key"})
            return
        await app(scope, receive, send)

    uvicorn.run(guarded, fd=fd, log_level="warning")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http-fd"]:
        serve_http(int(sys.argv[2]))
    else:
        server.run("stdio")
