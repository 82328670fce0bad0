"""The scripted Gemini API of :mod:`fake_model_api` for Gemini CLI runs with sub-agents:
each turn is chosen from the request (the main agent's or a sub-agent's, and what it
was told so far), and a turn may call any tool by name — `invoke_agent`, a sub-agent's
`complete_task` — besides the shell command and the closing words.

Gemini CLI 0.61 runs a sub-agent (`invoke_agent {"agent_name", "prompt"}`) as a loop of
its own: the sub-agent's requests begin with the prompt it was given, which is how a
test tells them apart (`marker`)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from support.fake_model_api import FakeGemini, Turn

__all__ = ["FakeGeminiAgents", "GeminiCall", "GeminiRequest", "complete_task", "invoke_agent"]


@dataclass(frozen=True)
class GeminiCall(Turn):
    """A turn that calls tool `name` with `arguments`."""

    name: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)


def invoke_agent(prompt: str, agent: str = "generalist") -> GeminiCall:
    return GeminiCall(name="invoke_agent", arguments={"agent_name": agent, "prompt": prompt})


def complete_task(response: str) -> GeminiCall:
    return GeminiCall(name="complete_task", arguments={"result": {"response": response}})


@dataclass(frozen=True)
class GeminiRequest:
    """One model request of the main agent's loop or a sub-agent's."""

    body: dict[str, Any]
    marker: str

    @property
    def sub_agent(self) -> bool:
        return self.marker in json.dumps(self.body.get("contents", [])[:1])

    def calls(self) -> list[dict[str, Any]]:
        return [
            part["functionCall"]
            for message in self.body.get("contents", [])
            for part in message.get("parts", [])
            if isinstance(part, dict) and "functionCall" in part
        ]

    def outputs(self) -> list[str]:
        return [
            json.dumps(part["functionResponse"].get("response"))
            for message in self.body.get("contents", [])
            for part in message.get("parts", [])
            if isinstance(part, dict) and "functionResponse" in part
        ]


class FakeGeminiAgents(FakeGemini):
    """Answers each request with `respond(request)`; `marker` tells a sub-agent's."""

    def __init__(self, marker: str, respond: Callable[[GeminiRequest], Turn]) -> None:
        super().__init__()
        self._marker = marker
        self._answer = respond
        self._asking = threading.local()

    def requests(self) -> list[GeminiRequest]:
        with self._lock:
            return [GeminiRequest(body, self._marker) for body in self.bodies]

    def _record(self, body: Any) -> None:
        # The handler records a request, then asks for its turn, on one thread.
        super()._record(body)
        self._asking.body = body

    def _next_turn(self) -> Turn:
        with self._lock:
            self._turns += 1
        return self._answer(GeminiRequest(self._asking.body, self._marker))

    def _stream(self, turn: Turn) -> list[bytes]:
        if not isinstance(turn, GeminiCall):
            return super()._stream(turn)
        part = {"functionCall": {"name": turn.name, "args": dict(turn.arguments)}}
        chunk = {
            "candidates": [
                {"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}
            ],
            "usageMetadata": {
                "promptTokenCount": 100,
                "candidatesTokenCount": 10,
                "totalTokenCount": 110,
            },
            "modelVersion": "gemini-2.5-flash",
        }
        return [f"data: {json.dumps(chunk)}\n\n".encode()]
