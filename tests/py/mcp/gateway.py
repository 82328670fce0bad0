"""Helpers of the gateway suite: command lines, sessions, what a result says."""

from __future__ import annotations

import functools
import json
import os
import pathlib
import shutil
import sys
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any, TextIO

from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent
from support.stack import Stack

ROOT = pathlib.Path(__file__).resolve().parents[3]
COUNTING_SERVER = pathlib.Path(__file__).with_name("counting_server.py")
FILESYSTEM_SERVER = (
    ROOT / "tests/npm/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
)
TENANT = "mcp-tests"


def fusebox_bin(stack: Stack) -> str:
    return str(stack.bin("fusebox"))


def counting_server() -> list[str]:
    return [sys.executable, str(COUNTING_SERVER)]


def filesystem_server(root: pathlib.Path) -> list[str]:
    node = shutil.which("node")
    assert node, "node is needed for the stock npm MCP server"
    assert FILESYSTEM_SERVER.exists(), "run scripts/setup.sh (npm ci in tests/npm)"
    return [node, str(FILESYSTEM_SERVER), str(root)]


def fresh_run() -> str:
    return f"mcp-test-{uuid.uuid4().hex[:12]}"


def gateway(
    stack: Stack,
    upstream: Sequence[str],
    *flags: str,
    nats_url: str | None = None,
    env: Mapping[str, str] | None = None,
) -> StdioServerParameters:
    """`fusebox mcp … -- UPSTREAM`, as an MCP client starts it (stdio)."""
    args = [
        "mcp",
        "--nats-url",
        nats_url or stack.nats_url,
        "--tenant",
        TENANT,
        *flags,
        "--",
        *upstream,
    ]
    return StdioServerParameters(command=fusebox_bin(stack), args=args, env=dict(env or {}))


def direct(upstream: Sequence[str], env: Mapping[str, str] | None = None) -> StdioServerParameters:
    return StdioServerParameters(command=upstream[0], args=list(upstream[1:]), env=dict(env or {}))


@functools.cache
def server_log() -> TextIO:
    """Where the servers' stderr goes: the test's stderr with FUSEBOX_TEST_VERBOSE=1."""
    if os.environ.get("FUSEBOX_TEST_VERBOSE"):
        return sys.stderr
    return open(os.devnull, "w")


@asynccontextmanager
async def session(params: StdioServerParameters, **kwargs: Any) -> AsyncIterator[ClientSession]:
    """An initialized client session with the server `params` starts."""
    async with (
        stdio_client(params, errlog=server_log()) as (read, write),
        ClientSession(read, write, **kwargs) as client,
    ):
        await client.initialize()
        yield client


def text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def executions(count_file: pathlib.Path, tool: str | None = None) -> list[dict[str, Any]]:
    """The tool executions the counting server recorded."""
    if not count_file.exists():
        return []
    lines = [json.loads(line) for line in count_file.read_text().splitlines() if line]
    return [line for line in lines if tool is None or line["tool"] == tool]
