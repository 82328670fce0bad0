"""An MCP server written for the gateway's tests (Python `mcp` SDK, stdio or HTTP).

Every tool execution appends one JSON line to $COUNT_FILE, so a test can tell which
calls really ran upstream and which the gateway refused.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import ToolAnnotations

server = MCPServer(
    "counting-server",
    instructions="Test server: counts every tool execution.",
    version="1.0.0",
)

READ = ToolAnnotations(read_only_hint=True)
WRITE = ToolAnnotations(read_only_hint=False, destructive_hint=True)


def executed(tool: str, **args: object) -> None:
    path = os.environ.get("COUNT_FILE")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"tool": tool, "args": args}) + "\n")


@server.tool(annotations=READ)
def search(query: str) -> str:
    """Searches and never finds anything: a runaway agent asks again and again."""
    executed("search", query=query)
    return f"no results for {query!r}"


@server.tool(annotations=READ)
def list_page(page: int) -> str:
    """One page of a 5-page listing: every page is new, so listing them is progress."""
    executed("list_page", page=page)
    items = [f"item-{page * 10 + i}" for i in range(10)]
    more = "next page: " + str(page + 1) if page < 4 else "last page"
    return "\n".join([*items, more])


@server.tool(annotations=WRITE)
def send_email(message_id: str, to: str, body: str) -> str:
    """Sends an email (counted): the same message_id must go out once."""
    executed("send_email", message_id=message_id, to=to)
    return f"sent {message_id} to {to}"


@server.tool(annotations=WRITE)
def export_report(report_id: str, rows: int) -> str:
    """Exports a report (counted) of `rows` numbered lines: a result as large as asked."""
    executed("export_report", report_id=report_id, rows=rows)
    return "\n".join(f"{report_id} row {n:06d}" for n in range(rows))


@server.tool(annotations=READ)
async def slow(steps: int, ctx: Context) -> str:
    """Reports progress `steps` times, 50 ms apart."""
    executed("slow", steps=steps)
    for step in range(1, steps + 1):
        await ctx.report_progress(step, steps, f"step {step}")
        await asyncio.sleep(0.05)
    return f"done after {steps} steps"


@server.tool(annotations=READ)
def fail(reason: str) -> str:
    """Always fails: its result has isError set."""
    executed("fail", reason=reason)
    raise ValueError(f"failed on purpose: {reason}")


@server.tool(annotations=READ)
def garble() -> str:
    """Writes a line that is not JSON-RPC onto the protocol stream, then answers."""
    executed("garble")
    sys.stdout.write("this is not a JSON-RPC message\n")
    sys.stdout.flush()
    return "answered after the garbage"


@server.tool(annotations=READ)
async def hang() -> str:
    """Never answers."""
    executed("hang")
    await asyncio.sleep(3600)
    return "unreachable"


@server.tool()
def crash() -> str:
    """Kills this server mid-call."""
    executed("crash")
    sys.stdout.flush()
    os._exit(3)


@server.resource("memo://readme", mime_type="text/plain")
def readme() -> str:
    """A static resource."""
    return "read me"


@server.resource("memo://notes/{name}")
def note(name: str) -> str:
    """A templated resource."""
    return f"note {name}"


@server.prompt()
def greet(name: str) -> str:
    """A prompt with one argument."""
    return f"Say hello to {name}."


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--http":
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run()
