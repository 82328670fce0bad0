"""Claude Code's own transcripts as an event source (`--from claude-code`, docs/history.md):
the real Claude Code (the CLI bundled in claude-agent-sdk) runs offline against the
scripted model API with `fusebox hook claude-code` in front of a real fuseboxd; then the
transcripts that same run wrote under its HOME are imported by `fusebox replay --from
claude-code` and `fusebox whatif --from claude-code`, with no daemon.

The import must give every call and result the decision the live, hook-gated run got:
the same events (the hook's own mapping), so the same decisions. The live decisions are
read back from the daemon's log.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.claude_code import fusebox, run_claude
from support.fake_anthropic import FakeAnthropic, Turn, text, tool_use
from support.guard import RUNAWAY_EXECUTIONS, TENANT
from support.history import Decision, applied_by_id, by_id, replay_from
from support.stack import Stack


def hook_settings(stack: Stack) -> dict[str, Any]:
    """The README's setup step: the block `--print-settings` prints."""
    printed = fusebox(stack, "hook", "claude-code", "--print-settings", "--tenant", TENANT)
    settings: dict[str, Any] = json.loads(printed)
    return settings


class Home:
    """One HOME for several sessions, as a user's is, and the execution count."""

    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.cwd = root / "work"
        self.home.mkdir()
        self.cwd.mkdir()
        self.ledger = root / "executed.txt"

    def bash(self, command: str) -> Turn:
        return tool_use("Bash", {"command": f"echo x >> {self.ledger}; {command}"})

    @property
    def projects(self) -> Path:
        return self.home / ".claude" / "projects"


def runaway(home: Home) -> FakeAnthropic:
    """The same status check forever: warned, blocked, stopped."""
    return FakeAnthropic(forever=home.bash("cat status.txt || echo running"))


def legitimate(home: Home) -> FakeAnthropic:
    """Distinct commands, one failing once, then an answer: nothing refused."""
    return FakeAnthropic(
        [
            home.bash("echo one"),
            home.bash("ls"),
            home.bash("false"),
            home.bash("echo two > out.txt"),
            home.bash("cat out.txt"),
            text("done"),
        ]
    )


#: The gate decisions under which a call runs.
RAN = ("execute", "warn")


def live_decisions(stack: Stack, run: str) -> dict[str, Decision]:
    """Each tool_call's and tool_result's decision as the daemon applied it, by event id."""
    return applied_by_id(stack, TENANT, run)


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home(tmp_path)


def test_imported_transcripts_get_the_decisions_the_hook_gated_runs_got(
    stack: Stack, home: Home
) -> None:
    settings = hook_settings(stack)
    sessions = []
    for scenario in (runaway, legitimate):
        with scenario(home) as api:
            result = run_claude(api, "do the task", home=home.home, cwd=home.cwd, settings=settings)
            sessions.append(result.result()["session_id"])
    runaway_run, legit_run = sessions
    live = {run: live_decisions(stack, run) for run in sessions}
    # The live runs are what the scenarios say: the runaway refused and stopped, the
    # legitimate session refused nothing.
    assert ("stop", "consecutive_blocks") in live[runaway_run].values(), live[runaway_run]
    assert sum(1 for a, _ in live[runaway_run].values() if a in RAN) == RUNAWAY_EXECUTIONS
    assert all(a not in ("block", "stop") for a, _ in live[legit_run].values()), live[legit_run]
    assert sum(1 for a, _ in live[legit_run].values() if a in RAN) == 5

    imported = imported_decisions(stack, home.projects)
    assert imported == live


def test_whatif_over_the_transcripts_names_the_runaway_and_spares_the_good_session(
    stack: Stack, home: Home
) -> None:
    settings = hook_settings(stack)
    sessions = []
    for scenario in (legitimate, runaway):
        with scenario(home) as api:
            result = run_claude(api, "do the task", home=home.home, cwd=home.cwd, settings=settings)
            sessions.append(result.result()["session_id"])
    legit_run, runaway_run = sessions
    # The candidate, the strict preset, gives up on a repeat sooner than the balanced
    # baseline: the runaway is stopped earlier, the legitimate session not at all.
    done = subprocess.run(
        [
            str(stack.bin("fusebox")),
            "whatif",
            "--from",
            "claude-code",
            "--tenant",
            TENANT,
            "--preset",
            "strict",
            "--json",
            str(home.projects),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    report = json.loads(done.stdout)
    assert report["source"].startswith("claude-code sessions in "), report["source"]
    assert "2 sessions in 2 files" in report["source"], report["source"]
    changed = {change["run"]: change for change in report["changes"]}
    assert legit_run not in changed and set(changed) == {runaway_run}, report["changes"]
    assert changed[runaway_run]["kind"] == "stops_earlier", changed

    # tune calibrates on the same import: the legitimate session is its completed run,
    # the runaway its runaway.
    args = ["tune", "--from", "claude-code", "--tenant", TENANT, str(home.projects)]
    tuned = subprocess.run(
        [str(stack.bin("fusebox")), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert tuned.returncode in (0, 1), tuned.stderr
    assert tuned.stdout.startswith("# fusebox tune: calibrated on claude-code sessions in ")
    assert "# 1 completed runs, 1 runaways." in tuned.stdout, tuned.stdout[:2000]
    assert changed[runaway_run]["agent"] == "claude-code", changed


SUB_PROMPT = "SUB-AGENT: look around the repository"


def test_a_sub_agents_transcript_is_its_own_child_run_as_live(stack: Stack, home: Home) -> None:
    # The main agent delegates to a sub-agent that runs one command for ever: live, the
    # guard stops the sub-agent's run alone and warns the main agent at its next call.
    # Imported, the sub-agent's transcript (<session>/subagents/agent-<id>.jsonl) goes
    # between the Agent call and its result, in the child run, as its hooks did.
    def respond(body: dict[str, Any]) -> Turn:
        if SUB_PROMPT in json.dumps(body["messages"][:1]):
            return home.bash("cat status.txt || echo running")
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        delegate = tool_use(
            "Agent",
            {
                "description": "Look around",
                "prompt": SUB_PROMPT,
                "subagent_type": "general-purpose",
                "run_in_background": False,
            },
        )
        return [delegate, home.bash("echo main"), text("done")][min(turn, 2)]

    with FakeAnthropic(respond=respond) as api:
        result = run_claude(
            api,
            "do the task",
            home=home.home,
            cwd=home.cwd,
            settings=hook_settings(stack),
            allowed_tools=("Bash", "Agent"),
        ).result()
    session = result["session_id"]
    imported = imported_decisions(stack, home.projects, sessions=1)
    [child] = [run for run in imported if run != session]
    assert child.startswith(f"{session}-"), imported
    live = {run: live_decisions(stack, run) for run in (session, child)}
    assert ("stop", "consecutive_blocks") in live[child].values(), live[child]
    assert "warn" in [a for a, _ in live[session].values()], live[session]
    assert imported == live


def imported_decisions(
    stack: Stack, projects: Path, sessions: int = 2
) -> dict[str, dict[str, Decision]]:
    """`fusebox replay --from claude-code PROJECTS`: each call's and result's decision,
    by run and event id; the person's summary first on stderr."""
    summary = f"claude-code: {sessions} sessions in {sessions} files"
    return by_id(replay_from(stack, "claude-code", TENANT, projects, summary=summary))
