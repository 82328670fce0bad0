"""Running the real OpenCode (`opencode-ai`, pinned in tests/npm) offline against the
scripted chat-completions API of :mod:`fake_chat_completions`, with the fusebox plugin
`fusebox hook opencode --print-plugin` printed and saved where docs/agents/opencode.md
tells a user to (``~/.config/opencode/plugin/``).

The workspace is :class:`support.coding_agents.Workspace`: every scripted command
appends a line to its ledger first, so the ledger counts the executions.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from support.coding_agents import NPM_BIN, AgentRun, Workspace
from support.fake_chat_completions import FakeChatCompletions
from support.stack import Stack

__all__ = ["opencode", "printed_plugin", "session_ids"]


def printed_plugin(stack: Stack, nats_url: str, tenant: str, *flags: str) -> str:
    """The setup step: the plugin `fusebox hook opencode --print-plugin` prints."""
    printed = subprocess.run(
        [
            str(stack.bin("fusebox")),
            "hook",
            "opencode",
            "--print-plugin",
            "--nats-url",
            nats_url,
            "--tenant",
            tenant,
            *flags,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    return printed.stdout


def opencode(
    ws: Workspace,
    api: FakeChatCompletions,
    plugin: str,
    timeout_s: float = 180,
    session: str | None = None,
) -> AgentRun:
    """`opencode run --format json` with the plugin saved in the user's plugin
    directory and a custom OpenAI-compatible provider at `api` (OpenCode's bundled
    `@ai-sdk/openai-compatible`: nothing is downloaded), every permission allowed, the
    models list not fetched. `session`: the session to go on with (`--session`)."""
    config_dir = ws.home / ".config" / "opencode"
    (config_dir / "plugin").mkdir(parents=True, exist_ok=True)
    (config_dir / "plugin" / "fusebox.js").write_text(plugin)
    config: dict[str, Any] = {
        "provider": {
            "fake": {
                "npm": "@ai-sdk/openai-compatible",
                "name": "fake",
                "options": {"baseURL": f"{api.base_url}/v1", "apiKey": "fake-key-for-tests"},
                "models": {"fake-model": {"name": "fake-model", "tool_call": True}},
            }
        },
        "model": "fake/fake-model",
        "autoupdate": False,
        "share": "disabled",
        "permission": {"*": "allow"},
    }
    (config_dir / "opencode.json").write_text(json.dumps(config))
    env = {
        "OPENCODE_DISABLE_MODELS_FETCH": "1",
        "OPENCODE_DISABLE_AUTOUPDATE": "1",
        "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
        "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
    }
    args = [str(NPM_BIN / "opencode"), "run", "--format", "json"]
    args += ["--session", session] if session else []
    return ws._run([*args, "do the task"], env, timeout_s)


def session_ids(run: AgentRun) -> list[str]:
    """The sessions `--format json` reported events of, in order of first sight."""
    seen: list[str] = []
    for line in run.stdout.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        session = event.get("sessionID") if isinstance(event, dict) else None
        if isinstance(session, str) and session not in seen:
            seen.append(session)
    return seen
