"""Running the real GitHub Copilot CLI (`@github/copilot`, pinned in tests/npm) offline:
BYOK mode (`COPILOT_PROVIDER_BASE_URL`: no GitHub account, no Copilot service) against
the scripted chat-completions API of :mod:`fake_chat_completions`, with the hooks file
`fusebox hook copilot-cli --print-config` printed and saved where
docs/agents/copilot-cli.md tells a user to (``.github/hooks/fusebox.json``).
"""

from __future__ import annotations

import json
import subprocess

from support.coding_agents import NPM_BIN, AgentRun, Workspace
from support.fake_chat_completions import FakeChatCompletions
from support.stack import Stack

__all__ = ["copilot", "printed_hooks"]


def printed_hooks(stack: Stack, nats_url: str, tenant: str, *flags: str) -> str:
    """The setup step: the hooks file `fusebox hook copilot-cli --print-config` prints."""
    printed = subprocess.run(
        [
            str(stack.bin("fusebox")),
            "hook",
            "copilot-cli",
            "--print-config",
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


def copilot(
    ws: Workspace,
    api: FakeChatCompletions,
    hooks: str,
    timeout_s: float = 180,
    resume: str | None = None,
) -> AgentRun:
    """`copilot -p … --allow-all-tools --trust-folder` in a git repository holding the
    printed hooks file, with the provider at `api`. `resume`: the session to go on with
    (`--resume=<id>`)."""
    if not (ws.cwd / ".git").exists():
        subprocess.run(["git", "init", "-q"], cwd=ws.cwd, check=True, timeout=30)
    (ws.cwd / ".github" / "hooks").mkdir(parents=True, exist_ok=True)
    (ws.cwd / ".github" / "hooks" / "fusebox.json").write_text(hooks)
    env = {
        "COPILOT_PROVIDER_BASE_URL": f"{api.base_url}/v1",
        "COPILOT_PROVIDER_API_KEY": "fake-key-for-tests",
        "COPILOT_MODEL": "gpt-4.1",
    }
    args = [str(NPM_BIN / "copilot"), "-p", "do the task", "--allow-all-tools"]
    args += ["--disable-client-telemetry"]
    if resume:
        # `--resume` refuses `--trust-folder` (1.0.102), and an untrusted repository's
        # hooks do not run: the user-level settings carry the same hooks.
        settings = ws.home / ".copilot" / "settings.json"
        settings.parent.mkdir(parents=True, exist_ok=True)
        settings.write_text(json.dumps({"hooks": json.loads(hooks)["hooks"]}))
        args += [f"--resume={resume}"]
    else:
        args += ["--trust-folder"]
    return ws._run(args, env, timeout_s)
