"""A scripted OpenAI chat-completions API on loopback (``POST /v1/chat/completions``,
streamed), for agents that take an OpenAI-compatible provider by base URL: OpenCode
(`opencode-ai`, through its bundled ``@ai-sdk/openai-compatible``).

A turn with a command calls the agent's shell tool, ``bash`` in both OpenCode 1.18.33
(``command``, optional ``timeout``, ``workdir``) and Copilot CLI 1.0.102 (which also
requires ``description``: ``describe=True``); a turn may instead call any tool by name
(:class:`ChatCall`). ``respond_to`` answers each request by what it holds (the agent's
and its sub-agents' requests interleave), instead of by the turn's number. Requests
without tools (OpenCode's session title) are answered with a fixed title and are not
turns, so the script counts the agent loop's requests only.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from support.fake_model_api import Turn, _FakeModel

__all__ = ["ChatCall", "FakeChatCompletions"]


@dataclass(frozen=True)
class ChatCall(Turn):
    """A turn that calls tool `name` with `arguments`."""

    name: str = ""
    arguments: Mapping[str, Any] = field(default_factory=dict)


class FakeChatCompletions(_FakeModel):
    _ids = itertools.count(1)

    def __init__(
        self,
        script: Sequence[Turn] = (),
        *,
        respond: Callable[[int], Turn] | None = None,
        respond_to: Callable[[dict[str, Any]], Turn] | None = None,
        describe: bool = False,
    ) -> None:
        super().__init__(script, respond=respond)
        self._respond_to = respond_to
        self._describe = describe

    def _turn_for(self, body: Any) -> Turn:
        if self._respond_to is None:
            return super()._turn_for(body)
        with self._lock:
            self._turns += 1
        return self._respond_to(body)

    def _is_turn(self, path: str, body: Any) -> bool:
        return (
            path.split("?")[0].endswith("/chat/completions")
            and isinstance(body, dict)
            and bool(body.get("tools"))
        )

    def _other(self, path: str) -> Any:
        if path.split("?")[0].endswith("/models"):
            return {"object": "list", "data": [{"id": "fake-model", "object": "model"}]}
        return {
            "id": "chatcmpl-title",
            "object": "chat.completion",
            "created": 0,
            "model": "fake-model",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "fusebox test"},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
        }

    def _stream(self, turn: Turn) -> list[bytes]:
        n = next(self._ids)
        call: tuple[str, Mapping[str, Any]] | None = None
        if isinstance(turn, ChatCall) and turn.name:
            call = (turn.name, turn.arguments)
        elif turn.command is not None:
            shell_args: dict[str, Any] = {"command": turn.command}
            if self._describe:
                shell_args["description"] = "Run the command"
            call = ("bash", shell_args)
        base = {"id": f"chatcmpl-{n}", "object": "chat.completion.chunk", "created": 0}
        base["model"] = "fake-model"
        if call is not None:
            name, arguments = call
            delta: dict[str, Any] = {
                "role": "assistant",
                "tool_calls": [
                    {
                        "index": 0,
                        "id": f"call_{n}",
                        "type": "function",
                        "function": {"name": name, "arguments": json.dumps(arguments)},
                    }
                ],
            }
            finish = "tool_calls"
        else:
            delta = {"role": "assistant", "content": turn.text}
            finish = "stop"
        usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
        chunks = [
            {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
            {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
            {**base, "choices": [], "usage": usage},
        ]
        return [f"data: {json.dumps(chunk)}\n\n".encode() for chunk in chunks] + [
            b"data: [DONE]\n\n"
        ]

    def tool_outputs(self) -> list[str]:
        """Each call's result as the model read it, in order (the last request holds the
        whole history)."""
        return [
            _content(message.get("content"))
            for message in (self.bodies[-1].get("messages", []) if self.bodies else [])
            if isinstance(message, dict) and message.get("role") == "tool"
        ]


def _content(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return json.dumps(content)
