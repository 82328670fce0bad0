"""A real Claude Code (the CLI bundled in claude-agent-sdk 0.2.184) in print mode, offline
against the scripted model API stand-in, with `fusebox hook claude-code` installed
exactly as the README tells a user (`--print-settings`), in front of a real fuseboxd.

Every Bash command the model asks for appends a line to a file first, so the file
counts the executions: a refused call must leave no line. Each prompt of a session is a
`prompt` event of its run, read back from the daemon's log.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.claude_code import ClaudeRun, fusebox, run_claude, run_claude_session
from support.fake_anthropic import FakeAnthropic, Turn, text, tool_use
from support.guard import ENVELOPE, RUNAWAY_EXECUTIONS, TENANT, bare_nats, prompt_events
from support.stack import Stack

#: How a model words one command anew each time: Claude Code's Bash `description` is
#: prose for the user, left out of the call's identity (config/agents/claude-code.toml).
REWORDINGS = [
    "Run the test suite",
    "Re-run the tests to see the failure",
    "Try the tests once more",
    "Run the tests again after the last attempt",
    "Check whether the tests pass now",
    "One more run of the test suite",
    "Run the suite a final time",
]


def hook_settings(stack: Stack, nats_url: str, *flags: str) -> dict[str, Any]:
    """The README's setup step: the block `--print-settings` prints."""
    printed = subprocess.run(
        [
            str(stack.bin("fusebox")),
            "hook",
            "claude-code",
            "--print-settings",
            "--nats-url",
            nats_url,
            "--tenant",
            TENANT,
            *flags,
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    settings: dict[str, Any] = json.loads(printed.stdout)
    return settings


def run_status(stack: Stack, run: str) -> dict[str, Any]:
    status: dict[str, Any] = json.loads(fusebox(stack, "run", f"{TENANT}/{run}", "--json"))
    return status


class Workspace:
    """A fresh HOME (no user settings) and working directory, and the execution count."""

    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.cwd = root / "work"
        self.home.mkdir()
        self.cwd.mkdir()
        self.ledger = root / "executed.txt"

    def bash(self, command: str, description: str | None = None) -> Turn:
        """A turn calling Bash with `command` (and the model's `description` of it),
        counted before it runs."""
        args = {"command": f"echo x >> {self.ledger}; {command}"}
        if description is not None:
            args["description"] = description
        return tool_use("Bash", args)

    def executions(self) -> int:
        return len(self.ledger.read_text().splitlines()) if self.ledger.exists() else 0

    def claude(self, api: FakeAnthropic, settings: dict[str, Any], **kwargs: Any) -> ClaudeRun:
        return run_claude(
            api,
            "do the task",
            home=self.home,
            cwd=self.cwd,
            settings=settings,
            **kwargs,
        )

    def session(
        self, api: FakeAnthropic, settings: dict[str, Any], prompts: list[str], **kwargs: Any
    ) -> list[dict[str, Any]]:
        """One session of several prompts, each typed once the last is answered."""
        return run_claude_session(
            api, prompts, home=self.home, cwd=self.cwd, settings=settings, **kwargs
        )


@pytest.fixture
def ws(tmp_path: Path) -> Workspace:
    return Workspace(tmp_path)


def refused(api: FakeAnthropic) -> list[str]:
    return [r.content for r in api.tool_results() if "fusebox:" in r.content]


def test_runaway_bash_loop_is_stopped_and_the_session_ends(stack: Stack, ws: Workspace) -> None:
    settings = hook_settings(stack, stack.nats_url)
    with FakeAnthropic(forever=ws.bash("cat status.txt || echo running")) as api:
        run = ws.claude(api, settings)
        result = run.result()
        served = api.turns_served()
        context_seen = any(
            "hook additional context: fusebox:" in json.dumps(body)
            for body in api.message_requests()
        )
        denials = refused(api)

    # Stopped within the default bound: as many executions as the Rust demo's runaway.
    assert ws.executions() == RUNAWAY_EXECUTIONS
    # The stop ended the session: no turn after the refused calls.
    assert result["terminal_reason"] == "hook_stopped", result
    assert served == RUNAWAY_EXECUTIONS + len(result["permission_denials"])
    assert len(result["permission_denials"]) >= 1
    # The model read why (the warn before, the blocks' reasons).
    assert context_seen
    assert all("already ran" in d for d in denials), denials
    status = run_status(stack, result["session_id"])
    assert status["summary"]["open"] is False, status
    assert status["summary"]["agent"] == "claude-code", status


def test_a_failing_command_reworded_each_time_is_stopped(stack: Stack, ws: Workspace) -> None:
    # The same failing command again and again, its description worded anew each time.
    settings = hook_settings(stack, stack.nats_url)

    def respond(body: dict[str, Any]) -> Turn:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        return ws.bash("false", REWORDINGS[turn % len(REWORDINGS)])

    with FakeAnthropic(respond=respond) as api:
        result = ws.claude(api, settings).result()
        denials = refused(api)

    assert 0 < ws.executions() <= 5, ws.executions()
    assert result["terminal_reason"] == "hook_stopped", result
    # The model was told why its calls were refused.
    assert denials, api.tool_results()
    assert all("fusebox: Bash(" in d and "already ran" in d for d in denials), denials
    status = run_status(stack, result["session_id"])["summary"]
    assert status["open"] is False and status["steps"] == ws.executions(), status


def test_each_prompt_is_a_task_of_the_session(stack: Stack, ws: Workspace) -> None:
    # The same failing command twice per prompt. As one task its fourth run would be
    # refused (the third warned); the user's second prompt is new input, so all four run,
    # unremarked. Each prompt is a `prompt` event of the session's run, without its words.
    settings = hook_settings(stack, stack.nats_url)
    prompts = ["make the tests pass", "try again please"]
    script = [
        ws.bash("false", REWORDINGS[0]),
        ws.bash("false", REWORDINGS[1]),
        text("the tests still fail"),
        ws.bash("false", REWORDINGS[2]),
        ws.bash("false", REWORDINGS[3]),
        text("the tests fail again"),
    ]
    with FakeAnthropic(script) as api:
        results = ws.session(api, settings, prompts)
        outputs = api.tool_results()
        context_seen = any("fusebox" in json.dumps(body) for body in api.message_requests())

    assert [r["result"] for r in results] == ["the tests still fail", "the tests fail again"]
    assert ws.executions() == 4
    assert not any("fusebox" in r.content for r in outputs), outputs
    assert not context_seen
    session = results[0]["session_id"]
    events = prompt_events(stack, TENANT, session)
    assert len(events) == 2, events
    assert len({e["id"] for e in events}) == 2 and all(
        e["id"].startswith("cc-prompt-") for e in events
    ), events
    assert all(set(e) <= ENVELOPE for e in events), events
    assert not any(p in json.dumps(events) for p in prompts)


def test_a_background_tasks_completion_notice_is_not_a_prompt(
    stack: Stack, ws: Workspace, tmp_path: Path
) -> None:
    # A background sub-agent finishes after the main agent has answered: Claude Code
    # submits its completion notice as a prompt of its own, under a new prompt id. It
    # carries on the user's task, so the run has one prompt.
    seen = tmp_path / "prompts.jsonl"
    settings = hook_settings(stack, stack.nats_url)
    recorder = {"type": "command", "command": f"cat >> {seen}; echo >> {seen}"}
    settings["hooks"]["UserPromptSubmit"][0]["hooks"].append(recorder)

    def respond(body: dict[str, Any]) -> Turn:
        if "SUB-AGENT" in json.dumps(body["messages"][:1]):
            ran = "tool_result" in json.dumps(body["messages"])
            return text("looked around") if ran else ws.bash("sleep 2", "Look around")
        if any(m["role"] == "assistant" for m in body["messages"]):
            return text("the helper is done")
        task = {"description": "Look around", "prompt": "SUB-AGENT: look around"}
        return tool_use("Agent", {**task, "subagent_type": "general-purpose"})

    with FakeAnthropic(respond=respond) as api:
        result = ws.claude(api, settings, allowed_tools=("Bash", "Agent")).result()

    submitted = [json.loads(line) for line in seen.read_text().splitlines() if line.strip()]
    # The real binary did submit the notice, and under another prompt id.
    assert len(submitted) == 2, submitted
    assert submitted[1]["prompt"].startswith("<task-notification>"), submitted
    assert submitted[0]["prompt_id"] != submitted[1]["prompt_id"], submitted
    events = prompt_events(stack, TENANT, result["session_id"])
    assert [e["id"] for e in events] == [f"cc-prompt-{submitted[0]['prompt_id']}"], events


def test_legitimate_sequence_runs_untouched(stack: Stack, ws: Workspace) -> None:
    settings = hook_settings(stack, stack.nats_url)
    pages = [ws.bash(f"echo page {n}") for n in range(1, 13)]
    with FakeAnthropic([*pages, text("read all twelve pages")]) as api:
        result = ws.claude(api, settings).result()
        results = api.tool_results()

    assert ws.executions() == 12
    assert result["subtype"] == "success" and result["result"] == "read all twelve pages"
    assert result["permission_denials"] == []
    assert [r.content.split("\n")[0] for r in results] == [f"page {n}" for n in range(1, 13)]
    assert not any("fusebox" in r.content for r in results)
    status = run_status(stack, result["session_id"])
    assert status["summary"]["steps"] == 12, status
    # SessionEnd closed the run as completed.
    assert status["summary"]["open"] is False, status
    # The prompt reached the daemon: one task, named by its prompt id.
    [prompt] = prompt_events(stack, TENANT, result["session_id"])
    assert prompt["id"].startswith("cc-prompt-") and set(prompt) <= ENVELOPE, prompt


def test_a_sweep_of_greps_finding_nothing_runs_untouched(stack: Stack, ws: Workspace) -> None:
    # Fifteen different symbols, none present: each grep answers the same nothing, and
    # each is a call never made before — a sweep, not a loop (issue 30).
    settings = hook_settings(stack, stack.nats_url)
    greps = [ws.bash(f"grep -rn handle_event_{n} . || true") for n in range(15)]
    with FakeAnthropic([*greps, text("none of them is used")]) as api:
        result = ws.claude(api, settings).result()
        results = api.tool_results()

    assert ws.executions() == 15
    assert result["subtype"] == "success" and result["result"] == "none of them is used"
    assert result["permission_denials"] == []
    assert not any("fusebox" in r.content for r in results)
    status = run_status(stack, result["session_id"])
    assert status["summary"]["steps"] == 15, status


def test_operator_cancel_refuses_the_next_call_and_ends_the_session(
    stack: Stack, ws: Workspace
) -> None:
    settings = hook_settings(stack, stack.nats_url)

    def respond(body: dict[str, Any]) -> Turn:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if turn == 2:  # two commands ran: an operator cancels from another process
            fusebox(stack, "cancel", f"{TENANT}/{session_id(ws)}", "--reason", "wrong branch")
        return ws.bash(f"echo step {turn}")

    with FakeAnthropic(respond=respond) as api:
        result = ws.claude(api, settings).result()
        denials = refused(api)

    assert ws.executions() == 2
    assert result["terminal_reason"] == "hook_stopped", result
    assert len(result["permission_denials"]) == 1
    assert denials == [] or all("cancel" in d for d in denials), denials


def session_id(ws: Workspace) -> str:
    """The one session of this test's HOME (Claude Code writes its transcript there)."""
    transcripts = list((ws.home / ".claude" / "projects").glob("*/*.jsonl"))
    assert len(transcripts) == 1, transcripts
    return transcripts[0].stem


@pytest.mark.parametrize("on_error", ["deny", "allow"])
def test_guard_down(stack: Stack, ws: Workspace, on_error: str) -> None:
    with bare_nats() as url:
        settings = hook_settings(stack, url, "--on-error", on_error)
        script = [ws.bash("echo one"), ws.bash("echo two"), text("gave up")]
        with FakeAnthropic(script) as api:
            result = ws.claude(api, settings).result()
            results = api.tool_results()

    if on_error == "deny":
        assert ws.executions() == 0
        assert len(results) == 2
        assert all("the guard could not be asked" in r.content for r in results), results
        assert all("no fuseboxd is listening" in r.content for r in results), results
    else:
        assert ws.executions() == 2
        assert [r.content.split("\n")[0] for r in results] == ["one", "two"]
    # The prompt went on to the model either way: a guard that cannot be asked never
    # blocks a prompt.
    assert result["result"] == "gave up"


def test_a_session_resumed_after_its_end_goes_on_in_a_new_run(stack: Stack, ws: Workspace) -> None:
    settings = hook_settings(stack, stack.nats_url)
    with FakeAnthropic([ws.bash("echo first"), text("first part done")]) as api:
        first = ws.claude(api, settings).result()
    session = first["session_id"]
    with FakeAnthropic([ws.bash("echo second"), text("second part done")]) as api:
        second = ws.claude(api, settings, extra_args=["--resume", session]).result()

    assert second["session_id"] == session  # Claude Code keeps the id
    assert ws.executions() == 2
    assert second["permission_denials"] == []
    assert run_status(stack, session)["summary"]["steps"] == 1
    assert run_status(stack, f"{session}-2")["summary"]["steps"] == 1


def test_a_session_the_guard_stopped_stays_stopped_when_resumed(
    stack: Stack, ws: Workspace
) -> None:
    settings = hook_settings(stack, stack.nats_url)
    with FakeAnthropic(forever=ws.bash("echo same")) as api:
        first = ws.claude(api, settings).result()
    assert first["terminal_reason"] == "hook_stopped"
    executed = ws.executions()
    with FakeAnthropic([ws.bash("echo again"), text("gave up")]) as api:
        second = ws.claude(api, settings, extra_args=["--resume", first["session_id"]])
        served = api.turns_served()

    assert ws.executions() == executed
    # The prompt is blocked before the model is asked, and the user reads why.
    assert served == 0
    said = second.result()["result"]
    assert said.startswith("UserPromptSubmit operation blocked by hook:"), said
    assert "fusebox: run stopped (STOPPED_LOOP_GUARD)" in said, said
    assert "did not reach the model" in said, said
