"""What the scripted model asks for, turn by turn, in each scenario; the same script
drives every framework's fake model, so the adapters are judged on the same runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .guard import PAGES

Call = tuple[str, dict[str, Any]]

SEARCH: Call = ("search", {"query": "weather tokyo"})
OPEN_PAGE: Call = ("open_page", {"url": "https://jma.go.jp"})
EMAIL: Call = ("send_email", {"to": "oncall@example.com", "incident": "INC-7"})


def next_calls(scenario: str, turn: int) -> list[Call] | None:
    """The tool calls of model turn `turn` (0-based); None = the final answer."""
    if scenario == "runaway":  # the same search forever
        return [SEARCH]
    if scenario == "ping_pong":  # A B A B … with the same results
        return [SEARCH if turn % 2 == 0 else OPEN_PAGE]
    if scenario == "pagination":  # 12 new pages, then done
        return [("list_issues", {"page": turn + 1})] if turn < PAGES else None
    if scenario == "retry_side_effect":  # the email, then the model "retries" it
        return [EMAIL] if turn < 2 else None
    if scenario == "parallel_runaway":  # three identical searches per turn
        return [SEARCH, SEARCH, SEARCH]
    if scenario == "one_search":
        return [SEARCH] if turn < 1 else None
    raise ValueError(scenario)


def op_key_for(run: str) -> Callable[[str, Any], str | None]:
    """The business identity of the side effect: one notification per incident. The
    ledger outlives a run, so each test's incident is its own."""

    def op_key(tool: str, args: Any) -> str | None:
        if tool == "send_email" and isinstance(args, dict):
            return f"{run}:{args.get('incident')}:email"
        return None

    return op_key
