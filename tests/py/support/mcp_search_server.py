"""A real MCP server over stdio (the Python `mcp` SDK) with one tool, `search`; each
execution appends a line to the file named by $FUSEBOX_TEST_TOOL_LOG."""

from __future__ import annotations

import os
from typing import Any

from mcp.server.mcpserver import MCPServer

server = MCPServer("search")


@server.tool()
def search(query: str) -> dict[str, Any]:
    """Search the web."""
    with open(os.environ["FUSEBOX_TEST_TOOL_LOG"], "a") as log:
        log.write(query + "\n")
    return {"hits": ["jma.go.jp"], "query": query}


if __name__ == "__main__":
    server.run("stdio")
