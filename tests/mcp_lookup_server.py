"""A tiny MCP server on stdio (the ``mcp`` package's ``MCPServer``), for the agents' MCP tests.

Its one tool, ``lookup``, answers with a word no model could guess, and the value of
``LOOKUP_TOKEN`` from its environment reversed: so a tool result that reaches the model proves
the agent started this server with the environment the orchestrator gave it, while the token
itself appears nowhere but in that environment.
"""

from __future__ import annotations

import os

from mcp.server.mcpserver import MCPServer

#: what ``lookup`` answers, before the key and the token
ANSWER = "MCP-LOOKUP-ANSWER-7319"

server = MCPServer("lookup")


@server.tool()
def lookup(key: str) -> str:
    """Look ``key`` up in the project's registry."""
    return f"{ANSWER} key={key} token={os.environ.get('LOOKUP_TOKEN', 'unset')[::-1]}"


if __name__ == "__main__":
    server.run("stdio")
