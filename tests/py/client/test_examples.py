"""The examples of clients/python/examples run as a user runs them, against the stack."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.stack import Stack

EXAMPLES = Path(__file__).resolve().parents[3] / "clients/python/examples"


@pytest.mark.parametrize(
    ("script", "flags", "expected"),
    [
        ("openai_agents_runaway.py", [], "STOPPED by fusebox after 3 executions"),
        ("langgraph_agent.py", ["--mode", "loop"], "STOPPED by fusebox: STOPPED_LOOP_GUARD"),
        ("langgraph_agent.py", ["--mode", "paginate"], "all pages read (12 tool answers)"),
        ("gate_by_hand.py", [], "stopped: STOPPED_LOOP_GUARD"),
    ],
)
def test_example(stack: Stack, script: str, flags: list[str], expected: str) -> None:
    out = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--nats", stack.nats_url, *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert expected in out.stdout, out.stdout
