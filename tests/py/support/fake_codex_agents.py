"""The scripted Responses API of :mod:`fake_model_api` for Codex runs with sub-agents:
each turn is chosen from the request (whose thread asks: the main agent's or a
sub-agent's, and what it was told so far), and a turn may call any tool by name — with
its namespace, as Codex 0.171 names its collaboration tools (`spawn_agent`,
`wait_agent` in `multi_agent_v1`) — besides the shell command and the closing words.

Codex sends each request's thread in `client_metadata["x-codex-turn-metadata"]`: a
sub-agent's requests carry the session's `session_id` and the sub-agent's own
`thread_id` (its agent id)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from support.fake_model_api import FakeResponses, Turn

__all__ = ["Call", "FakeCodexAgents", "Request", "spawn_agent", "wait_agent"]

#: The namespace of Codex 0.171's collaboration tools (with `gpt-5-codex`).
AGENTS_NAMESPACE = "multi_agent_v1"


@dataclass(frozen=True)
class Call(Turn):
    """A turn that calls tool `name` with `arguments`."""

    name: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)
    namespace: str | None = None


def spawn_agent(message: str) -> Call:
    return Call(name="spawn_agent", arguments={"message": message}, namespace=AGENTS_NAMESPACE)


def wait_agent(agent_id: str, timeout_ms: int = 30000) -> Call:
    return Call(
        name="wait_agent",
        arguments={"targets": [agent_id], "timeout_ms": timeout_ms},
        namespace=AGENTS_NAMESPACE,
    )


@dataclass(frozen=True)
class Request:
    """One model request of a Codex thread."""

    body: dict[str, Any]

    @property
    def _metadata(self) -> dict[str, Any]:
        raw = self.body.get("client_metadata", {}).get("x-codex-turn-metadata", "{}")
        metadata: dict[str, Any] = json.loads(raw)
        return metadata

    @property
    def session_id(self) -> str:
        return str(self._metadata.get("session_id", ""))

    @property
    def thread_id(self) -> str:
        return str(self._metadata.get("thread_id", ""))

    @property
    def sub_agent(self) -> bool:
        """A sub-agent's request: its thread is not the session's."""
        return self.thread_id != self.session_id

    def calls(self) -> list[dict[str, Any]]:
        """The thread's tool calls so far."""
        return [
            item
            for item in self.body.get("input", [])
            if isinstance(item, dict) and item.get("type") == "function_call"
        ]

    def outputs(self) -> list[str]:
        """What each of the thread's calls answered, in order."""
        found: list[str] = []
        for item in self.body.get("input", []):
            if isinstance(item, dict) and item.get("type") == "function_call_output":
                output = item.get("output")
                found.append(output if isinstance(output, str) else json.dumps(output))
        return found

    def spawned(self) -> str:
        """The agent id the thread's `spawn_agent` answered."""
        for output in self.outputs():
            if '"agent_id"' in output:
                return str(json.loads(output)["agent_id"])
        raise AssertionError(f"no spawn_agent answer in {self.outputs()}")

    def developer_words(self) -> list[str]:
        """Developer messages of the thread (hook context among them)."""
        words: list[str] = []
        for item in self.body.get("input", []):
            if isinstance(item, dict) and item.get("role") == "developer":
                content = item.get("content")
                if isinstance(content, list):
                    words.extend(str(part.get("text", "")) for part in content)
                else:
                    words.append(str(content))
        return words


class FakeCodexAgents(FakeResponses):
    """Answers each request with `respond(request)`."""

    def __init__(self, respond: Callable[[Request], Turn]) -> None:
        super().__init__()
        self._answer = respond
        self._asking = threading.local()

    def requests(self) -> list[Request]:
        with self._lock:
            return [Request(body) for body in self.bodies]

    def _record(self, body: Any) -> None:
        # The handler records a request, then asks for its turn, on one thread.
        super()._record(body)
        self._asking.body = body

    def _next_turn(self) -> Turn:
        with self._lock:
            self._turns += 1
        return self._answer(Request(self._asking.body))

    def _stream(self, turn: Turn) -> list[bytes]:
        if not isinstance(turn, Call):
            return super()._stream(turn)
        n = next(self._ids)
        item: dict[str, Any] = {
            "type": "function_call",
            "id": f"fc_{n}",
            "call_id": f"call_{n}",
            "name": turn.name,
            "arguments": json.dumps(dict(turn.arguments)),
            "status": "completed",
        }
        if turn.namespace:
            item["namespace"] = turn.namespace
        usage = {
            "input_tokens": 100,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 10,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 110,
        }
        response: dict[str, Any] = {
            "id": f"resp_{n}",
            "object": "response",
            "status": "in_progress",
            "output": [],
        }
        done = {**response, "status": "completed", "output": [item], "usage": usage}
        events: list[tuple[str, dict[str, Any]]] = [
            ("response.created", {"response": response}),
            ("response.output_item.done", {"output_index": 0, "item": item}),
            ("response.completed", {"response": done}),
        ]
        return [
            f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
            for kind, data in events
        ]
