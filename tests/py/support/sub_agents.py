"""The sub-agent scenario every framework is run through: a lead agent delegates research
to a sub-agent twice. The first sub-agent searches once and answers; the second runs the
same search forever, so the guard stops it, and the lead must read that stop as the
sub-agent's result and finish its own task."""

from __future__ import annotations

from typing import Any

from .guard import RUNAWAY_EXECUTIONS
from .scenarios import Call, next_calls

#: The tool through which the lead calls its sub-agent, and the topics it delegates.
DELEGATE = "research"
TOPICS = ("tokyo", "osaka")
#: What the sub-agent that finishes answers.
FOUND = "tokyo: sunny"


def lead_calls(turn: int) -> list[Call] | None:
    """The lead's tool calls at its turn `turn`: one delegation per turn, then done."""
    if turn < len(TOPICS):
        return [(DELEGATE, {"topic": TOPICS[turn]})]
    return None


def researcher_calls(topic: str, turn: int) -> list[Call] | None:
    """The sub-agent's calls for `topic`: one search then an answer, or a runaway."""
    return next_calls("one_search" if topic == TOPICS[0] else "runaway", turn)


def researcher_answer(topic: str) -> str:
    return FOUND if topic == TOPICS[0] else f"{topic}: unknown"


def topic_of(text: Any) -> str:
    """The topic a sub-agent was given, from its first user message."""
    for topic in TOPICS:
        if topic in str(text):
            return topic
    raise AssertionError(f"no topic in {text!r}")


#: Executions of the runaway sub-agent's search before its stop (the default policy's).
RUNAWAY_SEARCHES = RUNAWAY_EXECUTIONS
