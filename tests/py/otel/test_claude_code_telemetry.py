"""Claude Code's own OpenTelemetry telemetry into fuseboxd's OTLP receiver (issue 46,
docs/otel.md "Claude Code's telemetry"): the real Claude Code (the CLI bundled in
claude-agent-sdk, 2.1.327) runs offline against the scripted model API with
`CLAUDE_CODE_ENABLE_TELEMETRY=1` and its log exporter pointed at a real fuseboxd's
`[otlp]` receiver (a bearer token naming the tenant). No hook: passive watching, so
nothing is refused before it runs; the guard's stop reaches the kill switch and the
operator's page.

The transcript the same run wrote is then imported with `fusebox replay --from
claude-code` (no daemon): the telemetry names the hook's runs and calls, so its decisions
are compared with the import's call by call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.agent_runs import run_status
from support.claude_code import fusebox, run_claude
from support.fake_anthropic import FakeAnthropic, Turn, text, tool_use
from support.guard import run_history
from support.history import Decision, applied_by_id, by_id, replay_from
from support.otlp import (
    TENANT,
    TOKEN,
    Receiver,
    assert_stopped_where_seen,
    receiving,
    stops_of,
    wait_for,
)
from support.stack import Stack

#: The same status check, answered the same every time: the runaway loop.
LOOP_COMMAND = "cat status.txt || echo running"
LOOP_CALLS = 12


@pytest.fixture(scope="module")
def receiver(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    """A daemon with `[otlp]` on and a bearer token for the tenant (the credential path
    an off-host exporter takes)."""
    with receiving(stack, tmp_path_factory, 4 * 1024 * 1024) as running:
        yield running


def telemetry_env(receiver: Receiver) -> dict[str, str]:
    """What a user sets to send Claude Code's telemetry to fuseboxd."""
    return {
        "CLAUDE_CODE_ENABLE_TELEMETRY": "1",
        "OTEL_LOGS_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_EXPORTER_OTLP_LOGS_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT": receiver.url.removesuffix("/v1/traces") + "/v1/logs",
        # As docs/otel.md says for every exporter: percent-encoded. 2.1.327's exporter
        # (OpenTelemetry JS 0.208) sends it undecoded, `Bearer%20<token>`, which the
        # receiver takes as the same credential.
        "OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{TOKEN}",
        # The tool's input with each tool_result: repeats are recognised.
        "OTEL_LOG_TOOL_DETAILS": "1",
        "OTEL_LOGS_EXPORT_INTERVAL": "1000",
    }


class Home:
    """A HOME (its transcripts under .claude/projects) and a working directory."""

    def __init__(self, root: Path) -> None:
        self.home = root / "home"
        self.cwd = root / "work"
        self.home.mkdir()
        self.cwd.mkdir()

    @property
    def projects(self) -> Path:
        return self.home / ".claude" / "projects"


@pytest.fixture
def home(tmp_path: Path) -> Home:
    return Home(tmp_path)


def bash(command: str) -> Turn:
    return tool_use("Bash", {"command": command})


def run_session(
    receiver: Receiver,
    home: Home,
    api: FakeAnthropic,
    settings: dict[str, Any] | None = None,
) -> tuple[str, list[str]]:
    """One `claude -p` session with telemetry on: its session id and the tool use ids
    of the calls that ran."""
    with api:
        result = run_claude(
            api,
            "do the task",
            home=home.home,
            cwd=home.cwd,
            settings=settings,
            env=telemetry_env(receiver),
        ).result()
        ran = [r.tool_use_id for r in api.tool_results()]
    return str(result["session_id"]), ran


def decisions(stack: Stack, run: str) -> dict[str, Decision]:
    """Each tool_call's and tool_result's decision as the daemon applied it, by event
    id; empty for a run the daemon has not seen yet."""
    try:
        return applied_by_id(stack, TENANT, run)
    except AssertionError:
        return {}


def all_applied(stack: Stack, run: str, ran: list[str]) -> dict[str, tuple[str, str | None]]:
    """The run's decisions once a call and a result of every call that ran are applied."""
    wanted = {f"cc-{id}-{end}" for id in ran for end in ("call", "result")}

    def check() -> dict[str, tuple[str, str | None]]:
        got = decisions(stack, run)
        return got if wanted <= set(got) else {}

    found: dict[str, tuple[str, str | None]] = wait_for(check, f"{run}'s calls and results")
    return found


def test_a_runaway_session_is_stopped_and_its_transcript_agrees(
    receiver: Receiver, home: Home
) -> None:
    api = FakeAnthropic([bash(LOOP_COMMAND)] * LOOP_CALLS + [text("done")])
    session, ran = run_session(receiver, home, api)
    # Passive: nothing stood between Claude Code and its tools; every call ran.
    assert len(ran) == LOOP_CALLS

    # The telemetry names the hook's run: the session id.
    live = all_applied(receiver.stack, session, ran)
    status = run_status(receiver.stack, TENANT, session)
    summary = status["summary"]
    assert summary["terminal_state"] == "STOPPED_LOOP_GUARD", summary
    # The repeat is warned about, then refused; the agent runs it anyway (it was not
    # asked), and refusals in a row end the run.
    actions = [live[f"cc-{id}-call"][0] for id in ran]
    assert actions[:3] == ["execute", "execute", "warn"], actions
    assert "stop" in actions, actions
    assert status["report"]["terminal_state"] == "STOPPED_LOOP_GUARD", status["report"]
    assert_stopped_where_seen(receiver, session)

    # The transcript of the same session, imported: the same runs, the same ids, and
    # the same decision for every call and result.
    assert imported(receiver.stack, home.projects) == {session: live}


def legitimate() -> FakeAnthropic:
    """Distinct commands, one failing, then an answer."""
    return FakeAnthropic(
        [
            bash("echo one"),
            bash("ls"),
            bash("false"),
            bash("echo two > out.txt"),
            bash("cat out.txt"),
            text("done"),
        ]
    )


def test_a_legitimate_session_is_untouched_and_its_transcript_agrees(
    receiver: Receiver, home: Home
) -> None:
    session, ran = run_session(receiver, home, legitimate())
    assert len(ran) == 5
    live = all_applied(receiver.stack, session, ran)
    status = run_status(receiver.stack, TENANT, session)
    summary = status["summary"]
    assert summary.get("terminal_state") is None, summary
    assert summary["agent"] == "claude-code", summary
    # Each API request is a model turn with its usage and cost (the scripted API
    # answers 120 tokens in, 30 out): the turn and cost budgets see the session.
    counters = status["counters"]
    assert (counters["model_turns"], counters["tokens"]) == (6, 6 * 150), counters
    assert counters["cost_usd"] > 0, counters
    assert counters["calls_refused"] == 0, counters
    assert all(action not in ("block", "stop") for action, _ in live.values()), live
    # `false` failed: a retryable tool error, as the hook reports it.
    assert any(action == "retry_after" for action, _ in live.values()), live
    assert not asyncio.run(stops_of(receiver.stack.nats_url, session, timeout=1))
    assert imported(receiver.stack, home.projects) == {session: live}


def test_a_session_with_its_hook_and_its_telemetry_counts_each_call_once(
    receiver: Receiver, home: Home
) -> None:
    # The hook (gating every call) and the telemetry (after it) report the same calls
    # under the same ids: the daemon applies the hook's, which comes first and carries
    # the output, and drops the telemetry's copy; the model turns are the telemetry's.
    printed = fusebox(receiver.stack, "hook", "claude-code", "--print-settings", "--tenant", TENANT)
    session, ran = run_session(receiver, home, legitimate(), settings=json.loads(printed))
    assert len(ran) == 5

    def applied() -> list[dict[str, Any]]:
        entries = run_history(receiver.stack, TENANT, session)
        turns = [e for e in entries if e["event"]["type"] == "model_turn"]
        # The last API request is exported after the last tool result.
        return entries if len(turns) == 6 else []

    entries = wait_for(applied, "the telemetry's model turns")
    kinds = [entry["event"]["type"] for entry in entries]
    assert (kinds.count("run_started"), kinds.count("prompt")) == (1, 1), kinds
    assert (kinds.count("tool_call"), kinds.count("tool_result")) == (5, 5), kinds
    results = [e["event"] for e in entries if e["event"]["type"] == "tool_result"]
    assert all("output" in r or "output_hash" in r for r in results), results
    assert all(e["decision"]["action"] not in ("block", "stop") for e in entries), entries


SUB_PROMPT = "SUB-AGENT: look around the repository"
WARNED = ("warn", "child_stopped")


def test_a_sub_agents_loop_stops_its_own_run_named_as_the_hook_names_it(
    receiver: Receiver, home: Home
) -> None:
    # The main agent delegates to a sub-agent that runs one check 12 times: its records
    # carry its agent_id, so they go to the child run the hook and the import name
    # (`<session>-<agent id>`, a child of the session's run), which is stopped alone.
    def respond(body: dict[str, Any]) -> Turn:
        turn = sum(1 for m in body["messages"] if m["role"] == "assistant")
        if SUB_PROMPT in json.dumps(body["messages"][:1]):
            return bash(LOOP_COMMAND) if turn < LOOP_CALLS else text("sub done")
        delegate = tool_use(
            "Agent",
            {
                "description": "Look around",
                "prompt": SUB_PROMPT,
                "subagent_type": "general-purpose",
                "run_in_background": False,
            },
        )
        return [delegate, bash("echo main"), text("done")][min(turn, 2)]

    api = FakeAnthropic(respond=respond)
    with api:
        result = run_claude(
            api,
            "do the task",
            home=home.home,
            cwd=home.cwd,
            allowed_tools=("Bash", "Agent"),
            env=telemetry_env(receiver),
        ).result()
        ran = [r.tool_use_id for r in api.tool_results()]
    session = str(result["session_id"])
    assert len(ran) == LOOP_CALLS + 2
    from_import = imported(receiver.stack, home.projects)
    [child] = [run for run in from_import if run != session]
    assert child.startswith(f"{session}-"), from_import
    of_child = [id.removeprefix("cc-").removesuffix("-call") for id in from_import[child]]
    live = all_applied(receiver.stack, child, [id for id in ran if id in of_child])
    status = run_status(receiver.stack, TENANT, child)
    assert status["summary"]["terminal_state"] == "STOPPED_LOOP_GUARD", status["summary"]
    assert status["tree"]["parent"] == session, status["tree"]
    assert live == from_import[child]
    main = run_status(receiver.stack, TENANT, session)["summary"]
    assert main.get("terminal_state") is None, main
    # The main agent is told of its sub-agent's stop once, at its first call the daemon
    # applies after that stop. With the hook (and in the import) that is the call after
    # the Agent call; with the telemetry it depends on the export batches: a call is
    # reported with its result, the Agent call's after the sub-agent's records, and
    # within one request a run's events go together. Everything else is the same.
    main_calls = [id for id in ran if id not in of_child]
    telemetry = all_applied(receiver.stack, session, main_calls)
    hooked = from_import[session]
    assert list(hooked.values()).count(WARNED) == 1, hooked
    assert list(telemetry.values()).count(WARNED) <= 1, telemetry

    def unwarned(decided: dict[str, tuple[str, str | None]]) -> dict[str, tuple[str, str | None]]:
        return {id: ("execute", None) if d == WARNED else d for id, d in decided.items()}

    assert unwarned(telemetry) == unwarned(hooked)


def imported(stack: Stack, projects: Path) -> dict[str, dict[str, Decision]]:
    """`fusebox replay --from claude-code PROJECTS`: each call's and result's decision,
    by run and event id."""
    return by_id(replay_from(stack, "claude-code", TENANT, projects))
