"""The harness itself, seen from Python: the stack's daemon answers the gate subject of
the wire contract with a decision, and refuses what is not an event."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping

import nats
from support.stack import Stack


def envelope(run: str, seq: int, body: Mapping[str, object]) -> bytes:
    event = {
        "v": 1,
        "id": f"{run}-{seq}",
        "tenant": "pytest",
        "run": run,
        "seq": seq,
        "ts_ms": int(time.time() * 1000),
        **body,
    }
    return json.dumps(event).encode()


async def test_the_daemon_decides_a_tool_call_on_the_gate_subject(
    stack: Stack, run_id: str
) -> None:
    nc = await nats.connect(stack.nats_url, max_reconnect_attempts=0)
    try:
        call = {"type": "tool_call", "call_id": "c1", "tool": "search", "args": {"q": "x"}}
        reply = await nc.request(
            f"fusebox.gate.pytest.{run_id}", envelope(run_id, 1, call), timeout=5
        )
        decision = json.loads(reply.data)
        assert decision["action"] == "execute"
        assert decision["call_id"] == "c1"
        # The same event again is answered from the daemon's dedup, identically.
        again = await nc.request(
            f"fusebox.gate.pytest.{run_id}", envelope(run_id, 1, call), timeout=5
        )
        assert json.loads(again.data) == decision
    finally:
        await nc.close()


async def test_bad_input_gets_an_error_reply(stack: Stack, run_id: str) -> None:
    nc = await nats.connect(stack.nats_url, max_reconnect_attempts=0)
    try:
        reply = await nc.request(f"fusebox.gate.pytest.{run_id}", b'{"v":1,', timeout=5)
        answer = json.loads(reply.data)
        assert answer["error"]["reason"] == "malformed_json", answer
    finally:
        await nc.close()
