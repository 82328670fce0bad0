"""Codex CLI's own OpenTelemetry telemetry as an event source (issue 46, docs/otel.md
"Codex CLI's telemetry"): the real Codex CLI (`@openai/codex` 0.171.0, pinned in
tests/npm) runs `codex exec` offline against the scripted Responses API, with no hook
and the `[otel]` block the docs tell a user to paste into ~/.codex/config.toml: its log
exporter (`otlp-http`, binary protobuf) pointed at fuseboxd's OTLP receiver, with the
receiver's bearer token in its headers (the token names the tenant). Passive watching:
every call runs; the guard's stop is on the kill switch and on the operator's page
(`fusebox run TENANT/RUN --json`).

Then the rollout that same run wrote is imported (`fusebox replay --from codex`, the
events and decisions `whatif --from codex` compares under two policies) and must decide
every call and result as the telemetry path did. Both name the run after the session id
and each call by the hook's ids (`cx-<call id>-call`), so the comparison is event by
event. What only one side carries — the telemetry a model turn per response and no
session end, the rollout a `run_finished` at its end — does not change a call's
decision; the docs' table says what differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.coding_agents import Workspace
from support.fake_model_api import FakeResponses, Turn, say
from support.guard import RUNAWAY_EXECUTIONS
from support.history import applied_by_id, by_id, replay_from
from support.otlp import (
    TENANT,
    TOKEN,
    Receiver,
    assert_stopped_where_seen,
    receiver_outcomes,
    receiving,
    status,
    stops_of,
    summary,
    wait_for,
)
from support.stack import Stack

#: Calls the scripted model makes before it gives up.
PATIENCE = 10
#: Distinct commands of the legitimate session.
PAGES = 12

#: event id → (action, reason)
Decisions = dict[str, tuple[str, str | None]]


@pytest.fixture(scope="module")
def receiver(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Receiver]:
    """A daemon with `[otlp]` on loopback and a bearer token for TENANT."""
    with receiving(stack, tmp_path_factory, 4 * 1024 * 1024) as running:
        yield running


def endpoint(receiver: Receiver) -> str:
    """The receiver's base URL (Codex posts to the endpoint exactly as given)."""
    return receiver.url.removesuffix("/v1/traces")


def otel_block(receiver: Receiver, protocol: str = "binary") -> str:
    """The `[otel]` block docs/otel.md tells a user to paste, and one line of the test's
    own: Codex's default metrics exporter (Statsig, off this machine) is switched off so
    nothing leaves loopback."""
    return f"""[otel]
metrics_exporter = "none"

[otel.exporter.otlp-http]
endpoint = "{endpoint(receiver)}/v1/logs"
protocol = "{protocol}"
headers = {{ "Authorization" = "Bearer {TOKEN}" }}
"""


def run_codex(
    ws: Workspace, receiver: Receiver, respond: Callable[[int], Turn], protocol: str = "binary"
) -> str:
    """`codex exec` on the scripted API with its telemetry sent to the receiver; the
    session's id (the run's). Codex exports what is left when it exits and waits for the
    answer: when it has exited, every record's events are in the daemon's stream."""
    with FakeResponses(respond=respond) as api:
        done = ws.codex(api, otel_block(receiver, protocol))
    assert done.returncode == 0, done.stderr[-3000:]
    return ws.codex_session()


def telemetry_decisions(receiver: Receiver, run: str) -> Decisions:
    """Each tool_call's and tool_result's decision as the daemon applied it, by event id."""
    return applied_by_id(receiver.stack, TENANT, run)


def test_a_runaway_loop_seen_through_telemetry_is_stopped_and_the_import_agrees(
    receiver: Receiver, tmp_path: Path
) -> None:
    ws = Workspace(tmp_path)
    # The same check, the same answer, again and again: a runaway.
    check = ws.command("cat status.txt || echo running")
    session = run_codex(ws, receiver, lambda n: check if n < PATIENCE else say("gave up"))
    # Passive: nothing stood between the agent and its tools; every call ran.
    assert ws.executions() == PATIENCE

    state = assert_stopped_where_seen(receiver, session)
    assert state["reason"] == "consecutive_blocks", state

    # Every call and result is applied, the ones after the stop too.
    live = wait_for(
        lambda: (d := telemetry_decisions(receiver, session)) and len(d) == 2 * PATIENCE and d,
        "all calls and results applied",
    )
    calls = [live[f"cx-call_{n}-call"] for n in call_numbers(live)]
    # Recognised as the hook recognises it (the same command, hashed as the hook hashes
    # it, the same output): run as often as the hook would let it, warned, refused
    # twice, and the refusals in a row end the run; the calls after it are the stop's.
    assert calls[:6] == [
        ("execute", None),
        ("execute", None),
        ("warn", "same_call_repeat"),
        ("block", "same_call_repeat"),
        ("block", "same_call_repeat"),
        ("stop", "consecutive_blocks"),
    ], live
    assert sum(a in ("execute", "warn") for a, _ in calls) == RUNAWAY_EXECUTIONS
    assert all(action == "stop" for action, _ in calls[6:]), calls
    # The session's own rollout, imported, is decided the same way, event by event.
    assert imported_decisions(receiver.stack, ws.home / ".codex" / "sessions") == {session: live}
    assert refused_records(receiver) == {}


@pytest.mark.parametrize("protocol", ["binary", "json"])
def test_a_legitimate_session_seen_through_telemetry_is_untouched(
    receiver: Receiver, tmp_path: Path, protocol: str
) -> None:
    ws = Workspace(tmp_path)
    session = run_codex(
        ws,
        receiver,
        lambda n: ws.command(f"echo page {n + 1}") if n < PAGES else say("done"),
        protocol,
    )
    assert ws.executions() == PAGES

    # The session's start, the prompt, 12 calls and their results, 13 model turns (one
    # per response, the closing one included).
    expected = 2 + 2 * PAGES + PAGES + 1
    state = wait_for(
        lambda: (s := summary(receiver, session))["events"] >= expected and s,
        "all events applied",
    )
    assert state["events"] == expected, state
    assert state.get("terminal_state") is None, state
    counters = status(receiver, session)["counters"]
    assert (counters["steps"], counters["calls_refused"]) == (PAGES, 0), counters
    live = telemetry_decisions(receiver, session)
    assert len(live) == 2 * PAGES, live
    assert set(live.values()) == {("execute", None), ("continue", None)}, live
    assert not asyncio.run(stops_of(receiver.stack.nats_url, session, timeout=1))
    assert imported_decisions(receiver.stack, ws.home / ".codex" / "sessions") == {session: live}
    assert refused_records(receiver) == {}


def call_numbers(decisions: Decisions) -> list[int]:
    """The calls' numbers (`cx-call_<n>-call`), in the order the model made them."""
    return sorted(
        int(event_id.removeprefix("cx-call_").removesuffix("-call"))
        for event_id in decisions
        if event_id.endswith("-call")
    )


def imported_decisions(stack: Stack, sessions: Path) -> dict[str, Decisions]:
    """`fusebox replay --from codex SESSIONS`: each call's and result's decision, by run
    and event id."""
    return by_id(replay_from(stack, "codex", TENANT, sessions))


def refused_records(receiver: Receiver) -> dict[str, float]:
    """The log records the receiver refused, by reason: every record Codex sends is
    mapped or skipped, none dead-lettered."""
    counts = receiver_outcomes(receiver)["fusebox_otlp_log_records_total"]
    assert counts.get("mapped", 0) > 0, counts
    return {k: v for k, v in counts.items() if k not in ("mapped", "skipped") and v}
