"""The table every adapter is run through for issue 49 §1: a tool whose result is a
string, a dict, a list (of values, of content blocks) or nothing, through a warn, a
block and a stop. The runaway
scenario (the same search every turn) reaches all three decisions in one run, so each
adapter runs it once per shape and each (shape, decision) cell checks its own call."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from .guard import RUNAWAY_EXECUTIONS, run_status
from .stack import Stack

#: What the runaway `search` returns, by shape. Each is the same on every call, so the
#: guard sees the same result repeated and warns, blocks and stops as it does for a dict.
SHAPES: dict[str, Any] = {
    "string": "jma.go.jp: sunny in Tokyo",
    "dict": {"hits": ["jma.go.jp"], "query": "weather tokyo"},
    "list": ["jma.go.jp", "tenki.jp"],
    # A list of content blocks: what a multimodal tool returns, which some frameworks
    # (LangChain) hand the model as blocks rather than as text.
    "blocks": [{"type": "text", "text": "jma.go.jp: sunny in Tokyo"}],
    "none": None,
}

DECISIONS = ["warn", "block", "stop"]

#: Every cell of the table, as pytest parameters (`shape`, `decision`).
CELLS = [(shape, decision) for shape in SHAPES for decision in DECISIONS]


def shaped(shape: str) -> Any:
    """What the runaway `search` returns in `shape`: a fresh copy on each call, so no
    framework can change the value the next call returns."""
    return copy.deepcopy(SHAPES[shape])


@dataclass(frozen=True)
class Read:
    """What the model read for each call of the runaway, in call order, as text (an
    adapter whose framework hands the model a structured result renders it as JSON),
    how many times the tool really ran, and the state of the adapter's `RunStopped`."""

    texts: list[str]
    executions: int
    stopped_state: str | None
    #: The model reads the stop as the stopped call's result (False: the framework's
    #: run ends at the call, a tripwire, and no model is asked again to read anything).
    model_reads_stop: bool = True
    #: The tool's name as the framework calls it (an MCP tool's has its server's prefix).
    tool: str = "search"


def call_of(decision: str, read: Read) -> str:
    """What the model read for the call the guard answered with `decision`: the
    default policy warns the last execution, blocks the one after, and stops the run
    at the last call the model made."""
    index = {"warn": RUNAWAY_EXECUTIONS - 1, "block": RUNAWAY_EXECUTIONS}.get(decision, -1)
    return read.texts[index]


def assert_cell(stack: Stack, run_id: str, shape: str, decision: str, read: Read) -> None:
    """The checks every adapter shares for one cell; the adapter's own test checks the
    form its framework gives the result (a field, a wrapped value, appended text)."""
    # Whatever the shape, the loop is the same loop: three executions, then refusals.
    assert read.executions == RUNAWAY_EXECUTIONS, read
    text = call_of(decision, read)
    if decision == "warn":
        assert "one more identical call will be blocked" in text, text
    elif decision == "block":
        assert f"fusebox blocked {read.tool}" in text, text
    else:
        if read.model_reads_stop:
            assert "fusebox stopped this run" in text, text
        # The adapter raised its stop, and the daemon closed the run as the guard's
        # stop: not FAILED (an adapter that crashed on the warning closes it failed).
        assert read.stopped_state == "STOPPED_LOOP_GUARD", read
        summary = run_status(stack, run_id)["summary"]
        assert summary["terminal_state"] == "STOPPED_LOOP_GUARD", summary
