"""Running the real Codex CLI and Gemini CLI (tests/npm, pinned, installed by
scripts/setup.sh) offline against the scripted model APIs of :mod:`fake_model_api`,
with the hook block `fusebox hook <agent> --print-config/--print-settings` printed,
pasted where the docs tell a user to (docs/agents/).

Every shell command a test scripts appends a line to a file first, so the file counts
the executions: a refused call must leave no line.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.fake_model_api import FakeGemini, FakeResponses, Turn, shell
from support.stack import REPO, Stack

__all__ = ["AgentRun", "Workspace", "printed_block"]

NPM_BIN = REPO / "tests" / "npm" / "node_modules" / ".bin"


def printed_block(stack: Stack, agent: str, nats_url: str, tenant: str, *flags: str) -> str:
    """The README's setup step: the block `fusebox hook AGENT --print-…` prints."""
    option = "--print-config" if agent == "codex" else "--print-settings"
    printed = subprocess.run(
        [
            str(stack.bin("fusebox")),
            "hook",
            agent,
            option,
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


@dataclass(frozen=True)
class AgentRun:
    returncode: int
    stdout: str
    stderr: str


class Workspace:
    """A fresh HOME and working directory for one agent process, and the execution
    count. `cache`: an XDG cache directory shared between workspaces, for an agent that
    unpacks itself there on its first start (Copilot CLI: 235 MB each time)."""

    def __init__(self, root: Path, cache: Path | None = None) -> None:
        self.root = root
        self.cache = cache
        self.home = root / "home"
        self.cwd = root / "work"
        self.state = root / "fusebox-state"
        self.home.mkdir()
        self.cwd.mkdir()
        self.ledger = root / "executed.txt"

    def command(self, command: str) -> Turn:
        """A turn running `command` in the shell, counted before it runs."""
        return shell(f"echo x >> {self.ledger}; {command}")

    def executions(self) -> int:
        return len(self.ledger.read_text().splitlines()) if self.ledger.exists() else 0

    def _env(self, extra: dict[str, str]) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "XDG_STATE_HOME": str(self.state),
            "NO_PROXY": "127.0.0.1,localhost",
        }
        if self.cache is not None:
            env["XDG_CACHE_HOME"] = str(self.cache)
        env.update(extra)
        return env

    def _run(self, args: list[str], env: dict[str, str], timeout_s: float) -> AgentRun:
        done = subprocess.run(
            args,
            cwd=self.cwd,
            env=self._env(env),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        return AgentRun(done.returncode, done.stdout, done.stderr)

    # -- Codex ------------------------------------------------------------------------------

    def codex(
        self,
        api: FakeResponses,
        hooks_toml: str,
        timeout_s: float = 180,
        user_keys: str = "",
        resume: str | None = None,
    ) -> AgentRun:
        """`codex exec` with the printed hooks pasted into ~/.codex/config.toml and a
        custom Responses provider (and the user's own top-level `user_keys`); the hooks
        trusted for the test with the bypass flag (a user trusts them once,
        docs/agents/codex.md). `resume`: the session to go on with (`codex exec resume`)."""
        codex_home = self.home / ".codex"
        codex_home.mkdir(exist_ok=True)
        provider = f"""model = "gpt-5-codex"
model_provider = "fake"
approval_policy = "never"
sandbox_mode = "danger-full-access"
{user_keys}

[model_providers.fake]
name = "fake"
base_url = "{api.base_url}/v1"
wire_api = "responses"
env_key = "FAKE_API_KEY"

"""
        # Pasted after the user's own keys; Codex refuses to start on invalid TOML.
        (codex_home / "config.toml").write_text(provider + hooks_toml)
        args = [
            str(NPM_BIN / "codex"),
            "exec",
            "--skip-git-repo-check",
            "--dangerously-bypass-hook-trust",
            *(["resume", resume] if resume else []),
            "do the task",
        ]
        env = {"CODEX_HOME": str(codex_home), "FAKE_API_KEY": "fake-key-for-tests"}
        return self._run(args, env, timeout_s)

    def codex_session(self) -> str:
        """The one Codex session of this HOME (its rollout file is named after it)."""
        rollouts = list((self.home / ".codex" / "sessions").rglob("rollout-*.jsonl"))
        assert len(rollouts) == 1, rollouts
        return rollouts[0].stem[-36:]

    # -- Gemini CLI ---------------------------------------------------------------------------

    def gemini(
        self,
        api: FakeGemini,
        settings_json: str,
        timeout_s: float = 180,
        resume: bool = False,
        env: dict[str, str] | None = None,
    ) -> AgentRun:
        """`gemini -p … --yolo` with the printed hooks merged into the user-level
        ~/.gemini/settings.json (project-level hooks are skipped in untrusted folders).
        Its own loop detector is off, so what stops a loop is the guard. `resume`: go on
        with the latest session (`--resume latest`); `env`: more of its environment
        (`OTEL_EXPORTER_OTLP_HEADERS` …)."""
        settings: dict[str, Any] = json.loads(settings_json)
        settings["security"] = {"auth": {"selectedType": "gemini-api-key"}}
        settings["model"] = {"disableLoopDetection": True}
        gemini_dir = self.home / ".gemini"
        gemini_dir.mkdir(exist_ok=True)
        (gemini_dir / "settings.json").write_text(json.dumps(settings, indent=2))
        args = [
            str(NPM_BIN / "gemini"),
            "-p",
            "do the task",
            "--yolo",
            "--skip-trust",
            "-m",
            "gemini-2.5-flash",
            "-o",
            "json",
            *(["--resume", "latest"] if resume else []),
        ]
        extra = {"GEMINI_API_KEY": "fake-key-for-tests", "GOOGLE_GEMINI_BASE_URL": api.base_url}
        return self._run(args, {**extra, **(env or {})}, timeout_s)

    def gemini_run(self, tenant: str) -> str:
        """The run of the one Gemini CLI session of this workspace: the hook's call book
        is named after it."""
        # Gemini CLI may pass hooks a trimmed environment: XDG_STATE_HOME or HOME's.
        roots = [self.state, self.home / ".local" / "state"]
        books = [
            book
            for root in roots
            for book in (root / "fusebox" / "gemini-cli").glob(f"{tenant}.*.calls")
        ]
        assert len(books) == 1, books
        return books[0].name.removeprefix(f"{tenant}.").removesuffix(".calls")
