"""Fixtures of the MCP gateway suite: the gateway (`fusebox mcp`) in front of a real MCP
server, driven by the Python `mcp` SDK's client, against the session's fuseboxd."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
