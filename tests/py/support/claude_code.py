"""Running the real Claude Code CLI offline, against :class:`FakeAnthropic`.

The CLI is the one bundled in the ``claude-agent-sdk`` wheel (pinned in
tests/py/requirements.txt), so the Python tests and the Agent SDK adapter drive the
same binary.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from support.fake_anthropic import FakeAnthropic
from support.stack import Stack

__all__ = ["ClaudeRun", "claude_binary", "fusebox", "run_claude", "run_claude_session"]


def claude_binary() -> Path:
    """The Claude Code CLI inside the installed ``claude-agent-sdk`` wheel."""
    import claude_agent_sdk

    path = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    if not path.is_file():
        raise FileNotFoundError(
            f"{path}: the claude-agent-sdk wheel has no bundled CLI; "
            "run scripts/setup.sh (it installs tests/py/requirements.txt)"
        )
    return path


@dataclass(frozen=True)
class ClaudeRun:
    """A finished ``claude -p`` process."""

    returncode: int
    stdout: str
    stderr: str

    def result(self) -> dict[str, Any]:
        """The ``--output-format json`` result object (raises when there is none)."""
        for line in reversed(self.stdout.splitlines()):
            line = line.strip()
            if line.startswith("{"):
                parsed = json.loads(line)
                if isinstance(parsed, dict) and parsed.get("type") == "result":
                    return parsed
        raise AssertionError(
            f"no result object from claude (exit {self.returncode}):\n"
            f"stdout: {self.stdout[-2000:]}\nstderr: {self.stderr[-2000:]}"
        )


def run_claude(
    api: FakeAnthropic,
    prompt: str,
    *,
    home: Path,
    cwd: Path,
    settings: Mapping[str, Any] | None = None,
    allowed_tools: Sequence[str] = ("Bash",),
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    timeout_s: float = 120,
) -> ClaudeRun:
    """``claude -p PROMPT --output-format json`` against ``api``, offline.

    ``settings`` is passed with ``--settings`` (e.g. the hooks block the README tells a
    user to paste); ``env`` adds variables (e.g. ``FUSEBOX_NATS_URL``) to the offline
    environment of :meth:`FakeAnthropic.env`.
    """
    args = [str(claude_binary()), "-p", prompt, "--output-format", "json"]
    if allowed_tools:
        args += ["--allowedTools", ",".join(allowed_tools)]
    if settings is not None:
        args += ["--settings", json.dumps(settings)]
    args += list(extra_args)
    full_env = api.env(home, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    full_env.update(env or {})
    done = subprocess.run(
        args,
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        stdin=subprocess.DEVNULL,
    )
    return ClaudeRun(done.returncode, done.stdout, done.stderr)


def run_claude_session(
    api: FakeAnthropic,
    prompts: Sequence[str],
    *,
    home: Path,
    cwd: Path,
    settings: Mapping[str, Any],
    allowed_tools: Sequence[str] = ("Bash",),
) -> list[dict[str, Any]]:
    """One session of several prompts, as a user types them: ``claude -p --input-format
    stream-json``, each prompt sent once the answer to the one before has come (sent
    together, Claude Code takes a later one for a message queued into the same prompt).
    The result object of each prompt."""
    args = [
        str(claude_binary()),
        "-p",
        "--input-format",
        "stream-json",
        "--output-format",
        "stream-json",
        "--verbose",
        "--allowedTools",
        ",".join(allowed_tools),
        "--settings",
        json.dumps(settings),
    ]
    env = api.env(home, {"PATH": os.environ.get("PATH", "/usr/bin:/bin")})
    proc = subprocess.Popen(
        args,
        cwd=cwd,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stdin is not None and proc.stdout is not None
    results: list[dict[str, Any]] = []
    try:
        for prompt in prompts:
            message = {"type": "user", "message": {"role": "user", "content": prompt}}
            proc.stdin.write(json.dumps(message) + "\n")
            proc.stdin.flush()
            for line in proc.stdout:
                parsed = json.loads(line)
                if parsed.get("type") == "result":
                    results.append(parsed)
                    break
        proc.stdin.close()
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert len(results) == len(prompts), results
    return results


def fusebox(stack: Stack, *args: str) -> str:
    """`fusebox ARGS… --nats-url <the stack's>`, as an operator types it in another
    process; its stdout."""
    done = subprocess.run(
        [str(stack.bin("fusebox")), *args, "--nats-url", stack.nats_url],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"fusebox {' '.join(args)}: exit {done.returncode}: {done.stderr}")
    return done.stdout
