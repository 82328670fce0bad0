"""Gemini CLI's own OpenTelemetry telemetry as an event source (issue 46, docs/otel.md
"Gemini CLI's telemetry"): the real Gemini CLI (`@google/gemini-cli` 0.61.0, pinned in
tests/npm) runs headless offline against the scripted Gemini API, with no hook, its
telemetry switched on the way the docs tell a user (`telemetry.enabled`, `otlpProtocol:
"http"`, `otlpEndpoint` = fuseboxd's OTLP receiver) and the receiver's bearer token in
`OTEL_EXPORTER_OTLP_HEADERS` (the token names the tenant). Passive watching: every call
runs; the guard's stop is on the kill switch and on the operator's page.

Then the chat that same run wrote is imported (`fusebox replay --from gemini-cli`, the
decisions `whatif --from gemini-cli` compares) and must decide every call and result as
the telemetry path did. The two sources differ in what they carry — the chat has each
result's output, the telemetry a model turn per API response and no output — and the
decisions on the calls are still the same (docs/otel.md says why).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.coding_agents import Workspace
from support.fake_model_api import FakeGemini, Turn, say
from support.history import applied, replay_from
from support.otlp import (
    TENANT,
    TOKEN,
    Receiver,
    assert_stopped_where_seen,
    receiver_outcomes,
    receiving,
    stops_of,
    summary,
    wait_for,
)
from support.stack import Stack

#: Calls the scripted model makes before it gives up.
PATIENCE = 10

Decisions = list[tuple[str, str, str | None]]


@pytest.fixture(scope="module")
def receiver(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    """A daemon with `[otlp]` on loopback and a bearer token for TENANT."""
    with receiving(stack, tmp_path_factory, 4 * 1024 * 1024) as running:
        yield running


def endpoint(receiver: Receiver) -> str:
    """The receiver's base URL: Gemini CLI appends /v1/logs, /v1/traces …"""
    return receiver.url.removesuffix("/v1/traces")


def telemetry_settings(receiver: Receiver) -> str:
    """The settings.json block docs/otel.md tells a user to paste."""
    telemetry = {
        "enabled": True,
        "target": "local",
        "otlpEndpoint": endpoint(receiver),
        "otlpProtocol": "http",
        "logPrompts": True,
    }
    return json.dumps({"telemetry": telemetry})


def run_gemini(ws: Workspace, receiver: Receiver, respond: Callable[[int], Turn]) -> str:
    """Gemini CLI on the scripted API with its telemetry sent to the receiver; the
    session's id (the run's), from the chat it wrote."""
    headers = {"OTEL_EXPORTER_OTLP_HEADERS": f"Authorization=Bearer%20{TOKEN}"}
    with FakeGemini(respond=respond) as api:
        done = ws.gemini(api, telemetry_settings(receiver), env=headers)
    assert done.returncode == 0, done.stderr[-3000:]
    first = json.loads(chat_file(ws).read_text().splitlines()[0])
    session: str = first["sessionId"]
    return session


def chat_file(ws: Workspace) -> Path:
    chats = list((ws.home / ".gemini" / "tmp").glob("*/chats/session-*.jsonl"))
    assert len(chats) == 1, chats
    return chats[0]


def telemetry_decisions(receiver: Receiver, run: str) -> Decisions:
    """Each tool_call's and tool_result's decision as the daemon applied it, in order."""
    return [
        (kind, action, reason) for _, kind, action, reason in applied(receiver.stack, TENANT, run)
    ]


def test_a_runaway_loop_seen_through_telemetry_is_stopped_and_the_import_agrees(
    receiver: Receiver, tmp_path: Path
) -> None:
    ws = Workspace(tmp_path)
    # The same check, the same answer, again and again: a runaway.
    check = ws.command("cat status.txt || echo running")
    session = run_gemini(ws, receiver, lambda n: check if n < PATIENCE else say("gave up"))
    # Passive: nothing stood between the agent and its tools; every call ran.
    assert ws.executions() == PATIENCE

    state = assert_stopped_where_seen(receiver, session)

    # Gemini CLI flushes its telemetry before it exits: every call is there.
    live = wait_for(
        lambda: (d := telemetry_decisions(receiver, session)) and len(d) == 2 * PATIENCE and d,
        "all calls and results applied",
    )
    # Recognised by its arguments alone (the records carry no output): twice run,
    # warned, refused twice, and the refusals in a row end the run.
    calls = [(action, reason) for kind, action, reason in live if kind == "tool_call"]
    assert calls[:6] == [
        ("execute", None),
        ("execute", None),
        ("warn", "same_call_repeat"),
        ("block", "same_call_repeat"),
        ("block", "same_call_repeat"),
        ("stop", "consecutive_blocks"),
    ], live
    assert state["reason"] == "consecutive_blocks", state
    # The session's own chat, imported, is decided the same way, call by call.
    assert imported_decisions(receiver.stack, chat_file(ws)) == {session: live}


def test_a_legitimate_session_seen_through_telemetry_is_untouched(
    receiver: Receiver, tmp_path: Path
) -> None:
    ws = Workspace(tmp_path)
    session = run_gemini(
        ws, receiver, lambda n: ws.command(f"echo page {n + 1}") if n < 12 else say("done")
    )
    assert ws.executions() == 12

    # 12 calls, 12 results, 13 model turns, the start and the prompt.
    state = wait_for(
        lambda: (s := summary(receiver, session))["events"] >= 39 and s, "all events applied"
    )
    assert state["events"] == 39, state
    assert state.get("terminal_state") is None, state
    live = telemetry_decisions(receiver, session)
    assert {(kind, action) for kind, action, _ in live} == {
        ("tool_call", "execute"),
        ("tool_result", "continue"),
    }, live
    assert not asyncio.run(stops_of(receiver.stack.nats_url, session, timeout=1))
    # Nothing Gemini CLI sent was refused: its spans (the same calls) and the records
    # with nothing to map are skipped, not dead-lettered.
    assert otlp_outcomes(receiver) == {
        "fusebox_otlp_log_records_total": {"mapped", "skipped"},
        "fusebox_otlp_spans_total": {"skipped"},
    }
    assert imported_decisions(receiver.stack, chat_file(ws)) == {session: live}


def imported_decisions(stack: Stack, chat: Path) -> dict[str, Decisions]:
    """`fusebox replay --from gemini-cli CHAT`: each call's and result's decision, by run,
    in order (the telemetry's event ids are not the chat's)."""
    kind = {"call": "tool_call", "result": "tool_result"}
    return {
        run: [
            (kind[event_id.rsplit("-", 1)[1]], action, reason) for event_id, action, reason in rows
        ]
        for run, rows in replay_from(stack, "gemini-cli", TENANT, chat).items()
    }


def otlp_outcomes(receiver: Receiver) -> dict[str, set[str]]:
    """The outcomes the receiver counted at least once, by metric."""
    return {
        metric: {outcome for outcome, n in counts.items() if n > 0}
        for metric, counts in receiver_outcomes(receiver).items()
        if any(n > 0 for n in counts.values())
    }
