"""A real Claude Code (the CLI bundled in the claude-agent-sdk wheel, print mode, offline
against the scripted model-API stand-in) with its MCP server wrapped in `fusebox mcp`
exactly as the README's "Any MCP agent" section says."""

from __future__ import annotations

import json
import pathlib
from typing import Any

from gateway import TENANT, counting_server, executions, fusebox_bin
from support.claude_code import run_claude
from support.fake_anthropic import FakeAnthropic, Turn, text, tool_use
from support.stack import Stack

SERVER = "counting"
STOPPED = "fusebox stopped this run"


def mcp_config(stack: Stack, count_file: pathlib.Path, path: pathlib.Path) -> pathlib.Path:
    """The README's `mcpServers` entry: the server's own command after `fusebox mcp … --`."""
    config = {
        "mcpServers": {
            SERVER: {
                "command": fusebox_bin(stack),
                "args": ["mcp", "--tenant", TENANT, "--", *counting_server()],
                "env": {
                    "FUSEBOX_NATS_URL": stack.nats_url,
                    "COUNT_FILE": str(count_file),
                },
            }
        }
    }
    path.write_text(json.dumps(config))
    return path


def last_tool_result(body: dict[str, Any]) -> str:
    """What the model read last: the text of the newest tool_result in the history."""
    for message in reversed(body.get("messages", [])):
        content = message.get("content")
        if message.get("role") != "user" or not isinstance(content, list):
            continue
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                inner = block.get("content")
                if isinstance(inner, list):
                    return "\n".join(str(p.get("text", "")) for p in inner if isinstance(p, dict))
                return str(inner)
    return ""


def test_a_runaway_mcp_loop_in_claude_code_is_stopped(stack: Stack, tmp_path: pathlib.Path) -> None:
    count_file = tmp_path / "executions.jsonl"
    work = tmp_path / "work"
    work.mkdir()

    # A model stuck on one search, that gives up only when a tool result says the run
    # is over (and at --max-turns otherwise).
    def model(body: dict[str, Any]) -> Turn:
        if STOPPED in last_tool_result(body):
            return text("The guard stopped this run; giving up.")
        return tool_use(f"mcp__{SERVER}__search", {"query": "the same thing"})

    with FakeAnthropic(respond=model) as api:
        run = run_claude(
            api,
            "find the thing",
            home=tmp_path / "home",
            cwd=work,
            allowed_tools=[f"mcp__{SERVER}__search"],
            extra_args=[
                "--mcp-config",
                str(mcp_config(stack, count_file, tmp_path / "mcp.json")),
                "--max-turns",
                "40",
            ],
        )
        results = api.tool_results()
    result = run.result()
    assert result.get("subtype") == "success", result
    assert results and STOPPED in results[-1].content, [r.content for r in results]
    assert results[-1].is_error
    # The warning before the block reaches the model (Claude Code shows it the
    # structuredContent, where the gateway puts it too).
    assert any("fusebox warning" in r.content and not r.is_error for r in results)
    ran = executions(count_file, "search")
    assert 0 < len(ran) < len(results), "refused calls never reached the server"
    assert "giving up" in str(result.get("result"))


def test_a_legitimate_mcp_sequence_in_claude_code_is_untouched(
    stack: Stack, tmp_path: pathlib.Path
) -> None:
    count_file = tmp_path / "executions.jsonl"
    work = tmp_path / "work"
    work.mkdir()
    script = [tool_use(f"mcp__{SERVER}__list_page", {"page": page}) for page in range(5)] + [
        text("listed")
    ]
    with FakeAnthropic(script) as api:
        run = run_claude(
            api,
            "list everything",
            home=tmp_path / "home",
            cwd=work,
            allowed_tools=[f"mcp__{SERVER}__list_page"],
            extra_args=[
                "--mcp-config",
                str(mcp_config(stack, count_file, tmp_path / "mcp.json")),
            ],
        )
        results = api.tool_results()
    assert run.result().get("subtype") == "success"
    assert [r.is_error for r in results] == [False] * 5
    assert all("fusebox" not in r.content for r in results)
    assert [e["args"]["page"] for e in executions(count_file, "list_page")] == [
        0,
        1,
        2,
        3,
        4,
    ]
